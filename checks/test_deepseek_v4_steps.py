# Copyright © 2026 Apple Inc.
"""The host's work of DeepSeek-V4's forwards of a few tokens (a speculative
verify), counted in graph primitives: tests/test_deepseek_v4_verify.py's
model and prompts."""

import io
import sys
import unittest
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_deepseek_v4_verify import TestDeepseekV4Verify  # noqa: E402


def primitives(model, cache, tokens):
    out = model(tokens, cache=cache)
    f = io.StringIO()
    mx.export_to_dot(f, out, *[a for c in cache for a in c.cache_arrays()])
    mx.eval(out)
    return f.getvalue().count("shape=rectangle")


class TestVerifySteps(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        TestDeepseekV4Verify.setUpClass.__func__(cls)

    prefilled = TestDeepseekV4Verify.prefilled

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
