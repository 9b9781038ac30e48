# Copyright © 2026 Apple Inc.

import itertools
import unittest

import mlx.core as mx

from mlx_lm.generate import generate_step, speculative_generate_step
from mlx_lm.models import llama


def tiny_llama():
    mx.random.seed(0)
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=128,
    )
    return llama.Model(args)


class TestSpeculativeUnbounded(unittest.TestCase):

    def test_max_tokens_minus_one_generates_without_end(self):
        model = tiny_llama()
        prompt = mx.array([3, 1, 4, 1, 5, 9, 2, 6])
        expected = [t for t, _ in generate_step(prompt, model, max_tokens=20)]
        # The model drafts for itself, so its drafts are kept
        steps = speculative_generate_step(
            prompt, model, model, num_draft_tokens=3, max_tokens=-1
        )
        steps = list(itertools.islice(steps, 20))
        self.assertTrue(any(from_draft for *_, from_draft in steps))
        self.assertEqual([t for t, *_ in steps], expected)


if __name__ == "__main__":
    unittest.main()
