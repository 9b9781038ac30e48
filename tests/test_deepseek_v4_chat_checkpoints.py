# Copyright © 2026 Apple Inc.

import json
import tempfile
import unittest
from pathlib import Path

from test_deepseek_v4_chat import CASES, EXPECTED, HI

from mlx_lm.chat_templates.deepseek_v4 import (
    apply_chat_template,
    assistant_token,
    bos_token,
    eos_token,
    thinking_end_token,
    thinking_start_token,
    user_token,
)
from mlx_lm.utils import load_tokenizer

# DeepSeek's effort prompts, byte for byte: the original's "max" is 0731's
# "high"; 0731's "max" (encoding_dsv4.py of V4-Flash-0731 and later).
ABSOLUTE = "Reasoning Effort: Absolute maximum with no shortcuts permitted.\nYou MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\nExplicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n"
BEYOND = "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\nYou MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively decompose the problem into its most fundamental components, trace every causal chain to its root, and resolve the underlying cause rather than any surface symptom.\nDo not stop reasoning until you have independently verified the solution from multiple angles and are certain that no assumption remains unchecked and no error remains undiscovered.\n\n"

# 0731's encoder is the original's but for the effort prompts (the two
# releases' encoding/tests/ are the same files): in thinking mode the prompt
# of the effort goes right after the BOS, "low" adding none.
PROMPTS_0731 = {"low": "", "high": ABSOLUTE, "max": BEYOND}
CASES_0731 = [
    "one user turn, thinking",
    "one user turn, chat",
    "system and user",
    "tool call and result",
    "earlier reasoning dropped",
    "developer message",
    "latest reminder after the user turn",
    "continue the final message",
    "action task",
]


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

    def test_0731_conversations_render_as_deepseeks_encoder(self):
        for name, messages, kwargs in CASES:
            if name not in CASES_0731:
                continue
            thinking = kwargs.get("enable_thinking", True)
            for effort, prompt in PROMPTS_0731.items():
                with self.subTest(name, reasoning_effort=effort):
                    options = {"add_generation_prompt": True, **kwargs}
                    options["reasoning_effort"] = effort
                    out = apply_chat_template(messages, chat_format="0731", **options)
                    want = EXPECTED[name]
                    if thinking:
                        want = bos_token + prompt + want.removeprefix(bos_token)
                    self.assertEqual(out, want)

    def test_invalid_chat_format_or_effort_raises_naming_it(self):
        for field, kwargs in (
            ("chat_format", {"chat_format": "0730"}),
            (
                "reasoning_effort 'x' for the 0731",
                {"chat_format": "0731", "reasoning_effort": "x"},
            ),
        ):
            with self.subTest(field):
                with self.assertRaisesRegex(ValueError, field):
                    apply_chat_template([HI], **kwargs)

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
