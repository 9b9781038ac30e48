# Copyright © 2026 Apple Inc.
"""The host's work of DeepSeek-V4's forwards of a few tokens (a speculative
verify), counted in graph primitives: the model and prompts of
tests/test_deepseek_v4.py's test_verify_equals_one_token_steps."""

import io
import unittest

import mlx.core as mx
from dsv4_fixtures import VERIFY_CONFIG, make_tiny_model, prefilled


def primitives(model, cache, tokens):
    out = model(tokens, cache=cache)
    f = io.StringIO()
    mx.export_to_dot(f, out, *[a for c in cache for a in c.cache_arrays()])
    mx.eval(out)
    return f.getvalue().count("shape=rectangle")


class TestVerifySteps(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = make_tiny_model(VERIFY_CONFIG)
        mx.random.seed(1)
        cls.tokens = mx.random.randint(2, 300, (2, 64))

    def prefilled(self, length):
        return prefilled(self.model, self.tokens[:1, :length])

    def test_a_verify_costs_about_one_step(self):
        # Each forward closes a window of each compressor (one token: the
        # one that closes them); primitives are the host's work per forward.
        one = primitives(self.model, self.prefilled(39), self.tokens[:1, 39:40])
        for prompt, length in [(38, 2), (36, 4), (33, 8)]:
            with self.subTest(length=length):
                tokens = self.tokens[:1, prompt : prompt + length]
                wide = primitives(self.model, self.prefilled(prompt), tokens)
                self.assertLessEqual(wide, 1.1 * one)


if __name__ == "__main__":
    unittest.main()
