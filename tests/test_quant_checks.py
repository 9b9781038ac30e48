# Copyright © 2026 Apple Inc.

import contextlib
import io
import json
import re
import tempfile
import unittest
from itertools import product
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from mlx_lm.convert import QUANT_RECIPES, convert, mixed_quant_predicate_builder
from mlx_lm.generate import generate
from mlx_lm.models.switch_layers import QuantizedSwitchLinear
from mlx_lm.utils import (
    _get_classes,
    load,
    load_model,
    quantize_model,
    save_config,
    save_model,
)

BASE = {
    "hidden_size": 64,
    "num_hidden_layers": 8,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "vocab_size": 64,
    "max_position_embeddings": 128,
    "tie_word_embeddings": False,
}
CONFIGS = {
    "llama": dict(BASE, model_type="llama"),
    "qwen3": dict(BASE, model_type="qwen3"),
    "qwen3_moe": dict(
        BASE,
        model_type="qwen3_moe",
        num_experts=4,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        moe_intermediate_size=64,
        norm_topk_prob=True,
    ),
}
TOKENS = mx.array([[3, 9, 27, 17, 40, 2, 61, 5]])


def quantized_layers(model):
    """(mode, group_size, bits) of every quantized layer, by path."""
    kinds = (nn.QuantizedLinear, nn.QuantizedEmbedding, QuantizedSwitchLinear)
    return {
        path: (m.mode, m.group_size, m.bits)
        for path, m in model.named_modules()
        if isinstance(m, kinds)
    }


def save_tokenizer(path, vocab_size):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(
        models.WordLevel({f"w{i}": i for i in range(vocab_size)}, "w0")
    )
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="w0", eos_token="w1"
    ).save_pretrained(path)


class TestQuantChecks(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        cls.path = Path(cls._tmp.name)
        for seed, (model_type, config) in enumerate(CONFIGS.items()):
            mx.random.seed(seed)
            model_class, args_class = _get_classes(config)
            model = model_class(args_class.from_dict(config))
            mx.eval(model.parameters())
            save_model(cls.path / model_type, model)
            save_config(dict(config), cls.path / model_type / "config.json")
            save_tokenizer(cls.path / model_type, config["vocab_size"])

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def quantized(self, model_type, name, predicate, group_size=None, bits=None):
        """A folder of ``model_type`` quantized by ``quantize_model`` with
        ``predicate``, and the quantized model."""
        model, config = load_model(self.path / model_type)
        model, config = quantize_model(
            model, config, group_size, bits, quant_predicate=predicate
        )
        path = self.path / name
        save_model(path, model, donate_model=False)
        save_config(config, path / "config.json")
        return path, model

    def test_every_quant_predicate_recipe_loads_and_generates(self):
        for model_type, recipe in product(CONFIGS, QUANT_RECIPES):
            with self.subTest(model_type=model_type, recipe=recipe):
                path = self.path / f"{model_type}-{recipe}"
                with contextlib.redirect_stdout(io.StringIO()):
                    convert(
                        str(self.path / model_type),
                        str(path),
                        quantize=True,
                        quant_predicate=recipe,
                    )
                entries = json.loads((path / "config.json").read_text())
                entries = entries["quantization"]
                # As 0.32.2 writes them: no group size of their own.
                self.assertEqual(
                    entries["lm_head"],
                    {
                        "group_size": None,
                        "bits": 6 if recipe != "mixed_3_4" else 4,
                        "mode": "affine",
                    },
                )
                model, tokenizer = load(str(path))
                layers = quantized_layers(model)
                for name, entry in entries.items():
                    if isinstance(entry, dict):
                        self.assertEqual(layers[name][2], entry["bits"], name)

                # The same weights quantized in memory as convert does.
                reference, _ = load_model(self.path / model_type)
                predicate = mixed_quant_predicate_builder(recipe, reference, None)
                with contextlib.redirect_stdout(io.StringIO()):
                    quantize_model(reference, {}, None, None, quant_predicate=predicate)
                self.assertTrue(mx.array_equal(model(TOKENS), reference(TOKENS)))
                text = generate(model, tokenizer, "w5 w9 w12", max_tokens=4)
                self.assertIsInstance(text, str)

    def test_mixed_modes_as_the_deepseek_v4_uploads_have_them_load(self):
        # Affine 8 bits, group 64 by default; per-module entries give the
        # experts mxfp4 and attention and the shared parts mxfp8.
        def predicate(path, module):
            if ".switch_mlp." in path:
                return {"group_size": 32, "bits": 4, "mode": "mxfp4"}
            if ".self_attn." in path:
                return {"group_size": 32, "bits": 8, "mode": "mxfp8"}
            return True

        with contextlib.redirect_stdout(io.StringIO()):
            path, expected = self.quantized("qwen3_moe", "community", predicate, 64, 8)
        model, config = load_model(path)
        layers = quantized_layers(model)
        self.assertEqual(
            layers["model.layers.0.mlp.switch_mlp.up_proj"], ("mxfp4", 32, 4)
        )
        self.assertEqual(layers["model.layers.7.self_attn.o_proj"], ("mxfp8", 32, 8))
        self.assertEqual(layers["model.layers.3.mlp.gate"], ("affine", 64, 8))
        self.assertEqual(layers["lm_head"], ("affine", 64, 8))
        self.assertTrue(mx.array_equal(model(TOKENS), expected(TOKENS)))

    def test_entries_the_weights_contradict_are_named(self):
        def predicate(path, module):
            if path.endswith("down_proj"):
                return {"group_size": 32, "bits": 4, "mode": "mxfp4"}
            return {"group_size": 32, "bits": 4, "mode": "affine"}

        with contextlib.redirect_stdout(io.StringIO()):
            path, _ = self.quantized("llama", "contradicted", predicate)
        config = json.loads((path / "config.json").read_text())
        entries = config["quantization"]
        # Group size 64 on weights quantized at 32, nvfp4 (group 16) on mxfp4
        # weights, affine on mxfp4 weights: the last has the shapes of the
        # weights, so only the check stops it giving wrong numbers.
        entries["model.layers.0.self_attn.q_proj"]["group_size"] = 64
        entries["model.layers.1.mlp.down_proj"] = {"bits": 4, "mode": "nvfp4"}
        entries["model.layers.2.mlp.down_proj"]["mode"] = "affine"
        (path / "config.json").write_text(json.dumps(config))
        for strict in (True, False):
            with self.assertRaises(ValueError) as e:
                load_model(path, strict=strict)
            lines = str(e.exception).splitlines()
            self.assertEqual(lines[0], "Invalid config.json:")
            self.assertEqual(len(lines), 4)
            for name, saved in (
                (
                    "model.layers.0.self_attn.q_proj",
                    "group_size 32 and bits 4 (affine)",
                ),
                (
                    "model.layers.1.mlp.down_proj",
                    "group_size 32 and bits 4 (not affine)",
                ),
                (
                    "model.layers.2.mlp.down_proj",
                    "group_size 32 and bits 4 (not affine)",
                ),
            ):
                self.assertTrue(
                    any(
                        line.startswith(f"  `quantization.{name}` ")
                        and line.endswith(
                            f"the weights of {name} were quantized with {saved}"
                        )
                        for line in lines
                    ),
                    (name, lines),
                )

    def test_entries_mlx_cannot_quantize_with_are_named(self):
        with contextlib.redirect_stdout(io.StringIO()):
            path, _ = self.quantized("llama", "unbuildable", lambda p, m: True)
        config = json.loads((path / "config.json").read_text())
        bad = {
            "model.layers.0.self_attn.q_proj": (
                {"group_size": 64, "bits": 8, "mode": "mxfp8"},
                "mxfp8 quantization requires group size 32 but got 64",
            ),
            "model.layers.1.self_attn.k_proj": (
                {"group_size": 64, "bits": 4, "mode": "fp7"},
                "Invalid quantization mode 'fp7'",
            ),
            "model.layers.2.mlp.up_proj": (
                {"group_size": 64, "bits": 7},
                "The requested number of bits 7 is not supported",
            ),
            "model.layers.3.mlp.gate_proj": (
                {"group_size": 0, "bits": 4},
                "group_size 0 is not a positive integer",
            ),
        }
        for name, (entry, _) in bad.items():
            config["quantization"][name] = entry
        (path / "config.json").write_text(json.dumps(config))
        with self.assertRaises(ValueError) as e:
            load_model(path)
        message = str(e.exception)
        for name, (_, why) in bad.items():
            self.assertRegex(message, rf"`quantization\.{re.escape(name)}` .*{why}")


if __name__ == "__main__":
    unittest.main()
