# Copyright © 2026 Apple Inc.

import json
import tempfile
import unittest
from pathlib import Path

from test_deepseek_v4 import make_tiny_model_folder

from mlx_lm import load
from mlx_lm.chat_templates.deepseek_v4 import apply_chat_template, render_tool_calls
from mlx_lm.tool_parsers import deepseek_v4 as tool_parser

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                },
                "required": ["city"],
            },
        },
    }
]

CALL = {
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}},
}

DSML_CALL = (
    "\n\n<｜DSML｜tool_calls>\n"
    '<｜DSML｜invoke name="get_weather">\n'
    '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
    '<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>"
)

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!", "reasoning_content": "A greeting."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Ask the tool.",
        "tool_calls": [CALL],
    },
    {"role": "tool", "content": "Sunny"},
]


class TestDeepseekV4ChatTemplate(unittest.TestCase):

    def test_single_turn_layout_in_thinking_and_chat_mode(self):
        messages = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
        ]
        prefix = f"{BOS}Be brief.{USER}Hi{ASSISTANT}"
        out = apply_chat_template(messages, add_generation_prompt=True)
        self.assertEqual(out, prefix + "<think>")
        out = apply_chat_template(
            messages, add_generation_prompt=True, enable_thinking=False
        )
        self.assertEqual(out, prefix + "</think>")

    def test_no_generation_prompt_ends_at_the_user_turn(self):
        out = apply_chat_template([{"role": "user", "content": "Hi"}])
        self.assertEqual(out, f"{BOS}{USER}Hi")

    def test_earlier_reasoning_is_dropped_without_tools(self):
        out = apply_chat_template(CONVERSATION[:4], add_generation_prompt=True)
        self.assertEqual(
            out,
            f"{BOS}Be brief.{USER}Hi{ASSISTANT}</think>Hello!{EOS}"
            f"{USER}Weather in Paris?{ASSISTANT}<think>",
        )

    def test_earlier_reasoning_is_kept_with_tools(self):
        out = apply_chat_template(
            CONVERSATION[:4], tools=TOOLS, add_generation_prompt=True
        )
        self.assertIn(f"{USER}Hi{ASSISTANT}<think>A greeting.</think>Hello!{EOS}", out)

    def test_tools_are_a_tools_block_of_json_schemas_in_the_system_text(self):
        out = apply_chat_template(
            CONVERSATION[:2], tools=TOOLS, add_generation_prompt=True
        )
        system = out[len(BOS) : out.index(USER)]
        self.assertTrue(system.startswith("Be brief.\n\n## Tools\n"))
        self.assertIn("<｜DSML｜tool_calls>", system)
        self.assertTrue(system.endswith(json.dumps(TOOLS[0]["function"])))
        # Without a system message the block is the whole system text.
        out = apply_chat_template(CONVERSATION[1:2], tools=TOOLS)
        self.assertTrue(out.startswith(f"{BOS}## Tools\n"))

    def test_tool_calls_and_results_round_trip(self):
        out = apply_chat_template(CONVERSATION, tools=TOOLS, add_generation_prompt=True)
        self.assertTrue(
            out.endswith(
                f"{USER}Weather in Paris?{ASSISTANT}<think>Ask the tool.</think>"
                f"{DSML_CALL}{EOS}{USER}<tool_result>Sunny</tool_result>"
                f"{ASSISTANT}<think>"
            )
        )

    def test_tool_results_and_user_text_share_one_user_turn(self):
        messages = CONVERSATION + [
            {"role": "tool", "content": "Rain"},
            {"role": "user", "content": "And tomorrow?"},
        ]
        out = apply_chat_template(messages, tools=TOOLS, enable_thinking=False)
        self.assertTrue(
            out.endswith(
                f"{EOS}{USER}<tool_result>Sunny</tool_result>\n"
                "<tool_result>Rain</tool_result>\nAnd tomorrow?"
            )
        )
        self.assertNotIn("role", out)

    def test_arguments_as_a_json_string_render_the_same(self):
        call = {
            "function": {
                "name": "get_weather",
                "arguments": json.dumps({"city": "Paris", "days": 2}),
            }
        }
        self.assertEqual(render_tool_calls([call]), DSML_CALL)

    def test_continue_final_message_leaves_the_turn_open(self):
        messages = [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hel"},
        ]
        out = apply_chat_template(
            messages, continue_final_message=True, enable_thinking=False
        )
        self.assertEqual(out, f"{BOS}{USER}Hi{ASSISTANT}</think>Hel")
        messages[-1] = {"role": "assistant", "reasoning_content": "Hm"}
        out = apply_chat_template(messages, continue_final_message=True)
        self.assertEqual(out, f"{BOS}{USER}Hi{ASSISTANT}<think>Hm")


class TestDeepseekV4ToolParser(unittest.TestCase):

    def test_markers(self):
        self.assertEqual(tool_parser.tool_call_start, "<｜DSML｜tool_calls>")
        self.assertEqual(tool_parser.tool_call_end, "</｜DSML｜tool_calls>")

    def test_string_true_is_raw_and_string_false_is_json(self):
        text = (
            '<｜DSML｜invoke name="f">\n'
            '<｜DSML｜parameter name="s" string="true">12 "a"\n b</｜DSML｜parameter>\n'
            '<｜DSML｜parameter name="n" string="false">12</｜DSML｜parameter>\n'
            '<｜DSML｜parameter name="o" string="false">{"k": [1, null]}'
            "</｜DSML｜parameter>\n"
            '<｜DSML｜parameter name="b" string="false">true</｜DSML｜parameter>\n'
            "</｜DSML｜invoke>\n"
        )
        self.assertEqual(
            tool_parser.parse_tool_call(text),
            {
                "name": "f",
                "arguments": {
                    "s": '12 "a"\n b',
                    "n": 12,
                    "o": {"k": [1, None]},
                    "b": True,
                },
            },
        )

    def test_several_invokes_give_a_list(self):
        text = DSML_CALL + DSML_CALL.replace("Paris", "Rome")
        calls = tool_parser.parse_tool_call(text)
        self.assertEqual(
            calls,
            [
                {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}},
                {"name": "get_weather", "arguments": {"city": "Rome", "days": 2}},
            ],
        )

    def test_rendered_calls_parse_back(self):
        arguments = {"a": "x\ny", "b": [1, 2], "c": {"d": False}, "e": 3.5}
        calls = [{"name": "f", "arguments": arguments}, {"name": "g", "arguments": {}}]
        self.assertEqual(tool_parser.parse_tool_call(render_tool_calls(calls)), calls)

    def test_truncated_closing_markers(self):
        expected = {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}
        body = DSML_CALL[: DSML_CALL.index("</｜DSML｜tool_calls>")]
        for end in ("</｜DSML｜tool_calls>", "</｜DSML｜tool_calls"):
            for cut in range(len(end)):
                with self.subTest(text=end[:cut]):
                    text = body + end[:cut]
                    self.assertEqual(tool_parser.parse_tool_call(text), expected)
        body = DSML_CALL[: DSML_CALL.index("</｜DSML｜parameter>\n</｜DSML｜invoke>")]
        for cut in range(len("</｜DSML｜parameter>")):
            with self.subTest(text="</｜DSML｜parameter>"[:cut]):
                text = body + "</｜DSML｜parameter>"[:cut]
                self.assertEqual(tool_parser.parse_tool_call(text), expected)

    def test_unclosed_invoke_is_followed_by_the_next_one(self):
        text = DSML_CALL.replace("</｜DSML｜invoke>\n", "")
        text = text.replace("</｜DSML｜tool_calls>", "") + DSML_CALL
        calls = tool_parser.parse_tool_call(text)
        self.assertEqual(len(calls), 2)
        self.assertEqual(calls[0], calls[1])

    def test_no_invoke_raises(self):
        with self.assertRaises(ValueError):
            tool_parser.parse_tool_call("Just text.")


class TestDeepseekV4ChatLoad(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        cls.path = make_tiny_model_folder(Path(cls._tmp.name) / "model")
        _, cls.tokenizer = load(str(cls.path))

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def test_load_uses_the_encoder_and_the_tool_parser(self):
        tokenizer = self.tokenizer
        self.assertTrue(tokenizer.has_chat_template)
        self.assertTrue(tokenizer.has_tool_calling)
        self.assertIs(tokenizer.tool_parser, tool_parser.parse_tool_call)
        self.assertEqual(tokenizer.tool_call_start, tool_parser.tool_call_start)
        messages = [{"role": "user", "content": "The quick brown fox"}]
        kwargs = dict(tools=TOOLS, add_generation_prompt=True, enable_thinking=True)
        text = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
        self.assertEqual(text, apply_chat_template(messages, **kwargs))
        tokens = tokenizer.apply_chat_template(messages, **kwargs)
        self.assertEqual(tokens[0], tokenizer.bos_token_id)
        self.assertEqual(tokenizer.decode(tokens), text)

    def test_streamed_tool_calls_reach_the_parser(self):
        # As the server splits the stream, with the closing marker cut short.
        from mlx_lm.generate import TextStateMachine, make_text_state_machine

        tokenizer = self.tokenizer
        machine = make_text_state_machine(tokenizer)
        for output in ("Let me check." + DSML_CALL, "Let me check." + DSML_CALL[:-3]):
            state = machine.make_state("normal")
            detokenizer = tokenizer.detokenizer
            segments = []
            for token in tokenizer.encode(output, add_special_tokens=False):
                detokenizer.add_token(token)
                state, new = TextStateMachine.split(state, detokenizer.last_segment)
                segments += new
            detokenizer.finalize()
            state, new = TextStateMachine.split(state, detokenizer.last_segment)
            segments += new
            TextStateMachine.discard(state)
            tool_text = "".join(t for s, t in segments if s == "tool")
            self.assertEqual(
                tokenizer.tool_parser(tool_text, TOOLS),
                {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}},
            )
            text = "".join(t for s, t in segments if s == "normal")
            self.assertEqual(text.strip(), "Let me check.")

    def test_a_template_in_the_checkpoint_wins(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = make_tiny_model_folder(Path(tmp) / "model")
            with open(path / "tokenizer_config.json") as f:
                config = json.load(f)
            config["chat_template"] = (
                "{% for m in messages %}{{ m.content }}{% endfor %}"
            )
            with open(path / "tokenizer_config.json", "w") as f:
                json.dump(config, f)
            _, tokenizer = load(str(path))
        messages = [{"role": "user", "content": "fox"}]
        self.assertEqual(tokenizer.apply_chat_template(messages, tokenize=False), "fox")
        self.assertIs(tokenizer.tool_parser, tool_parser.parse_tool_call)


if __name__ == "__main__":
    unittest.main()
