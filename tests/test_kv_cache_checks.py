# Copyright © 2026 Apple Inc.

import unittest
import warnings

import mlx.core as mx

from mlx_lm.generate import generate_step
from mlx_lm.models import llama, mamba
from mlx_lm.models.cache import ArraysCache, QuantizedKVCache, make_prompt_cache


def tiny_mamba():
    """A model that makes its own cache, with no KV cache to quantize."""
    args = mamba.ModelArgs(
        model_type="mamba",
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        state_size=8,
        num_hidden_layers=2,
        conv_kernel=3,
        use_bias=False,
        use_conv_bias=True,
        time_step_rank=8,
    )
    return mamba.Model(args)


def tiny_llama():
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=100,
        num_key_value_heads=2,
    )
    return llama.Model(args)


class TestKVCacheChecks(unittest.TestCase):

    def test_max_kv_size_warns_that_it_does_not_apply(self):
        model = tiny_mamba()
        with self.assertWarnsRegex(
            UserWarning, "max_kv_size 64 does not apply to mamba"
        ):
            cache = make_prompt_cache(model, max_kv_size=64)
        self.assertIsInstance(cache[0], ArraysCache)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            make_prompt_cache(model)

    def test_kv_bits_is_an_error_naming_the_option(self):
        progress = []
        steps = generate_step(
            mx.array([3, 1, 4]),
            tiny_mamba(),
            kv_bits=4,
            prompt_progress_callback=lambda *a: progress.append(a),
        )
        with self.assertRaisesRegex(ValueError, r"kv_bits \(--kv-bits\) 4"):
            next(steps)
        # Before any progress (mlx_lm.cache_prompt prints it).
        self.assertEqual(progress, [])

    def test_kv_bits_still_quantizes_a_kv_cache(self):
        model = tiny_llama()
        cache = make_prompt_cache(model)
        steps = generate_step(
            mx.array([3, 1, 4]),
            model,
            prompt_cache=cache,
            kv_bits=4,
            kv_group_size=32,
            quantized_kv_start=0,
            max_tokens=3,
        )
        self.assertEqual(len(list(steps)), 3)
        self.assertIsInstance(cache[0], QuantizedKVCache)


if __name__ == "__main__":
    unittest.main()
