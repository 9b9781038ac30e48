# Copyright © 2026 Apple Inc.

import json
import tempfile
import unittest
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

from test_deepseek_v4_chat import ASK, CALLS, EXPECTED, HI, TOOLS, TOOLS_BLOCK, tool

from mlx_lm.chat_templates.deepseek_v4 import (
    apply_chat_template,
    assistant_token,
    bos_token,
    eos_token,
    thinking_end_token,
    thinking_start_token,
    user_token,
)
from mlx_lm.generate import TextStateMachine, make_text_state_machine
from mlx_lm.server import CompletionRequest, ResponseGenerator, ToolCallFormatter
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.utils import load_tokenizer

DSML = "｜DSML｜"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def make_checkpoint(path):
    """A checkpoint's tokenizer that names DeepSeek-V4's encoder and DSML
    parser, as deepseek_v4's TOKENIZER_DEFAULTS do."""
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
    config = json.loads((path / "tokenizer_config.json").read_text())
    config["chat_template_type"] = "deepseek_v4"
    config["tool_parser_type"] = "deepseek_v4"
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


class TestDeepseekV4ChatServer(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        cls.tokenizer = load_tokenizer(make_checkpoint(Path(cls._tmp.name)))

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def reply(self, text, size):
        """The content and the calls of a reply streamed in chunks of size,
        split and parsed as mlx_lm.server does."""
        state = make_text_state_machine(self.tokenizer).make_state()
        texts = {"normal": "", "tool": ""}
        for i in range(0, len(text), size):
            state, segments = TextStateMachine.split(state, text[i : i + size])
            for s, t in segments:
                texts[s] += t
        formatter = ToolCallFormatter(self.tokenizer.tool_parser, [WEATHER])
        calls = formatter([texts["tool"]] if texts["tool"] else [])
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in calls]
        return texts["normal"], calls

    def test_calls_written_slightly_damaged_are_found(self):
        invoke = (
            f'<{DSML}invoke name="get_weather">\n'
            f'<{DSML}parameter name="city" string="true">Seoul</{DSML}parameter>\n'
            f"</{DSML}invoke>"
        )
        end = f"\n</{DSML}tool_calls>"
        # (reply, its content)
        cases = [
            (f"\n\n<{DSML}tool_calls>\n{invoke}{end}", ""),
            # No tool_calls wrapper, or not its end either.
            (f"Checking.\n{invoke}{end}", "Checking.\n"),
            (f"Checking.\n{invoke}", "Checking.\n"),
            # The opener misspelled, or without its ">".
            (f"\n\n<{DSML}toolcalls>\n{invoke}{end}", ""),
            (f"Sure.\n\n<{DSML}tool_calls\n{invoke}{end}", "Sure."),
        ]
        seoul = [("get_weather", '{"city": "Seoul"}')]
        for reply, content in cases:
            for size in (len(reply), 1, 5):
                with self.subTest(reply, size=size):
                    self.assertEqual(self.reply(reply, size), (content, seoul))

    def test_malformed_tools_and_tool_calls_raise_naming_the_field(self):
        # A ValueError, which mlx_lm.server answers with a 400.
        hi = {"role": "user", "content": "Hi"}

        def assistant(call):
            return {"role": "assistant", "content": "", "tool_calls": [call]}

        for field, messages, kwargs in [
            (r"tools\[0\] has no 'function'", [hi], {"tools": [{"name": "f"}]}),
            (
                r"tool_calls\[0\] needs a 'function'",
                [hi, assistant({"name": "f", "arguments": {}})],
                {},
            ),
        ]:
            with self.subTest(field):
                with self.assertRaisesRegex(ValueError, field):
                    apply_chat_template(messages, **kwargs)

    def test_thinking_is_another_name_for_enable_thinking(self):
        # vLLM's clients send "thinking" in chat_template_kwargs; mlx_lm's
        # tokenizer adds enable_thinking to every call.
        on = EXPECTED["one user turn, thinking"]
        off = EXPECTED["one user turn, chat"]
        for kwargs, want in [
            ({"thinking": True}, on),
            ({"thinking": False}, off),
            ({"thinking": False, "enable_thinking": True}, off),
            ({"thinking": True, "enable_thinking": False}, on),
            ({"thinking": False, "thinking_mode": "thinking"}, on),
            ({"thinking": True, "thinking_mode": "chat"}, off),
        ]:
            with self.subTest(**kwargs):
                out = apply_chat_template([HI], add_generation_prompt=True, **kwargs)
                self.assertEqual(out, want)

    def test_tool_results_in_parts_render_as_deepseeks_encoder(self):
        parts = tool([{"type": "text", "text": t} for t in ("Sunny", "22 C")], "call_1")
        out = apply_chat_template(
            [ASK, CALLS, parts], tools=TOOLS, add_generation_prompt=True
        )
        # Rendered by DeepSeek's encoding/encoding_dsv4.py (sha256 bdbd57c1...5055e0).
        want = '<｜begin▁of▁sentence｜>\n\n⟦tools⟧<｜User｜>Weather in Paris?<｜Assistant｜><think>Ask the tool.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny\n\n22 C</tool_result><｜Assistant｜><think>'
        self.assertEqual(out, want.replace("⟦tools⟧", TOOLS_BLOCK))

    def test_tool_results_in_parts_are_joined_as_deepseek_joins_them(self):
        call = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
        parts = [{"type": "text", "text": "Sunny"}, {"type": "text", "text": "22 C"}]
        messages = [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [{"function": call}]},
            {"role": "tool", "content": parts},
        ]
        want = apply_chat_template(messages, add_generation_prompt=True)
        self.assertIn("<tool_result>Sunny\n\n22 C</tool_result>", want)

        # The prompt mlx_lm.server renders for the request.
        prompts = []
        render = TokenizerWrapper.apply_chat_template

        def record(tokenizer, messages, tokenize=True, **kwargs):
            prompts.append(render(tokenizer, messages, tokenize=False, **kwargs))
            return render(tokenizer, messages, tokenize=tokenize, **kwargs)

        cli_args = SimpleNamespace(chat_template_args={})
        server = SimpleNamespace(
            model_provider=SimpleNamespace(processor=None, cli_args=cli_args)
        )
        request = CompletionRequest("chat", "", messages, None, None)
        args = SimpleNamespace(chat_template_kwargs=None)
        with mock.patch.object(TokenizerWrapper, "apply_chat_template", record):
            ResponseGenerator._tokenize(server, self.tokenizer, request, args)
        self.assertEqual(prompts, [want])


if __name__ == "__main__":
    unittest.main()
