# Copyright © 2026 Apple Inc.
"""DeepSeek-V4's deeper checks' helpers: tests/test_deepseek_v4.py's tiny
models and checkpoint writers, the recorded transformers logits and the
transformers model on the same weights."""

import importlib.util
import io
import sys
import tempfile
import zlib
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from mlx_lm.models import deepseek_v4

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_deepseek_v4 import (  # noqa: E402, F401
    _RELEASE_NAMES,
    COMMUNITY_RULES,
    CONFIG,
    FP8_CONFIG,
    TINY_CONFIG,
    TOKENS,
    VERIFY_CONFIG,
    _community_predicate,
    _dequantized,
    _float32,
    _fp4_rows,
    _fp8_blocks,
    _quantized_layers,
    _random_weights,
    _release_name,
    _release_tensors,
    _write,
    assert_load_names_every_key,
    assert_trains,
    make_tiny_model,
    make_tiny_model_folder,
    make_tiny_tokenizer,
    max_diff,
    prefilled,
    random_weights,
    steps,
)

# The cache graphs a decode step may leave: a few lazy edges, not a chain.
GRAPH_BOUND = 8

# A CSA and an HCA layer.
SMALL_CONFIG = {
    **TINY_CONFIG,
    "num_hidden_layers": 2,
    "layer_types": TINY_CONFIG["layer_types"][1:3],
    "mlp_layer_types": ["hash_moe", "moe"],
}


def graph_edges(a):
    """Edges of the unevaluated graph behind a (0 once it is evaluated)."""
    f = io.StringIO()
    mx.export_to_dot(f, a)
    return f.getvalue().count("->")


def max_cache_graph(cache):
    """The largest graph behind any array that any layer's cache holds."""
    return max(
        (
            graph_edges(v)
            for layer_cache in cache
            for c in layer_cache.caches
            for v in vars(c).values()
            if isinstance(v, mx.array)
        ),
        default=0,
    )


# This model's names, from transformers' save_pretrained ones.
_TRANSFORMERS_NAMES = (
    (r"^head\.", "lm_head."),
    (r"\.hc_head\.hc_", ".hc_head."),
    (r"\.hc_(attn|ffn)_", r".\1_hc."),
    (r"\.attn\.norm\.", ".attn.kv_norm."),
    (r"\.gate\.bias$", ".gate.e_score_correction_bias"),
    (r"\.w1\.", ".gate_proj."),
    (r"\.w2\.", ".down_proj."),
    (r"\.w3\.", ".up_proj."),
)

HAS_TORCH = all(importlib.util.find_spec(m) for m in ("torch", "transformers"))

# Recorded from transformers' DeepseekV4ForCausalLM (CPU torch, float32) on
# the weights of seeded_model() and the tokens of seeded_tokens(); see
# transformers_logits and TestDeepseekV4Transformers, which recomputes them.
# (Seed 0 puts a top-k pick on a near tie that float rounding decides.)
RECORDED_SEED = 1
RECORDED_POSITIONS = (0, 31, 32, 100, 200, 319)
RECORDED_LOGITS = (
    (-0.28736222, 0.028773338, -0.018358096, -0.711353, 2.5768335, 0.50235087),
    (2.0119197, 1.4937081, 0.36236233, -1.2104663, 3.3493612, 0.30717605),
    (2.3435755, 1.602152, 1.6708801, -2.2809861, 1.2720251, -0.036039472),
    (1.9435325, 1.5208817, 1.170927, -1.0333233, 1.8676848, -0.85795557),
    (0.71896315, 1.7371917, -0.89628816, 0.13029316, 0.41813365, 0.19270416),
    (-1.4696004, 0.94257987, 0.93110353, -0.13839662, 1.7942266, -1.1963558),
)
RECORDED_SUMMARY = (-1530.14908303, 131955.265269, 55.1366312333)


def seeded_model(config=None, seed=RECORDED_SEED):
    """A tiny model whose weights depend only on the seed and each weight's
    checkpoint name, not on the order of the parameters."""
    model = deepseek_v4.Model(deepseek_v4.ModelArgs.from_dict(config or TINY_CONFIG))
    args = model.args

    def init(path, p):
        key = mx.random.key(zlib.crc32(f"{seed}:{path}".encode()))
        if path.endswith("tid2eid"):
            return mx.random.randint(0, args.n_routed_experts, p.shape, key=key)
        scale = 0.1 if "norm" in path else 0.2
        offset = 1.0 if "norm" in path else 0.0
        return offset + scale * mx.random.normal(p.shape, key=key)

    flat = [
        (k, init(k, v).astype(v.dtype)) for k, v in tree_flatten(model.parameters())
    ]
    model.update(tree_unflatten(flat))
    mx.eval(model.parameters())
    return model


def seeded_tokens(n=320, seed=1):
    return mx.random.randint(
        0, TINY_CONFIG["vocab_size"], (1, n), key=mx.random.key(seed)
    )


def logits_summary(logits):
    """The recorded logits, and sums over all of them that a change anywhere
    moves: the total, the squares and a cosine-weighted sum (in float64)."""
    x = np.array(logits[0].astype(mx.float32), dtype=np.float64)
    sample = x[list(RECORDED_POSITIONS), :6]
    n, v = x.shape
    phase = np.arange(n)[:, None] * 0.11 + np.arange(v)[None] * 0.37
    return sample, np.array([x.sum(), (x * x).sum(), (x * np.cos(phase)).sum()])


def transformers_logits(model, tokens, config=None):
    """Logits of transformers' DeepseekV4ForCausalLM with the weights of the
    MLX model: each element of the reference's checkpoint is tagged with its
    index, the tags go through the MLX loader, and the MLX values are put
    back where the tags show they come from."""
    import torch
    from mlx_lm.utils import load_model
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    config = {k: v for k, v in (config or TINY_CONFIG).items() if k != "model_type"}
    reference = DeepseekV4ForCausalLM(DeepseekV4Config(**config)).float().eval()
    state = reference.state_dict()
    starts, total = {}, 1
    with torch.no_grad():
        for name, t in state.items():
            starts[name] = total
            tags = torch.arange(total, total + t.numel()).reshape(t.shape)
            t.copy_(tags.to(t.dtype))
            total += t.numel()
        with tempfile.TemporaryDirectory() as tmp:
            reference.save_pretrained(tmp)
            tagged, _ = load_model(Path(tmp))
        values = np.zeros(total, dtype=np.float64)
        covered = np.zeros(total, dtype=bool)
        mlx_weights = dict(tree_flatten(model.parameters()))
        for name, tags in tree_flatten(tagged.parameters()):
            ids = np.array(tags.astype(mx.int64)).ravel()
            values[ids] = np.array(mlx_weights[name].astype(mx.float32)).ravel()
            covered[ids] = True
        for name, t in state.items():
            start = starts[name]
            if not covered[start : start + t.numel()].all():
                raise AssertionError(f"{name} is not loaded by the MLX model")
            v = values[start : start + t.numel()].reshape(tuple(t.shape))
            t.copy_(torch.from_numpy(v).to(t.dtype))
        inputs = torch.from_numpy(np.array(tokens).astype(np.int64))
        logits = reference(inputs, use_cache=False).logits
    return mx.array(logits.numpy())


def transformers_model(config, seed):
    """A random transformers DeepseekV4ForCausalLM for config."""
    import torch
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    config = {k: v for k, v in config.items() if k != "model_type"}
    torch.manual_seed(seed)
    model = DeepseekV4ForCausalLM(DeepseekV4Config(**config, initializer_range=0.1))
    model = model.float().eval()
    with torch.no_grad():
        # These start at zeros or ones.
        for name, p in model.named_parameters():
            if name.endswith(("sinks", "position_bias", "base", "scale")):
                p.copy_(torch.randn_like(p))
            elif "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
        for name, b in model.named_buffers():
            if name.endswith("tid2eid"):
                b.copy_(torch.randint(0, config["n_routed_experts"], b.shape))
            elif name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn_like(b))
    return model
