# Copyright © 2026 Apple Inc.
"""What greedy speculative decoding guarantees against plain greedy
decoding (README, "Greedy output"): in float32 the same tokens; in bf16 the
same tokens up to the first position where plain decoding's top two logits
are closer than a verify's rounding moves them. Oracle drafters at the
published acceptance (MTP k=2, DSpark block 5), 43 tiny layers.

On a GPU the same check at Flash's widths:
python benchmarks/dsv4_verify.py --layers 43 --experts 8 --no-verify --dspark \\
    --greedy-guarantee --context 1024 --tokens 48
"""

import unittest

import dsv4_verify


def guarantee(dtype):
    args = dsv4_verify.parse_args(
        ["--layers", "43", "--tiny", "--dtype", dtype, "--context", "64"]
        + ["--tokens", "24", "--exactness-rounds", "8"]
    )
    config, model = dsv4_verify.build(args)
    _, dmodel = dsv4_verify.build_dspark(args, config, model)
    if dtype != "float32":
        for m in (model, dmodel):
            dsv4_verify.bf16_like_the_gpu(m)
    return dsv4_verify.greedy_guarantee(args, model, dmodel)


class TestGreedyGuarantee(unittest.TestCase):

    def test_float32_tokens_equal_plain_greedy(self):
        _, found = guarantee("float32")
        self.assertEqual(found, [None] * 8)

    def test_bf16_differs_only_within_the_verify_rounding(self):
        worst, found = guarantee("bfloat16")
        for first in found:
            if first is not None:
                index, margin = first
                # Both logits can move by up to worst.
                self.assertLessEqual(margin, 2 * worst, f"at token {index}")


if __name__ == "__main__":
    unittest.main()
