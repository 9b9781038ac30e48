# Copyright © 2026 Apple Inc.
"""The DeepSeek-V4 chat format a loaded checkpoint gets: the original's, or
0731's where the checkpoint says so (its config's dspark_* fields, its own
encoding/encoding_dsv4.py), through mlx_lm.utils.load_tokenizer as the
commands and the server load it."""

import json
import tempfile
import unittest
from pathlib import Path

from long_decode import make_tokenizer
from mlx_lm.utils import load_tokenizer

from mlx_lm.chat_templates.deepseek_v4 import (
    REASONING_EFFORT_BEYOND,
    REASONING_EFFORT_HIGH,
    bos_token,
    special_tokens,
)

MESSAGES = [{"role": "user", "content": "Hi"}]
TAIL = "<｜User｜>Hi<｜Assistant｜><think>"


class TestDeepseekV4ChatFormat(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        cls.tokenizer_files = Path(cls._tmp.name) / "tokenizer"
        make_tokenizer(cls.tokenizer_files, 400, special_tokens, chat_template=None)

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def checkpoint(self, name, config, encoder=None):
        path = Path(self._tmp.name) / name
        path.mkdir()
        for f in self.tokenizer_files.iterdir():
            (path / f.name).write_bytes(f.read_bytes())
        config = {"model_type": "deepseek_v4", **config}
        (path / "config.json").write_text(json.dumps(config))
        if encoder is not None:
            (path / "encoding").mkdir()
            (path / "encoding" / "encoding_dsv4.py").write_text(encoder)
        return load_tokenizer(path)

    def render(self, tokenizer, **kwargs):
        return tokenizer.apply_chat_template(
            MESSAGES, add_generation_prompt=True, tokenize=False, **kwargs
        )

    def test_each_checkpoint_gets_its_format(self):
        original = self.checkpoint("original", {})
        dspark = self.checkpoint("0731", {"dspark_block_size": 5})
        # The checkpoint's own encoder wins over its config (read, not run).
        encoder = "raise SystemExit('executed')\nREASONING_EFFORT_MAX = ''\n"
        own = self.checkpoint("own-encoder", {"dspark_block_size": 5}, encoder)
        for tokenizer, effort, prompt in [
            (original, "max", REASONING_EFFORT_HIGH),
            (original, "high", ""),
            (original, None, ""),
            (dspark, "max", REASONING_EFFORT_BEYOND),
            (dspark, "high", REASONING_EFFORT_HIGH),
            (dspark, "medium", ""),
            (dspark, None, ""),
            (own, "max", REASONING_EFFORT_HIGH),
        ]:
            with self.subTest(effort=effort, path=tokenizer.name_or_path):
                kwargs = {} if effort is None else {"reasoning_effort": effort}
                self.assertEqual(
                    self.render(tokenizer, **kwargs), bos_token + prompt + TAIL
                )
        # --chat-template-config / chat_template_kwargs name the format.
        out = self.render(dspark, reasoning_effort="max", chat_format="original")
        self.assertEqual(out, bos_token + REASONING_EFFORT_HIGH + TAIL)


if __name__ == "__main__":
    unittest.main()
