# Copyright © 2026 Apple Inc.

import unittest

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten
from test_deepseek_v4 import (
    VERIFY_CONFIG,
    make_tiny_model,
    max_diff,
    prefilled,
    steps,
)

from mlx_lm.models.cache import BatchWindowCompressorCache


def bfloat16_model():
    """A tiny model in bf16 as load() casts it (the cast predicate's
    parameters float32), its routed experts float32: the CPU multiplies
    gathered experts in float32 only."""
    model = make_tiny_model(VERIFY_CONFIG)
    cast = model.cast_predicate

    def dtype(key, value):
        if not mx.issubdtype(value.dtype, mx.floating) or not cast(key):
            return value.dtype
        return mx.float32 if ".switch_mlp." in key else mx.bfloat16

    weights = tree_flatten(model.parameters())
    model.update(tree_unflatten([(k, v.astype(dtype(k, v))) for k, v in weights]))
    return model


class TestVerifyAttention(unittest.TestCase):

    def test_bfloat16_verify_rounds_as_one_token_steps(self):
        # A forward of a few tokens (a speculative verify) in bf16 gives the
        # logits of the one-token steps it stands for, so greedy drafting
        # keeps plain greedy decoding's tokens. On the CPU both are the same
        # to the bit here; the tolerance is one bf16 step of these logits.
        with mx.stream(mx.cpu):
            model = bfloat16_model()
            mx.random.seed(1)
            tokens = mx.random.randint(2, 300, (2, 300))
            cases = [(33, 2), (35, 4), (36, 5), (37, 3), (38, 8), (120, 6), (250, 3)]
            for prompt, length in cases:
                with self.subTest(prompt=prompt, length=length):
                    verified = prefilled(model, tokens[:1, :prompt])
                    stepped = prefilled(model, tokens[:1, :prompt])
                    rows = tokens[:1, prompt : prompt + length]
                    got = model(rows, verified)
                    want = steps(model, stepped, rows)
                    self.assertLessEqual(max_diff(got, want), 0.02)
                    self.assertEqual(got.argmax(-1).tolist(), want.argmax(-1).tolist())

            # Batch rows at their own positions.
            def batch():
                rows = [
                    prefilled(model, tokens[r : r + 1, :n])
                    for r, n in ((0, 37), (1, 30))
                ]
                return [BatchWindowCompressorCache.merge(c) for c in zip(*rows)]

            rows = mx.stack([tokens[0, 37:43], tokens[1, 30:36]])
            got, want = model(rows, batch()), steps(model, batch(), rows)
            self.assertLessEqual(max_diff(got, want), 0.02)
            self.assertEqual(got.argmax(-1).tolist(), want.argmax(-1).tolist())


if __name__ == "__main__":
    unittest.main()
