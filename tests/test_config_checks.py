# Copyright © 2026 Apple Inc.

import copy
import dataclasses
import json
import tempfile
import unittest
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from mlx_lm.models.base import BaseModelArgs
from mlx_lm.utils import _get_classes, load_model

CONFIGS = Path(__file__).parent / "configs"


@dataclass
class Args(BaseModelArgs):
    hidden_size: int
    rms_norm_eps: float
    head_dim: Optional[int] = None


class TestConfigChecks(unittest.TestCase):

    def test_strings_in_number_fields_name_each_field(self):
        params = {"hidden_size": "4", "rms_norm_eps": "1e-6", "head_dim": "16"}
        with self.assertRaises(ValueError) as e:
            Args.from_dict(params)
        for named in (
            "`hidden_size` '4' is not an integer",
            "`rms_norm_eps` '1e-6' is not a number",
            "`head_dim` '16' is not an integer",
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

    def test_lists_bools_and_dicts_in_number_fields_arrive_unchanged(self):
        params = {"hidden_size": [4, 8], "rms_norm_eps": {"a": 1}, "head_dim": False}
        args = Args.from_dict(params)
        self.assertEqual(
            (args.hidden_size, args.rms_norm_eps, args.head_dim),
            ([4, 8], {"a": 1}, False),
        )


def shrink(config, layers=6):
    """A tiny copy of ``config``: few layers, small sizes, the rest kept."""
    config = copy.deepcopy(config)
    parts = [config, config.get("text_config")]
    for part in [p for p in parts if isinstance(p, dict)]:
        n = part.get("num_hidden_layers")
        for key, value in list(part.items()):
            # One value a layer: keep the first layers' values.
            if n and isinstance(value, list) and len(value) == n:
                part[key] = value[:layers]
        if n:
            part["num_hidden_layers"] = layers
        for key, size in TINY.items():
            if part.get(key) is not None:
                part[key] = [size] * layers if isinstance(part[key], list) else size
        if "hidden_size" in part:
            part["vocab_size"] = TINY["vocab_size"]
        # Longrope has one factor a rotary pair, so the head keeps its size.
        if factors := (part.get("rope_scaling") or {}).get("long_factor"):
            part["hidden_size"] = part["num_attention_heads"] * 2 * len(factors)
    return config


TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "vocab_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_experts": 4,
    "n_routed_experts": 4,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "experts_per_token": 2,
    "kv_lora_rank": 16,
    "q_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
    "first_k_dense_replace": 1,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "sliding_window": 8,
    "max_position_embeddings": 256,
}


class TestPublishedConfigs(unittest.TestCase):

    def check_builds(self, config):
        model_class, args_class = _get_classes(config)
        model = model_class(args_class.from_dict(config))
        logits = model(mx.array([[1, 2, 3]]))
        self.assertTrue(mx.all(mx.isfinite(logits)).item())
        return model

    def test_every_published_config_loads_as_written_and_builds_tiny(self):
        # tests/configs: config.json files of the families users run, each
        # named for the Hugging Face repository it comes from.
        paths = sorted(CONFIGS.glob("*.json"))
        self.assertEqual(len(paths), 21)
        for path in paths:
            with self.subTest(config=path.stem):
                config = json.loads(path.read_text())
                model_class, args_class = _get_classes(config)
                args = args_class.from_dict(config)
                for field in dataclasses.fields(args):
                    if field.name in config:
                        value = getattr(args, field.name)
                        self.assertEqual(value, config[field.name], field.name)
                self.check_builds(shrink(config))

    def test_per_layer_lists_in_number_fields_load_and_build(self):
        # Configs give one value a layer in fields declared as numbers, and
        # the models read them: Step-3.5's rope_theta, Gemma 3n's
        # intermediate_size, Hunyuan's moe_topk and num_shared_expert.
        step3p5 = {
            "model_type": "step3p5",
            "hidden_size": 64,
            "num_hidden_layers": 4,
            "vocab_size": 128,
            "num_attention_heads": 4,
            "num_attention_groups": 2,
            "head_dim": 16,
            "intermediate_size": 128,
            # Step-3.5-Flash's own: 5e6 on full attention, 1e4 on the window.
            "rope_theta": [5000000.0, 10000.0, 10000.0, 10000.0],
            "sliding_window": 8,
            "layer_types": ["full_attention"] + ["sliding_attention"] * 3,
            "partial_rotary_factors": [0.5, 1.0, 1.0, 1.0],
            "attention_other_setting": {
                "num_attention_heads": 8,
                "num_attention_groups": 2,
            },
            "moe_num_experts": 4,
            "moe_top_k": 2,
            "moe_intermediate_size": 32,
            "share_expert_dim": 32,
            "moe_layers_enum": "1,2,3",
        }
        self.check_builds(step3p5)

        text = {
            "model_type": "gemma3n",
            "hidden_size": 32,
            "num_hidden_layers": 4,
            "intermediate_size": [64, 64, 96, 64],
            "num_attention_heads": 2,
            "head_dim": 16,
            "rms_norm_eps": 1e-5,
            "vocab_size": 64,
            "num_key_value_heads": 1,
            "num_kv_shared_layers": 2,
            "vocab_size_per_layer_input": 64,
            "sliding_window": 8,
            "max_position_embeddings": 128,
            "rope_local_base_freq": 10000.0,
            "rope_theta": 1000000.0,
            "final_logit_softcapping": 30.0,
            "layer_types": ["sliding_attention", "full_attention"] * 2,
            "activation_sparsity_pattern": [0.95, 0.0, 0.0, 0.0],
            "hidden_size_per_layer_input": 8,
            "altup_num_inputs": 2,
            "altup_coef_clip": 120.0,
            "altup_correct_scale": True,
            "altup_active_idx": 0,
            "laurel_rank": 4,
        }
        model = self.check_builds({"model_type": "gemma3n", "text_config": text})
        layers = model.model.language_model.layers
        self.assertEqual(
            [layer.mlp.gate_proj.weight.shape[0] for layer in layers],
            text["intermediate_size"],
        )

        hunyuan = {
            "model_type": "hunyuan",
            "hidden_size": 64,
            "attention_bias": False,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_hidden_layers": 4,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "vocab_size": 128,
            "moe_topk": [2, 1, 2, 1],
            "num_experts": 2,
            "num_shared_expert": [1, 1, 1, 1],
            "use_mixed_mlp_moe": True,
            "use_qk_norm": True,
            "rope_scaling": {"alpha": 1000.0, "factor": 1.0, "type": "dynamic"},
            "use_cla": False,
            "cla_share_factor": 2,
        }
        self.check_builds(hunyuan)


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
