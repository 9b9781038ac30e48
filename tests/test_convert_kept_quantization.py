# Copyright © 2026 Apple Inc.

import contextlib
import importlib
import io
import json
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from mlx_lm.convert import convert
from mlx_lm.utils import _get_classes, load

LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "vocab_size": 64,
    "tie_word_embeddings": False,
}


def make_folder(path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    path.mkdir()
    model_class, args_class = _get_classes(LLAMA)
    model = model_class(args_class.from_dict(LLAMA))
    mx.save_safetensors(
        str(path / "model.safetensors"), dict(tree_flatten(model.parameters()))
    )
    (path / "config.json").write_text(json.dumps(LLAMA))
    words = {f"w{i}": i for i in range(64)}
    tokenizer = Tokenizer(models.WordLevel(words, "w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer).save_pretrained(path)
    return path


class TestConvertKeptQuantization(unittest.TestCase):

    def test_quantizing_a_quantized_folder_says_what_it_keeps(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = make_folder(Path(tmp) / "model")
            q4 = Path(tmp) / "q4"
            with contextlib.redirect_stdout(io.StringIO()) as out:
                convert(str(path), mlx_path=str(q4), quantize=True)
            self.assertNotIn("already quantized", out.getvalue())
            with contextlib.redirect_stdout(io.StringIO()) as out:
                convert(
                    str(q4), mlx_path=str(Path(tmp) / "q8"), quantize=True, q_bits=8
                )
            model = load(str(Path(tmp) / "q8"))[0]
        self.assertIn(
            "Layers already quantized (4-bit affine) keep their quantization",
            out.getvalue(),
        )
        self.assertEqual(model.model.layers[0].self_attn.q_proj.bits, 4)

    def test_a_quantized_layer_without_a_mode_is_named_by_its_class(self):
        # As prism_hadamard_qwen35's HadamardQuantizedLinear: bits, scales and
        # no mode.
        class Packed(nn.Module):
            def __init__(self):
                super().__init__()
                self.bits = 2
                self.weight = mx.zeros((64, 8), mx.uint32)
                self.scales = mx.zeros((64, 1))

        def load_packed(*args, **kwargs):
            model, *rest = load(*args, **kwargs)
            model.model.layers[0].self_attn.q_proj = Packed()
            return (model, *rest)

        with tempfile.TemporaryDirectory() as tmp:
            path = make_folder(Path(tmp) / "model")
            # mlx_lm.convert (the module, which the function of its name hides).
            module = importlib.import_module("mlx_lm.convert")
            with mock.patch.object(module, "load", load_packed):
                with contextlib.redirect_stdout(io.StringIO()) as out:
                    convert(str(path), mlx_path=str(Path(tmp) / "q"), quantize=True)
        self.assertIn("Layers already quantized (2-bit Packed)", out.getvalue())


if __name__ == "__main__":
    unittest.main()
