# Copyright © 2026 Apple Inc.

import copy
import json
import math
import re
import tempfile
import unittest
import zlib
from pathlib import Path
from unittest.mock import patch

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as opt
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from mlx_lm import load, stream_generate, tuner
from mlx_lm.chat_templates.deepseek_v4 import (
    assistant_token,
    bos_token,
    eos_token,
    thinking_end_token,
    thinking_start_token,
    user_token,
)
from mlx_lm.generate import (
    BatchGenerator,
    generate_step,
    speculative_generate_step,
)
from mlx_lm.models import deepseek_v4
from mlx_lm.models.cache import (
    TRIM_HISTORY,
    BatchWindowCompressorCache,
    make_prompt_cache,
    trim_prompt_cache,
)
from mlx_lm.models.switch_layers import QuantizedSwitchLinear
from mlx_lm.utils import load_model, quantize_model, save_config, save_model

# The chat format's tokens a tokenizer for it must have, BOS and EOS first.
SPECIAL_TOKENS = (
    bos_token,
    eos_token,
    user_token,
    assistant_token,
    thinking_start_token,
    thinking_end_token,
)
CSA, HCA = "compressed_sparse_attention", "heavily_compressed_attention"
# Every layer type and two hash layers; small rates and window so a prompt of
# a few hundred tokens wraps the window and fills both pools.
TINY_CONFIG = {
    "model_type": "deepseek_v4",
    "vocab_size": 300,
    "hidden_size": 32,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "head_dim": 32,
    "qk_rope_head_dim": 8,
    "q_lora_rank": 24,
    "o_groups": 2,
    "o_lora_rank": 16,
    "sliding_window": 32,
    "moe_intermediate_size": 16,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "index_n_heads": 8,
    "index_head_dim": 16,
    "index_topk": 8,
    "layer_types": ["sliding_attention", CSA, HCA, CSA],
    "compress_rates": {CSA: 4, HCA: 16},
    "mlp_layer_types": ["hash_moe", "hash_moe", "moe", "moe"],
    "rope_parameters": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "beta_fast": 32,
        "beta_slow": 1,
    },
    "max_position_embeddings": 256,
    "bos_token_id": 0,
    "eos_token_id": 1,
}
# A window of 8 rows and compressed windows of 4 and 8: a forward of up to 8
# tokens after a prompt of 33-39 closes windows of both.
VERIFY_CONFIG = {
    **TINY_CONFIG,
    "sliding_window": 8,
    "index_topk": 4,
    "compress_rates": {CSA: 4, HCA: 8},
}


def random_weights(model, seed=0):
    """Give every parameter random values (the defaults are mostly zeros)."""
    mx.random.seed(seed)
    args = model.args

    def init(path, p):
        if path.endswith("tid2eid"):
            return mx.random.randint(0, args.n_routed_experts, p.shape).astype(p.dtype)
        if path.endswith("norm.weight"):
            return 1.0 + 0.1 * mx.random.normal(p.shape)
        return 0.2 * mx.random.normal(p.shape)

    flat = [(k, init(k, v)) for k, v in tree_flatten(model.parameters())]
    model.update(tree_unflatten(flat))
    mx.eval(model.parameters())
    return model


def make_tiny_model(config=None, seed=0):
    args = deepseek_v4.ModelArgs.from_dict(config or TINY_CONFIG)
    return random_weights(deepseek_v4.Model(args), seed)


def make_tiny_tokenizer(path, vocab_size, special_tokens=SPECIAL_TOKENS):
    """A byte-level BPE tokenizer of vocab_size tokens saved in path, with the
    chat format's special tokens (BOS and EOS first)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    text = ["The quick brown fox jumps over the lazy dog. " * 4] * 8
    tokenizer.train_from_iterator(text, trainer)
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<｜begin▁of▁sentence｜>",
        eos_token="<｜end▁of▁sentence｜>",
    ).save_pretrained(path)


def make_tiny_model_folder(path, config=None, seed=0):
    """Write a random tiny DeepSeek-V4 (config, weights, tokenizer) to path."""
    config = config or TINY_CONFIG
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model = make_tiny_model(config, seed)
    # Zero logits for BOS and EOS, so greedy decoding runs to the token limit.
    model.lm_head.weight[:2] = 0.0
    mx.save_safetensors(
        str(path / "model.safetensors"), dict(tree_flatten(model.parameters()))
    )
    with open(path / "config.json", "w") as f:
        json.dump(config, f, indent=2)
    make_tiny_tokenizer(path, config["vocab_size"])
    return path


def max_diff(a, b):
    return mx.abs(a.astype(mx.float32) - b.astype(mx.float32)).max().item()


def steps(model, cache, tokens):
    """The logits of tokens [B, L] fed one at a time [B, L, V]."""
    out = [model(tokens[:, i : i + 1], cache=cache) for i in range(tokens.shape[1])]
    return mx.concatenate(out, axis=1)


def prefilled(model, tokens):
    cache = make_prompt_cache(model)
    mx.eval(model(tokens, cache=cache))
    return cache


def assert_trains(test, model):
    """Two steps of mlx_lm's trainer change the trainable parameters, with
    finite losses."""
    before = dict(tree_flatten(model.trainable_parameters()))
    test.assertTrue(before)
    losses, callback = [], tuner.callbacks.TrainingCallback()
    callback.on_train_loss_report = lambda info: losses.append(info["train_loss"])
    mx.random.seed(4)
    data = [(mx.random.randint(2, 300, (40,)).tolist(), 0) for _ in range(2)]
    with tempfile.TemporaryDirectory() as tmp:
        args = tuner.trainer.TrainingArgs(
            batch_size=2,
            iters=2,
            steps_per_report=1,
            adapter_file=str(Path(tmp) / "adapters.safetensors"),
        )
        adam = opt.Adam(learning_rate=1e-2)
        tuner.trainer.train(model, adam, data, args=args, training_callback=callback)
    test.assertEqual(len(losses), 2)
    test.assertTrue(all(math.isfinite(loss) for loss in losses))
    after = dict(tree_flatten(model.trainable_parameters()))
    test.assertEqual(after.keys(), before.keys())
    test.assertTrue(any(not mx.array_equal(after[k], before[k]) for k in after))


try:
    import torch
    from safetensors.torch import save_file
    from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
except ImportError:
    torch = None

CONFIG = {
    "model_type": "deepseek_v4",
    "vocab_size": 64,
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "qk_rope_head_dim": 16,
    "q_lora_rank": 128,
    "o_groups": 2,
    "o_lora_rank": 64,
    "sliding_window": 8,
    "moe_intermediate_size": 64,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "scoring_func": "sqrtsoftplus",
    "routed_scaling_factor": 1.5,
    "swiglu_limit": 10.0,
    "hc_mult": 2,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "rms_norm_eps": 1e-6,
    "index_n_heads": 2,
    "index_head_dim": 32,
    "index_topk": 2,
    "compress_ratios": [0, 4, 128, 4, 0],
    "num_hash_layers": 1,
    "num_nextn_predict_layers": 1,
    "rope_theta": 10000.0,
    "compress_rope_theta": 160000.0,
    "rope_scaling": {
        "type": "yarn",
        "factor": 16,
        "original_max_position_embeddings": 64,
        "beta_fast": 32,
        "beta_slow": 1,
    },
    "max_position_embeddings": 1024,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "torch_dtype": "bfloat16",
}
FP8_CONFIG = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "scale_fmt": "ue8m0",
    "weight_block_size": [128, 128],
}
# The per-module quantization of the mlx-community conversions.
COMMUNITY_RULES = (
    (r"\.ffn\.switch_mlp\.", {"group_size": 32, "bits": 4, "mode": "mxfp4"}),
    (
        r"\.(ffn\.shared_experts\.|attn\.w|indexer\.wq)",
        {"group_size": 32, "bits": 8, "mode": "mxfp8"},
    ),
)
TOKENS = mx.array([[0, 5, 9, 17, 33, 2, 61, 40, 7, 7, 12, 50, 3, 28, 44, 19, 8, 1]])

# DeepSeek's release names, from this model's.
_RELEASE_NAMES = (
    (r"^model\.embed_tokens\.", "embed."),
    (r"^lm_head\.", "head."),
    (r"^model\.hc_head\.", "hc_head_"),
    (r"^model\.", ""),
    (r"\.(attn|ffn)_hc\.", r".hc_\1_"),
    (r"\.e_score_correction_bias$", ".bias"),
    (r"\.gate_proj\.", ".w1."),
    (r"\.down_proj\.", ".w2."),
    (r"\.up_proj\.", ".w3."),
)
_FP8 = re.compile(
    r".*\.(attn\.w\w+|indexer\.wq_b|shared_experts\.w\d|[eh]_proj)\.weight"
)
_FP4_VALUES = (0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6)
_FLOAT32 = re.compile(r".*(hc_|ape|attn_sink|\.bias$)")


def _random_weights(config, seed=0):
    """Random MLX-named weights for the tiny model, with usable magnitudes."""
    args = deepseek_v4.ModelArgs.from_dict(config)
    model = deepseek_v4.Model(args)
    rng = np.random.default_rng(seed)
    weights = {}
    for name, value in tree_flatten(model.parameters()):
        shape = value.shape
        if name.endswith("tid2eid"):
            rows = [rng.permutation(shape[1] + 2)[: shape[1]] for _ in range(shape[0])]
            weights[name] = mx.array(np.stack(rows) % config["n_routed_experts"])
            continue
        if "norm" in name:
            array = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith((".fn", ".base", "ape", "attn_sink", "bias")):
            array = 0.1 * rng.standard_normal(shape)
        elif name.endswith(".scale"):
            array = 0.5 + rng.random(shape)
        else:
            array = rng.standard_normal(shape) / np.sqrt(shape[-1])
            # Vary the magnitude between 128x128 blocks and between groups of
            # 32 in a row, so that the scales of a layer differ.
            *lead, rows, cols = shape
            tiles = rng.integers(-2, 3, (*lead, -(-rows // 128), -(-cols // 128)))
            tiles = tiles.repeat(128, -2)[..., :rows, :].repeat(128, -1)
            groups = rng.integers(-1, 2, (*lead, rows, -(-cols // 32)))
            exponent = tiles[..., :cols] + groups.repeat(32, -1)[..., :cols]
            array = array * 2.0**exponent
        weights[name] = mx.array(array.astype(np.float32))
    return weights


def _release_name(name):
    for old, new in _RELEASE_NAMES:
        name = re.sub(old, new, name)
    return name


def _fp8_blocks(w, block=128):
    """e4m3 values with one power-of-two scale per block x block tile."""
    rows, cols = w.shape
    grid = (-(-rows // block), -(-cols // block))
    padded = torch.zeros(grid[0] * block, grid[1] * block)
    padded[:rows, :cols] = w
    tiles = padded.reshape(grid[0], block, grid[1], block)
    amax = tiles.abs().amax(dim=(1, 3)).clamp(min=1e-12)
    scale = torch.exp2(torch.ceil(torch.log2(amax / 448)))
    q = (tiles / scale[:, None, :, None]).reshape(padded.shape)[:rows, :cols]
    return q.to(torch.float8_e4m3fn), scale.to(torch.float8_e8m0fnu)


def _fp4_rows(w):
    """e2m1 values packed two per byte (even element in the low nibble), with
    one power-of-two scale per row and 32 columns."""
    rows, cols = w.shape
    groups = w.reshape(rows, cols // 32, 32)
    amax = groups.abs().amax(-1).clamp(min=1e-12)
    scale = torch.exp2(torch.ceil(torch.log2(amax / 6)))
    values = torch.tensor(_FP4_VALUES)
    scaled = (groups / scale[..., None]).reshape(rows, cols)
    index = (scaled[..., None] - values).abs().argmin(-1).to(torch.uint8)
    packed = index[:, 0::2] | (index[:, 1::2] << 4)
    return packed.view(torch.int8), scale.to(torch.float8_e8m0fnu)


def _release_tensors(weights, expert_dtype="fp4"):
    """The tiny model in DeepSeek's release format and dtypes."""
    tensors = {}
    for name, value in weights.items():
        array = torch.from_numpy(np.array(value))
        if name.endswith(".attn.wo_a.weight"):
            array = array.reshape(-1, array.shape[-1])
        key = _release_name(name)
        if ".switch_mlp." in name:
            for e in range(array.shape[0]):
                expert = key.replace(".switch_mlp.", f".experts.{e}.")
                q, s = (_fp4_rows if expert_dtype == "fp4" else _fp8_blocks)(array[e])
                tensors[expert] = q
                tensors[expert.replace(".weight", ".scale")] = s
        elif _FP8.fullmatch(key):
            q, s = _fp8_blocks(array)
            tensors[key] = q
            tensors[key.replace(".weight", ".scale")] = s
        elif key.endswith("tid2eid"):
            tensors[key] = array.to(torch.int64)
        elif _FLOAT32.fullmatch(key):
            tensors[key] = array
        else:
            tensors[key] = array.to(torch.bfloat16)
    return tensors


def _dequantized(tensors):
    """Dequantize the fp8 and fp4 weights with transformers' own definitions."""
    out = {}
    for key, value in tensors.items():
        scale = tensors.get(key.replace(".weight", ".scale"))
        if key.endswith(".scale") and key.replace(".scale", ".weight") in tensors:
            continue
        if not key.endswith(".weight") or scale is None:
            out[key] = value
        elif value.dtype == torch.int8:
            rows, packed = value.shape
            blocks = value.view(torch.uint8).reshape(1, rows, packed // 16, 16)
            scales = scale.view(torch.uint8)[None]
            w = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
            out[key] = w[0].T.contiguous()
        else:
            out[key] = _dequantize_fp8_weight(value, scale, [128, 128], torch.float32)
    return out


def _write(path, tensors, config):
    path.mkdir(parents=True)
    keys = sorted(tensors)
    # Two shards, as released checkpoints are sharded.
    for i, part in enumerate((keys[: len(keys) // 2], keys[len(keys) // 2 :])):
        shard = {k: tensors[k].contiguous() for k in part}
        save_file(shard, str(path / f"model-0000{i + 1}-of-00002.safetensors"))
    with open(path / "config.json", "w") as f:
        json.dump(config, f)


def _float32(model):
    """Cast the float parameters, so outputs compare in float32."""
    model.set_dtype(mx.float32)
    return model


def _quantized_layers(model):
    return {
        name: module.mode
        for name, module in model.named_modules()
        if isinstance(module, (nn.QuantizedLinear, QuantizedSwitchLinear))
    }


def _community_predicate(path, module):
    for pattern, params in COMMUNITY_RULES:
        if re.search(pattern, path):
            return params
    return {"group_size": 64, "bits": 8, "mode": "affine"}


def assert_load_names_every_key(test, path, keys):
    """Loading path fails naming each key, in one line per problem where
    the message lists them."""
    with test.assertRaises(ValueError) as e:
        load_model(path)
    message = str(e.exception)
    for key in keys:
        test.assertIn(key, message)
    if "\n" in message:
        test.assertEqual(message.count("\n  "), len(keys))


# Recorded from transformers' DeepseekV4ForCausalLM (transformers 5.25.0, CPU
# torch, float32) on the weights of seeded_model() and the tokens of
# seeded_tokens().
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


class TestDeepseekV4(unittest.TestCase):

    def test_config_schemas_and_invalid_fields(self):
        # DeepSeek's schema: one ratio a layer, and one for the MTP block.
        fields = ("layer_types", "compress_rates", "mlp_layer_types")
        legacy = {k: v for k, v in TINY_CONFIG.items() if k not in fields}
        legacy.update(compress_ratios=[0, 4, 16, 4, 0], num_hash_layers=2)
        a = deepseek_v4.ModelArgs.from_dict(TINY_CONFIG)
        b = deepseek_v4.ModelArgs.from_dict(legacy)
        for field in fields:
            self.assertEqual(getattr(a, field), getattr(b, field))
        both = deepseek_v4.ModelArgs.from_dict({**TINY_CONFIG, **legacy})
        self.assertEqual(both.layer_types, TINY_CONFIG["layer_types"])

        disagree = "`compress_ratios` and `layer_types` disagree on layer"
        dense = ["hash_moe", "moe", "moe", "dense"]
        for overrides, message in (
            ({"layer_types": ["sliding_attention"] * 3}, "layer_types"),
            ({"mlp_layer_types": dense}, "mlp_layer_types"),
            ({"compress_rates": {CSA: 0}}, "compress_rates"),
            ({"scoring_func": "softmax"}, "scoring_func"),
            ({"num_key_value_heads": 2}, "num_key_value_heads"),
            ({"layer_types": None}, "compress_ratios"),
            ({"qk_rope_head_dim": 34}, "`qk_rope_head_dim` 34 is odd or above"),
            ({"qk_rope_head_dim": 7}, "`qk_rope_head_dim` 7 is odd or above"),
            ({"num_experts_per_tok": 9}, "`num_experts_per_tok` is more than"),
            ({"o_groups": 3}, "`o_groups` 3 does not divide"),
            ({"compress_ratios": [0, 4, 4, 4]}, f"{disagree} 2"),
            ({"compress_ratios": [0, 4, 128, 4]}, f"{disagree} 2"),
            ({"compress_ratios": [4] * 4}, f"{disagree} 0"),
        ):
            with self.subTest(**overrides):
                with self.assertRaisesRegex(ValueError, message):
                    deepseek_v4.ModelArgs.from_dict({**TINY_CONFIG, **overrides})

    def test_logits_match_the_recorded_transformers_logits(self):
        model = seeded_model()
        tokens = seeded_tokens()
        cache = make_prompt_cache(model)
        outs = [model(tokens[:, :250], cache)]
        for i in range(250, tokens.shape[1]):
            outs.append(model(tokens[:, i : i + 1], cache))
        for logits in (model(tokens), mx.concatenate(outs, axis=1)):
            sample, summary = logits_summary(logits)
            np.testing.assert_allclose(sample, RECORDED_LOGITS, rtol=0, atol=1e-4)
            np.testing.assert_allclose(summary, RECORDED_SUMMARY, rtol=0, atol=0.05)

    def test_decode_and_chunked_prefill_equal_one_forward(self):
        # One layer of each type, to keep the 600 decode steps quick.
        config = {
            **TINY_CONFIG,
            "num_hidden_layers": 3,
            "layer_types": [CSA, HCA, "sliding_attention"],
            "mlp_layer_types": ["hash_moe", "moe", "moe"],
        }
        model = make_tiny_model(config)
        mx.random.seed(2)
        n = 600
        inputs = mx.random.randint(0, 300, (1, n))
        full = model(inputs)
        mx.eval(full)
        # Split points with different phases of every window and rate.
        for split in (1, 530, 571):
            with self.subTest(split=split):
                cache = make_prompt_cache(model)
                outs = [model(inputs[:, :split], cache)]
                for i in range(split, n):
                    outs.append(model(inputs[:, i : i + 1], cache))
                    mx.async_eval(outs[-1])
                out = mx.concatenate(outs, axis=1)
                self.assertLessEqual(max_diff(out, full), 1e-4)
        # Long prompts gather each query's keys from the CSA pool: the same.
        for step, sparse in ((7, 0), (64, 0), (250, 0), (64, 8), (250, 8)):
            with self.subTest(step=step, sparse_from=sparse):
                cache = make_prompt_cache(model)
                entries = sparse or deepseek_v4._SPARSE_ENTRIES
                with patch.object(deepseek_v4, "_SPARSE_ENTRIES", entries):
                    outs = [
                        model(inputs[:, i : i + step], cache) for i in range(0, n, step)
                    ]
                out = mx.concatenate(outs, axis=1)
                self.assertLessEqual(max_diff(out, full), 1e-4)

    def test_batch_rows_equal_single_rows(self):
        model = make_tiny_model()
        mx.random.seed(1)
        prompts = [mx.random.randint(2, 300, (n,)).tolist() for n in (70, 45)]
        # Left padded, as a batch of caches merged from single rows.
        padding = [70 - len(p) for p in prompts]
        padded = mx.array([[0] * n + p for n, p in zip(padding, prompts)])
        rows = [make_prompt_cache(model) for _ in prompts]
        batch = [c[0].merge(list(c)) for c in zip(*rows)]
        for c in batch:
            c.prepare(left_padding=padding)
        out = [model(padded, batch)[:, -1:]]
        for c in batch:
            c.finalize()
        tokens = mx.array([[7, 9, 11], [8, 10, 12]])
        out.append(steps(model, batch, tokens))
        for i, prompt in enumerate(prompts):
            cache = make_prompt_cache(model)
            expected = [model(mx.array([prompt]), cache)[:, -1:]]
            expected.append(steps(model, cache, tokens[i : i + 1]))
            for got, want in zip(out, expected):
                self.assertLessEqual(max_diff(got[i : i + 1], want), 1e-4)

        # BatchGenerator: a request joining another's decode.
        def alone(prompt):
            gen = generate_step(mx.array(prompt), model, max_tokens=24)
            return [(int(t), lp) for t, lp in gen]

        generator = BatchGenerator(model)
        results = {}
        for step in range(60):
            if step in (0, 10):
                (uid,) = generator.insert([prompts[step > 0]], max_tokens=[24])
                results[uid] = []
            for r in generator.next_generated():
                results[r.uid].append((r.token, r.logprobs))
        generator.close()
        for got, prompt in zip(results.values(), prompts):
            want = alone(prompt)
            self.assertEqual([t for t, _ in got], [t for t, _ in want])
            for (_, a), (_, b) in zip(got, want):
                self.assertLessEqual(max_diff(a, b), 1e-4)

    def test_verify_equals_one_token_steps(self):
        # A forward of a few tokens after a prompt (a speculative verify):
        # the logits of one-token steps, and the next token sees the same.
        model = make_tiny_model(VERIFY_CONFIG)
        mx.random.seed(1)
        tokens = mx.random.randint(2, 300, (2, 64))
        for prompt, length in [(33, 2), (35, 4), (36, 5), (37, 3), (38, 8), (39, 6)]:
            with self.subTest(prompt=prompt, length=length):
                verified = prefilled(model, tokens[:1, :prompt])
                stepped = prefilled(model, tokens[:1, :prompt])
                rows = tokens[:1, prompt : prompt + length]
                self.assertLess(
                    max_diff(model(rows, verified), steps(model, stepped, rows)), 1e-4
                )
                after = tokens[:1, prompt + length][None]
                self.assertLess(
                    max_diff(model(after, verified), model(after, stepped)), 1e-4
                )

        # Batch rows at their own positions.
        def batch():
            rows = [
                prefilled(model, tokens[r : r + 1, :n]) for r, n in ((0, 37), (1, 30))
            ]
            return [BatchWindowCompressorCache.merge(c) for c in zip(*rows)]

        rows = mx.stack([tokens[0, 37:43], tokens[1, 30:36]])
        self.assertLess(
            max_diff(model(rows, batch()), steps(model, batch(), rows)), 1e-4
        )

        # A verify of y and 7 drafts, the first `accepted` kept: the trims
        # undo closed windows of both ratios (the rows cross 36 and 40).
        for accepted in (0, 2, 3, 6, 7):
            with self.subTest(accepted=accepted):
                kept = 33 + 1 + accepted
                cache = prefilled(model, tokens[:1, :33])
                model(tokens[:1, 33:41], cache)
                self.assertEqual(trim_prompt_cache(cache, 7 - accepted), 7 - accepted)
                rows = tokens[:1, kept : kept + 8]
                reference = prefilled(model, tokens[:1, :kept])
                self.assertLess(
                    max_diff(steps(model, cache, rows), steps(model, reference, rows)),
                    1e-4,
                )

    def test_speculative_decoding_gives_the_greedy_tokens_or_raises(self):
        model = make_tiny_model()
        # The model with noise in its head drafts, so some drafts are rejected.
        draft = make_tiny_model()
        draft.lm_head.weight += 0.1 * mx.random.normal(draft.lm_head.weight.shape)
        prompt = mx.random.randint(2, 300, (37,))
        expected = [t for t, _ in generate_step(prompt, model, max_tokens=48)]

        def speculative(num_draft_tokens):
            return speculative_generate_step(
                prompt, model, draft, num_draft_tokens=num_draft_tokens, max_tokens=48
            )

        for num_draft_tokens in (3, TRIM_HISTORY):
            with self.subTest(num_draft_tokens=num_draft_tokens):
                out = list(speculative(num_draft_tokens))
                self.assertEqual([t for t, *_ in out], expected)
                self.assertTrue(any(from_draft for *_, from_draft in out))
        # More drafts than the caches can take back: refused before any token
        steps = speculative(TRIM_HISTORY + 1)
        with self.assertRaisesRegex(ValueError, f"at most {TRIM_HISTORY} draft"):
            next(steps)

    def test_tiny_folder_loads_and_generates(self):
        with tempfile.TemporaryDirectory() as tmp:
            make_tiny_model_folder(tmp)
            model, tokenizer = load(tmp)
            prompt = "The quick brown fox"
            *_, last = stream_generate(model, tokenizer, prompt, max_tokens=60)
        # Greedy decoding never meets EOS here, so it runs to the limit.
        self.assertEqual(last.generation_tokens, 60)
        self.assertEqual(last.finish_reason, "length")

    def test_lora_trains(self):
        model = make_tiny_model()
        model.freeze()
        tuner.utils.linear_to_lora_layers(
            model, len(model.layers), {"rank": 4, "scale": 10.0, "dropout": 0.0}
        )
        assert_trains(self, model)

    def test_full_fine_tune_trains(self):
        # Unfrozen as mlx_lm.lora --fine-tune-type full does, then whole: the
        # hash layers' expert tables (integers) stay frozen.
        model = make_tiny_model()
        model.freeze()
        for layer in model.layers:
            layer.unfreeze()
        assert_trains(self, model)
        model.unfreeze()
        assert_trains(self, model)


class TestDeepseekV4Checkpoints(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.addClassCleanup(cls.tmp.cleanup)
        cls.path = Path(cls.tmp.name)
        cls.weights = _random_weights(CONFIG)

    def _write_release(self, name, expert_dtype="fp4", tag_experts=True):
        tensors = _release_tensors(self.weights, expert_dtype)
        config = dict(CONFIG, quantization_config=dict(FP8_CONFIG))
        if tag_experts:
            config["quantization_config"]["expert_dtype"] = expert_dtype
        _write(self.path / name, tensors, config)
        _write(self.path / f"{name}-dequantized", _dequantized(tensors), CONFIG)
        return self.path / name, self.path / f"{name}-dequantized"

    @unittest.skipIf(torch is None, "needs torch, safetensors and transformers")
    def test_release_loads_packed_with_the_dequantized_logits(self):
        # DeepSeek's fp8 weights and fp4 experts (its first V4-Flash config
        # did not tag the experts) as mxfp8 and mxfp4, exactly the values of
        # transformers' dequantization.
        for name, tag in (("release", True), ("untagged", False)):
            path, reference = self._write_release(name, tag_experts=tag)
            model, _ = load_model(path)
            expected, _ = load_model(reference)
            modes = set(_quantized_layers(model).items())
            self.assertIn(("model.layers.1.attn.indexer.wq_b", "mxfp8"), modes)
            self.assertIn(("model.layers.0.ffn.switch_mlp.up_proj", "mxfp4"), modes)
            self.assertNotIn("lm_head", _quantized_layers(model))
            ref = dict(tree_flatten(expected.parameters()))
            for key, module in model.named_modules():
                if hasattr(module, "scales"):
                    w = mx.dequantize(
                        module.weight,
                        module.scales,
                        group_size=module.group_size,
                        bits=module.bits,
                        mode=module.mode,
                        dtype=mx.float32,
                    )
                    self.assertTrue(mx.array_equal(w, ref[f"{key}.weight"]), key)
            # A prompt, then decode steps through the packed experts.
            model, expected = _float32(model), _float32(expected)
            caches = make_prompt_cache(model), make_prompt_cache(expected)
            prompt = mx.tile(TOKENS, (1, 4))
            out, ref = model(prompt, caches[0]), expected(prompt, caches[1])
            for _ in range(8):
                self.assertTrue(mx.allclose(out, ref, rtol=1e-4, atol=1e-4))
                token = mx.argmax(out[:, -1:], axis=-1)
                out, ref = model(token, caches[0]), expected(token, caches[1])

    @unittest.skipIf(torch is None, "needs torch, safetensors and transformers")
    def test_convert_round_trip(self):
        from mlx_lm.convert import convert

        path, _ = self._write_release("convert-source")
        make_tiny_tokenizer(path, CONFIG["vocab_size"])
        source, config = load_model(path)
        convert(str(path), mlx_path=str(self.path / "converted"))
        model, _ = load_model(self.path / "converted")
        self.assertEqual(_quantized_layers(model), _quantized_layers(source))
        self.assertTrue(mx.array_equal(model(TOKENS), source(TOKENS)))

        convert(str(path), mlx_path=str(self.path / "converted-q"), quantize=True)
        model, _ = load_model(self.path / "converted-q")
        source, _ = quantize_model(source, config, None, None)
        self.assertIn("lm_head", _quantized_layers(model))
        self.assertEqual(_quantized_layers(model), _quantized_layers(source))
        self.assertTrue(mx.array_equal(model(TOKENS), source(TOKENS)))

    def test_community_conversion_loads(self):
        # The per-module mxfp4/mxfp8/affine mix of the mlx-community uploads.
        model = deepseek_v4.Model(deepseek_v4.ModelArgs.from_dict(CONFIG))
        model.load_weights(list(self.weights.items()))
        model, config = quantize_model(
            model, dict(CONFIG), 64, 8, quant_predicate=_community_predicate
        )
        save_model(self.path / "community", model)
        save_config(copy.deepcopy(config), self.path / "community/config.json")
        loaded, _ = load_model(self.path / "community")
        modes = _quantized_layers(loaded)
        self.assertEqual(modes["model.layers.0.ffn.switch_mlp.up_proj"], "mxfp4")
        self.assertEqual(modes["model.layers.3.attn.indexer.wq_b"], "mxfp8")
        self.assertEqual(modes["lm_head"], "affine")
        self.assertEqual(modes, _quantized_layers(model))
        self.assertTrue(mx.array_equal(loaded(TOKENS), model(TOKENS)))

    @unittest.skipIf(torch is None, "needs torch, safetensors and transformers")
    def test_bad_checkpoints_name_every_key(self):
        bad = _release_tensors(self.weights)
        del bad["layers.1.ffn.experts.3.w2.weight"], bad["layers.2.attn.wkv.scale"]
        bad["layers.0.attn.wq_a.scale"] = bad["layers.0.attn.wq_a.scale"][:, :1]
        # A weight under both DeepSeek's name and the model's.
        bad["model.norm.weight"] = bad["norm.weight"].clone()
        config = dict(CONFIG, quantization_config=FP8_CONFIG)
        _write(self.path / "bad", bad, config)
        assert_load_names_every_key(
            self,
            self.path / "bad",
            (
                "layers.1.ffn.experts.0.w2.weight: parts missing [3]",
                "layers.2.attn.wkv.weight: an fp8 or fp4 weight needs its scale",
                "layers.0.attn.wq_a.weight: its scale has shape (1, 1)",
                "model.norm.weight: norm.weight names the same weight",
            ),
        )
        _write(self.path / "ratios", bad, dict(config, compress_ratios=[0, 4]))
        keys = ["`compress_ratios` needs 4 ratios"]
        assert_load_names_every_key(self, self.path / "ratios", keys)

    def test_deepseek_v41_names_the_weight_of_a_bad_scale(self):
        # V4.1 repacks its fp8 and fp4 weights with V4's checks.
        from mlx_lm.models import deepseek_v41

        args = deepseek_v41.ModelArgs(
            model_type="deepseek_v41",
            vocab_size=64,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            head_dim=32,
            q_lora_rank=32,
            qk_rope_head_dim=8,
            o_groups=2,
            o_lora_rank=16,
            moe_intermediate_size=32,
            n_routed_experts=2,
            num_experts_per_tok=1,
            compress_ratios=(0, 0),
        )
        model = deepseek_v41.Model(args)
        fp8, fp4 = mx.zeros((32, 64), mx.uint8), mx.zeros((2, 32, 32), mx.int8)
        for weights, key in (
            ({"layers.0.attn.wq_a": fp8}, "layers.0.attn.wq_a.weight"),
            (
                {f"layers.1.ffn.experts.{i}.w1": fp4[i] for i in range(2)},
                "layers.1.ffn.experts.*.w1.weight",
            ),
        ):
            weights = {
                f"{name}.{kind}": value
                for name, weight in weights.items()
                for kind, value in (("weight", weight), ("scale", mx.ones((1, 1))))
            }
            with self.subTest(key=key):
                with self.assertRaisesRegex(ValueError, f"^{re.escape(key)}: its"):
                    model.sanitize(weights)


if __name__ == "__main__":
    unittest.main()
