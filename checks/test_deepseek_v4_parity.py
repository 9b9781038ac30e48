# Copyright © 2026 Apple Inc.

import re
import tempfile
import unittest
from pathlib import Path

import mlx.core as mx
import numpy as np
from dsv4_fixtures import (
    _TRANSFORMERS_NAMES,
    CONFIG,
    HAS_TORCH,
    RECORDED_LOGITS,
    RECORDED_SUMMARY,
    TINY_CONFIG,
    logits_summary,
    make_tiny_model,
    max_diff,
    seeded_model,
    seeded_tokens,
    transformers_logits,
    transformers_model,
)
from mlx.utils import tree_flatten

from mlx_lm.models import deepseek_v41
from mlx_lm.models.cache import (
    TRIM_HISTORY,
)
from mlx_lm.utils import load_model


class TestDeepseekV4Numerics(unittest.TestCase):

    def assertMatchesRecord(self, logits):
        sample, summary = logits_summary(logits)
        np.testing.assert_allclose(sample, RECORDED_LOGITS, rtol=0, atol=1e-4)
        np.testing.assert_allclose(summary, RECORDED_SUMMARY, rtol=0, atol=0.05)

    def test_sliding_window_is_a_fixed_buffer(self):
        # A ring of the window's rows and the rows a trim may take back,
        # plus the slot that takes rows not kept.
        model = make_tiny_model()
        args = model.args
        self.assertEqual(args.layer_types[0], "sliding_attention")
        rows = args.sliding_window + TRIM_HISTORY + 1
        size = rows * args.head_dim * mx.float32.size
        cache = model.make_cache()
        for length in (10, 100, 1, 1, 1):
            mx.eval(model(mx.zeros((1, length), dtype=mx.int32), cache))
            self.assertEqual(cache[0].nbytes, size)


@unittest.skipUnless(HAS_TORCH, "torch and transformers are needed")
class TestDeepseekV4Transformers(unittest.TestCase):

    def test_recorded_logits_are_transformers_logits(self):
        model = seeded_model()
        logits = transformers_logits(model, seeded_tokens())
        sample, summary = logits_summary(logits)
        np.testing.assert_allclose(sample, RECORDED_LOGITS, rtol=0, atol=1e-5)
        np.testing.assert_allclose(summary, RECORDED_SUMMARY, rtol=0, atol=0.01)

    def test_logits_match_transformers(self):
        import torch

        from mlx_lm.utils import load_model

        reference = transformers_model(TINY_CONFIG, seed=0)
        n = 320
        torch.manual_seed(1)
        inputs = torch.randint(0, TINY_CONFIG["vocab_size"], (1, n))
        with torch.no_grad():
            expected = reference(inputs, use_cache=False).logits
        with tempfile.TemporaryDirectory() as tmp:
            reference.save_pretrained(tmp)
            model, _ = load_model(Path(tmp))
        # The prompt wraps the window and fills both pools.
        args = model.args
        self.assertGreater(n, 4 * args.sliding_window)
        self.assertGreater(n // 4, 4 * args.index_topk)
        self.assertGreaterEqual(n // 16, 3)

        out = model(mx.array(inputs.numpy()))
        self.assertGreater(expected.abs().max().item(), 1.0)
        self.assertLessEqual(max_diff(out, mx.array(expected.numpy())), 1e-4)

        # The same through the cache, one token at a time after a prefill.
        cache = model.make_cache()
        outs = [model(mx.array(inputs[:, :250].numpy()), cache)]
        for i in range(250, n):
            outs.append(model(mx.array(inputs[:, i : i + 1].numpy()), cache))
        out = mx.concatenate(outs, axis=1)
        self.assertLessEqual(max_diff(out, mx.array(expected.numpy())), 1e-4)


class TestScaleLayout(unittest.TestCase):
    def test_float_power_of_two_scales_equal_ue8m0(self):
        weight = mx.random.randint(0, 120, (200, 320)).astype(mx.uint8)
        exponents = mx.random.randint(120, 130, (2, 3)).astype(mx.uint8)
        scales = mx.power(2.0, exponents.astype(mx.float32) - 127)
        packed, expected = deepseek_v41.repack_quantized(weight, exponents, (128, 128))
        _, got = deepseek_v41.repack_quantized(weight, scales, (128, 128))
        self.assertTrue(mx.array_equal(got, expected))
        self.assertEqual(packed.shape, (200, 80))
        # One scale per row and 32 columns, from the block that holds them.
        self.assertEqual(expected.shape, (200, 10))
        self.assertEqual(expected[130, 4].item(), exponents[1, 1].item())
        self.assertEqual(expected[127, 9].item(), exponents[0, 2].item())

        with self.assertRaisesRegex(ValueError, "powers of two"):
            deepseek_v41.repack_quantized(weight, scales * 1.5, (128, 128))
        with self.assertRaisesRegex(ValueError, r"\(2, 2\)"):
            deepseek_v41.repack_quantized(weight, exponents[:, :2], (128, 128))
        # Blocks must hold whole groups of 32 columns.
        with self.assertRaisesRegex(ValueError, "48-column blocks"):
            deepseek_v41.repack_quantized(
                weight, mx.full((2, 7), 127, mx.uint8), (128, 48)
            )


class TestTransformersLayout(unittest.TestCase):
    @unittest.skipUnless(HAS_TORCH, "needs torch, safetensors and transformers")
    def test_save_pretrained_loads_every_tensor(self):
        import torch
        from safetensors import safe_open
        from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

        config = {
            k: v
            for k, v in CONFIG.items()
            if k not in ("compress_ratios", "num_hash_layers", "rope_scaling")
        }
        config["layer_types"] = [
            "sliding_attention",
            "compressed_sparse_attention",
            "heavily_compressed_attention",
            "compressed_sparse_attention",
        ]
        config["compress_rates"] = {
            "compressed_sparse_attention": 4,
            "heavily_compressed_attention": 8,
        }
        config["mlp_layer_types"] = ["hash_moe", "moe", "moe", "moe"]
        torch.manual_seed(0)
        reference = DeepseekV4ForCausalLM(DeepseekV4Config(**config))
        for param in reference.parameters():
            torch.nn.init.normal_(param, std=0.05)
        with tempfile.TemporaryDirectory() as tmp:
            reference.save_pretrained(tmp)
            model, _ = load_model(Path(tmp))
            with safe_open(str(Path(tmp) / "model.safetensors"), "pt") as f:
                saved = {k: f.get_tensor(k) for k in f.keys()}

        # transformers writes DeepSeek's names under "model.", with a few of
        # its own (hc_head.hc_fn, attn.norm for kv_norm).
        self.assertIn("model.layers.0.attn.norm.weight", saved)
        self.assertIn("model.hc_head.hc_fn", saved)
        params = dict(tree_flatten(model.parameters()))
        unread = set(params)
        for key, value in saved.items():
            name, expert = key, None
            for old, new in _TRANSFORMERS_NAMES:
                name = re.sub(old, new, name)
            if match := re.fullmatch(r"(.+)\.experts\.(\d+)\.(.+)", name):
                name = f"{match[1]}.switch_mlp.{match[3]}"
                expert = int(match[2])
            loaded = params[name] if expert is None else params[name][expert]
            value = value.numpy().reshape(loaded.shape)
            self.assertTrue(np.array_equal(np.array(loaded), value), key)
            unread.discard(name)
        self.assertEqual(unread, set())


if __name__ == "__main__":
    unittest.main()
