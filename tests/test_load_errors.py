# Copyright © 2026 Apple Inc.

import json
import sys
import tempfile
import unittest
from pathlib import Path

from test_deepseek_v4 import make_tiny_model_folder, make_tiny_tokenizer

from mlx_lm import load
from mlx_lm.chat_templates.deepseek_v4 import bos_token, eos_token

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from long_decode import make_model_folder  # noqa: E402


class TestBadModelFolders(unittest.TestCase):

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = Path(self._tmp.name)

    def tearDown(self):
        self._tmp.cleanup()

    def test_truncated_safetensors_name_the_file(self):
        path = make_tiny_model_folder(self.tmp / "model")
        weights = path / "model.safetensors"
        with open(weights, "r+b") as f:
            f.truncate(weights.stat().st_size // 2)
        with self.assertRaisesRegex(ValueError, "model.safetensors"):
            load(str(path))

    def test_tokenizer_without_the_chat_tokens_names_them(self):
        path = make_tiny_model_folder(self.tmp / "model")
        make_tiny_tokenizer(path, 300, special_tokens=[bos_token, eos_token])
        with self.assertRaisesRegex(ValueError, "<｜User｜>.*deepseek_v4"):
            load(str(path))

    def test_mistyped_config_values_name_the_field(self):
        for model_type, key in (
            ("deepseek_v4", "num_attention_heads"),
            ("qwen3_5", "hidden_size"),
        ):
            with self.subTest(model_type=model_type):
                path = make_model_folder(self.tmp / model_type, model_type)
                config = json.loads((path / "config.json").read_text())
                (config.get("text_config") or config)[key] = "4"
                (path / "config.json").write_text(json.dumps(config))
                with self.assertRaisesRegex(
                    ValueError, f"`{key}` '4' is not an integer"
                ):
                    load(str(path))


if __name__ == "__main__":
    unittest.main()
