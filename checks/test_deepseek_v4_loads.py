# Copyright © 2026 Apple Inc.
"""DeepSeek-V4 loads through the fork-track loader PRs: what
tests/test_deepseek_v4.py checked of config-checks (every bad field and weight
named), quant-checks (a per-module entry the weights contradict) and mtp (the
MTP block of DeepSeek's fp8 release) before the model PR stood alone."""

import copy
import dataclasses
import re
import tempfile
import unittest
from pathlib import Path
from typing import Optional

import mlx.core as mx
from dsv4_fixtures import (
    CONFIG,
    FP8_CONFIG,
    TINY_CONFIG,
    _community_predicate,
    _dequantized,
    _quantized_layers,
    _random_weights,
    _release_tensors,
    _write,
    assert_load_names_every_key,
)
from mlx.utils import tree_flatten

from mlx_lm.models import deepseek_v4
from mlx_lm.utils import load_model, quantize_model, save_config

try:
    import torch
except ImportError:
    torch = None


class TestConfigFields(unittest.TestCase):

    def test_number_fields_of_the_wrong_type_are_named(self):
        kinds = (int, Optional[int], float, Optional[float])
        for field in dataclasses.fields(deepseek_v4.ModelArgs):
            for value in ("abc", "4") if field.type in kinds else ():
                with self.subTest(field=field.name, value=value):
                    config = {**TINY_CONFIG, field.name: value}
                    with self.assertRaises(ValueError) as e:
                        deepseek_v4.ModelArgs.from_dict(config)
                    problems = [p.strip() for p in str(e.exception).splitlines()[1:]]
                    self.assertEqual(len(problems), 1)
                    self.assertTrue(problems[0].startswith(f"`{field.name}` "))


class TestBadCheckpoints(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.addClassCleanup(cls.tmp.cleanup)
        cls.path = Path(cls.tmp.name)
        model = deepseek_v4.Model(deepseek_v4.ModelArgs.from_dict(CONFIG))
        model.load_weights(list(_random_weights(CONFIG).items()))
        model, cls.config = quantize_model(
            model, dict(CONFIG), 64, 8, quant_predicate=_community_predicate
        )
        cls.weights = dict(tree_flatten(model.parameters()))

    def _save(self, name, weights, config):
        path = self.path / name
        path.mkdir()
        mx.save_safetensors(str(path / "model.safetensors"), weights)
        save_config(copy.deepcopy(config), path / "config.json")
        return path

    def test_weights_no_parameter_takes_are_named(self):
        # config-checks: every key load_weights would refuse, one line each.
        unmappable = dict(self.weights)
        unmappable["model.layers.0.attn.wo_c.weight"] = mx.zeros((2, 2))
        unmappable["model.layers.1.ffn.experts.w4.weight"] = mx.zeros((2, 2))
        path = self._save("unmappable", unmappable, self.config)
        assert_load_names_every_key(self, path, set(unmappable) - set(self.weights))

    def test_quantization_entries_the_weights_contradict_are_named(self):
        # quant-checks: an mxfp8 entry over affine 8-bit weights.
        wq_a = "model.layers.0.attn.wq_a"
        entry = {"group_size": 64, "bits": 8, "mode": "mxfp8"}
        quantization = {"group_size": 64, "bits": 8, wq_a: entry}
        path = self._save(
            "quantization", self.weights, {**CONFIG, "quantization": quantization}
        )
        assert_load_names_every_key(self, path, [f"quantization.{wq_a}"])

    @unittest.skipIf(torch is None, "needs torch, safetensors and transformers")
    def test_release_weights_the_model_cannot_take_are_named(self):
        unknown = _release_tensors(_random_weights(CONFIG))
        unknown["layers.0.attn.unknown.weight"] = torch.zeros(2, 2)
        unknown["layers.3.attn_norm.weight"] = torch.ones(255)
        keys = (
            "layers.0.attn.unknown.weight: no parameter",
            "layers.3.attn_norm.weight: has shape (255,)",
        )
        _write(
            self.path / "unknown", unknown, dict(CONFIG, quantization_config=FP8_CONFIG)
        )
        assert_load_names_every_key(self, self.path / "unknown", keys)


@unittest.skipIf(torch is None, "needs torch, safetensors and transformers")
class TestMTPRelease(unittest.TestCase):

    def test_the_block_of_the_fp8_release_loads_packed(self):
        # mtp: the block is fp8 as the layers are, its projections too.
        weights = _random_weights({**CONFIG, "mtp": True})
        self.assertIn("mtp.0.e_proj.weight", weights)
        tensors = {
            re.sub(r"^(mtp\.\d+)\.hc_head\.", r"\1.hc_head_", k): v
            for k, v in _release_tensors(weights).items()
        }
        with tempfile.TemporaryDirectory() as tmp:
            path, reference = Path(tmp) / "release", Path(tmp) / "dequantized"
            config = dict(CONFIG, quantization_config=dict(FP8_CONFIG))
            _write(path, tensors, config)
            _write(reference, _dequantized(tensors), CONFIG)
            model, _ = load_model(path, model_config={"mtp": True})
            expected, _ = load_model(reference, model_config={"mtp": True})
        modes = _quantized_layers(model)
        for name in ("e_proj", "h_proj", "attn.wq_a", "ffn.shared_experts.up_proj"):
            self.assertEqual(modes[f"mtp.0.{name}"], "mxfp8")
        self.assertEqual(modes["mtp.0.ffn.switch_mlp.up_proj"], "mxfp4")
        reference_weights = dict(tree_flatten(expected.parameters()))
        for name, module in model.named_modules():
            if name.startswith("mtp.") and hasattr(module, "scales"):
                w = mx.dequantize(
                    module.weight,
                    module.scales,
                    group_size=module.group_size,
                    bits=module.bits,
                    mode=module.mode,
                    dtype=mx.float32,
                )
                self.assertTrue(mx.array_equal(w, reference_weights[f"{name}.weight"]))


if __name__ == "__main__":
    unittest.main()
