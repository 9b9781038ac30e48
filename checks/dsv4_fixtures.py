# Copyright © 2026 Apple Inc.
"""DeepSeek-V4's deeper checks' helpers: tests/test_deepseek_v4.py's tiny
models and checkpoint writers, the recorded transformers logits and the
transformers model on the same weights."""

import importlib.util
import io
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_deepseek_v4 import (  # noqa: E402, F401
    _RELEASE_NAMES,
    COMMUNITY_RULES,
    CONFIG,
    FP8_CONFIG,
    RECORDED_LOGITS,
    RECORDED_SUMMARY,
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
    logits_summary,
    make_tiny_model,
    make_tiny_model_folder,
    make_tiny_tokenizer,
    max_diff,
    prefilled,
    random_weights,
    seeded_model,
    seeded_tokens,
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


def transformers_logits(model, tokens, config=None):
    """Logits of transformers' DeepseekV4ForCausalLM with the weights of the
    MLX model: each element of the reference's checkpoint is tagged with its
    index, the tags go through the MLX loader, and the MLX values are put
    back where the tags show they come from."""
    import torch
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    from mlx_lm.utils import load_model

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
