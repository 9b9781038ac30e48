# Copyright © 2026 Apple Inc.

import unittest
from dataclasses import dataclass
from typing import Optional

from mlx_lm.models.base import BaseModelArgs


@dataclass
class Args(BaseModelArgs):
    hidden_size: int
    rms_norm_eps: float
    head_dim: Optional[int] = None


class TestConfigChecks(unittest.TestCase):

    def test_wrong_types_name_each_field(self):
        params = {"hidden_size": "4", "rms_norm_eps": [1e-6], "head_dim": True}
        with self.assertRaises(ValueError) as e:
            Args.from_dict(params)
        for named in (
            "`hidden_size` '4' is not an integer",
            "`rms_norm_eps` [1e-06] is not a number",
            "`head_dim` True is not an integer",
        ):
            self.assertIn(named, str(e.exception))

    def test_right_types_and_unknown_keys_load(self):
        args = Args.from_dict(
            {"hidden_size": 4, "rms_norm_eps": 1, "head_dim": None, "other": "x"}
        )
        self.assertEqual((args.hidden_size, args.rms_norm_eps), (4, 1))
        # A fraction where an int is annotated loads: configs ship them.
        self.assertEqual(
            Args.from_dict({"hidden_size": 0.5, "rms_norm_eps": 1e-6}).hidden_size, 0.5
        )


if __name__ == "__main__":
    unittest.main()
