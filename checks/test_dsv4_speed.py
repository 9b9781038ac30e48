# Copyright © 2026 Apple Inc.

import math
import unittest

import dsv4_speed
import mlx.core as mx


class TestDsv4SpeedErrorStats(unittest.TestCase):

    def test_relative_error_and_argmax_agreement(self):
        stats = dsv4_speed.ErrorStats()
        ref = mx.array([[[1.0, 4.0, 2.0], [3.0, 0.0, 1.0]]])
        stats.add(ref + mx.array([0.0, 0.0, 0.5]), ref)
        self.assertAlmostEqual(stats.error, 0.5 / 3.0, places=6)
        self.assertEqual((stats.agree, stats.n), (2, 2))
        self.assertEqual(stats.bad, [0, 0])

    def test_a_nan_after_finite_errors_is_reported_as_nan(self):
        # max(0.2, nan) is 0.2 in Python: the nan must not vanish.
        stats = dsv4_speed.ErrorStats()
        ref = mx.array([[[1.0, 4.0, 2.0]]])
        stats.add(ref + 0.5, ref)
        for logits, reference in (
            (mx.full((1, 2, 3), mx.nan), ref),
            (ref, mx.array([[[1.0, mx.inf, 2.0]]])),
        ):
            stats.add(logits, reference)
            stats.add(ref, ref)
            self.assertTrue(math.isnan(stats.error))
            self.assertIn("nan", str(stats))
        self.assertEqual(stats.bad, [2, 1])
        self.assertIn("not finite: 2 positions, reference 1", str(stats))


if __name__ == "__main__":
    unittest.main()
