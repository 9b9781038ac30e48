# Copyright © 2026 Apple Inc.

import json
import tempfile
import unittest
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.utils import load_model

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


class Model(nn.Module):
    def __init__(self, args: Args):
        super().__init__()
        self.proj = nn.Linear(args.hidden_size, args.hidden_size)
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)


class TestWeightChecks(unittest.TestCase):

    def load(self, weights):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp)
            config = {"hidden_size": 4, "rms_norm_eps": 1e-6}
            (path / "config.json").write_text(json.dumps(config))
            mx.save_safetensors(str(path / "model.safetensors"), weights)
            return load_model(path, get_model_classes=lambda config: (Model, Args))

    def test_every_weight_at_fault_is_named_in_one_error(self):
        weights = {
            "proj.weight": mx.zeros((4, 3)),
            "proj.bias": mx.zeros((5,)),
            "norm.weight": mx.ones((4,)),
            "head.weight": mx.zeros((2, 2)),
        }
        with self.assertRaises(ValueError) as e:
            self.load(weights)
        self.assertEqual(
            str(e.exception).splitlines(),
            [
                "Cannot load 3 weights:",
                "  head.weight: no parameter of the model takes it",
                "  proj.bias: has shape (5,), not (4,)",
                "  proj.weight: has shape (4, 3), not (4, 4)",
            ],
        )

    def test_parameters_without_a_weight_are_named_once_the_weights_fit(self):
        with self.assertRaises(ValueError) as e:
            self.load({"proj.weight": mx.zeros((4, 4))})
        self.assertEqual(
            str(e.exception).splitlines(),
            [
                "2 parameters of the model have no weight:",
                "  norm.weight: no weight fills it",
                "  proj.bias: no weight fills it",
            ],
        )
        weights = {"proj.weight": mx.ones((4, 4)), "proj.bias": mx.ones((4,))}
        weights["norm.weight"] = mx.full((4,), 2.0)
        model, _ = self.load(weights)
        loaded = dict(tree_flatten(model.parameters()))
        self.assertTrue(all(mx.array_equal(loaded[k], v) for k, v in weights.items()))


if __name__ == "__main__":
    unittest.main()
