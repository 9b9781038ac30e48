# Copyright © 2026 Apple Inc.

import json
import tempfile
import unittest
from pathlib import Path

from mlx_lm.utils import load_tokenizer
from test_deepseek_v4_chat import ABSOLUTE, BEYOND, EXPECTED, HI

from mlx_lm.chat_templates.deepseek_v4 import (
    assistant_token,
    bos_token,
    eos_token,
    thinking_end_token,
    thinking_start_token,
    user_token,
)


def make_checkpoint(path, config=None, encoder=None):
    """A checkpoint's tokenizer that names DeepSeek-V4's encoder and DSML
    parser (as deepseek_v4's TOKENIZER_DEFAULTS do), with its config.json
    and its own encoding/encoding_dsv4.py if given."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = [
        bos_token,
        eos_token,
        user_token,
        assistant_token,
        thinking_start_token,
        thinking_end_token,
        "Hi",
    ]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, "Hi"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=bos_token, eos_token=eos_token
    ).save_pretrained(path)
    tokenizer_config = json.loads((path / "tokenizer_config.json").read_text())
    tokenizer_config["chat_template_type"] = "deepseek_v4"
    tokenizer_config["tool_parser_type"] = "deepseek_v4"
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    if config is not None:
        (path / "config.json").write_text(json.dumps(config))
    if encoder is not None:
        (path / "encoding").mkdir()
        (path / "encoding" / "encoding_dsv4.py").write_text(encoder)
    return path


class TestDeepseekV4ChatCheckpoints(unittest.TestCase):

    def test_each_checkpoint_gets_its_chat_format(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        dspark = {"dspark_block_size": 5}
        # Its own encoder wins over its config; it is read, never run.
        run = "raise SystemExit('executed')\n"
        # (config, encoder, the prompt of reasoning_effort "max")
        cases = [
            (None, None, ABSOLUTE),
            (dspark, None, BEYOND),
            ({}, f"{run}PROMPT = {BEYOND!r}", BEYOND),
            (dspark, f"{run}REASONING_EFFORT_MAX = ''", ABSOLUTE),
            ({"dspark_markov_rank": 256}, "# another encoder", BEYOND),
        ]
        turn = EXPECTED["one user turn, thinking"].removeprefix(bos_token)
        for i, (config, encoder, prompt) in enumerate(cases):
            with self.subTest(config=config, encoder=encoder):
                path = make_checkpoint(Path(tmp.name) / str(i), config, encoder)
                tokenizer = load_tokenizer(path)
                out = tokenizer.apply_chat_template(
                    [HI],
                    add_generation_prompt=True,
                    tokenize=False,
                    reasoning_effort="max",
                )
                self.assertEqual(out, bos_token + prompt + turn)
        # chat_template_kwargs / --chat-template-config name another.
        out = tokenizer.apply_chat_template(
            [HI],
            add_generation_prompt=True,
            tokenize=False,
            chat_format="original",
            reasoning_effort="max",
        )
        self.assertEqual(out, bos_token + ABSOLUTE + turn)


if __name__ == "__main__":
    unittest.main()
