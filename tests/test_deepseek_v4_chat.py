# Copyright © 2026 Apple Inc.

import json
import unittest

from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from mlx_lm.chat_templates.deepseek_v4 import (
    apply_chat_template,
    bos_token,
    encode_messages,
    render_tool_calls,
    user_token,
)
from mlx_lm.tool_parsers.deepseek_v4 import (
    parse_tool_call,
    tool_call_end,
    tool_call_start,
)

# Conversations, as mlx_lm.server hands them to the encoder (tool call
# arguments decoded, but for one not JSON), each with the options of the call.

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time now.",
        "parameters": {"type": "object", "properties": {}},
    },
}
TOOLS = [WEATHER, TIME]


def call(id, name, args):
    return {"id": id, "type": "function", "function": {"name": name, "arguments": args}}


def msg(role, content, **extra):
    return {"role": role, "content": content, **extra}


def user(content, **extra):
    return msg("user", content, **extra)


def assistant(content, thinking=None, **extra):
    if thinking is not None:
        extra = {"reasoning_content": thinking, **extra}
    return msg("assistant", content, **extra)


def tool(content, call_id=None):
    return msg("tool", content, **({"tool_call_id": call_id} if call_id else {}))


PARIS = call("call_1", "get_weather", {"city": "Paris", "days": 2})
ROME = call("call_2", "get_weather", {"city": "Rome"})
NOW = call("call_3", "get_time", {})

SYS = msg("system", "Be brief.")
JSON_SYS = msg("system", "Be brief.", response_format={"type": "json_object"})
HI = user("Hi")
HELLO = assistant("Hello!", "A greeting.")
ASK = user("Weather in Paris?")
CALLS = assistant("", "Ask the tool.", tool_calls=[PARIS])
SUNNY = tool("Sunny", "call_1")
PARTS = [
    {"type": "text", "text": "Sunny"},
    {"type": "image_url", "image_url": {"url": "x"}},
    {"type": "text", "text": "20 C"},
]
REMINDER = msg("latest_reminder", "Today is Monday.")
ARGS = {"s": "x\ny", "n": 1.5, "b": True, "z": None, "l": [1, "a"], "o": {"k": "é"}}
BOTH = assistant("", "Both.", tool_calls=[PARIS, ROME, NOW])
RESULTS = [tool("9:00", "call_3"), tool("Sunny", "call_1"), tool("Rain", "call_2")]
EVERY_TYPE = assistant("Ok.", tool_calls=[call("c", "f", {**ARGS, "q": "42"})])
MAX = {"reasoning_effort": "max"}
TITLE = assistant("Paris weather", "A title.")
SHELL = assistant("", "Run it.", tool_calls=[call("c", "shell", "ls -la")])

T = {"tools": TOOLS}
CHAT = {"enable_thinking": False}
CONT = {"continue_final_message": True, "add_generation_prompt": False}

# (name, messages, options); the output of each is EXPECTED[name].
CASES = [
    ("one user turn, thinking", [HI], {}),
    ("one user turn, chat", [HI], CHAT),
    ("system and user", [SYS, HI], {}),
    ("no generation prompt", [SYS, HI], {"add_generation_prompt": False}),
    ("tools with a system message", [SYS, HI], T),
    ("earlier reasoning dropped", [SYS, HI, HELLO, ASK], {}),
    ("earlier reasoning kept with tools", [SYS, HI, HELLO, ASK], T),
    ("tool call and result", [SYS, ASK, CALLS, SUNNY], T),
    ("tool result as content parts", [ASK, CALLS, tool(PARTS, "call_1")], T),
    ("tool results sorted into call order", [ASK, BOTH, *RESULTS], T),
    ("arguments of every JSON type", [HI, EVERY_TYPE, tool("done")], T),
    ("reasoning effort max", [SYS, HI], MAX),
    ("response format", [JSON_SYS, HI], {}),
    ("developer message", [msg("developer", "Answer in French.")], {}),
    ("latest reminder after the user turn", [SYS, HI, REMINDER], {}),
    ("continue the final message", [HI, assistant("Hel", "Greet.")], CONT),
    ("continue after a tool result", [ASK, CALLS, SUNNY], {**T, **CONT}),
    ("action task", [user("Weather in Paris?", task="action")], {}),
    ("query task", [user("Weather in Paris?", task="query")], {}),
    ("no reasoning after a task", [user("Paris?", task="title"), TITLE], {}),
    ("user messages in a row", [HI, user("Again")], {}),
    (
        "a user turn after a task turn",
        [user("Paris?", task="title"), user("Again")],
        {},
    ),
    ("tool result and user text in a row", [ASK, CALLS, SUNNY, user("Thx")], T),
    ("latest reminder before the last user turn", [HI, HELLO, REMINDER, ASK], {}),
    ("arguments not JSON", [HI, SHELL, tool("a.txt", "c")], {}),
]


# DeepSeek's encoding/encoding_dsv4.py renders CASES as EXPECTED, given the
# tool call arguments as JSON text; "no generation prompt" is its output less
# the final "<｜Assistant｜><think>" (mlx-lm's cut, as deepseek_v32's).
TOOLS_BLOCK = '## Tools\n\nYou have access to a set of tools to help answer the user\'s question. You can invoke tools by writing a "<｜DSML｜tool_calls>" block like the following:\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="$TOOL_NAME">\n<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n<｜DSML｜invoke name="$TOOL_NAME2">\n...\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>\n\nString parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.\n\nIf thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\nOtherwise, output directly after </think> with tool calls or final response.\n\n### Available Tool Schemas\n\n{"name": "get_weather", "description": "The weather in a city.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}\n{"name": "get_time", "description": "The time now.", "parameters": {"type": "object", "properties": {}}}\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n'
# ⟦tools⟧ stands for the block.
EXPECTED = {
    "one user turn, thinking": "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>",
    "one user turn, chat": "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>",
    "system and user": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜><think>",
    "no generation prompt": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi",
    "tools with a system message": "<｜begin▁of▁sentence｜>Be brief.\n\n⟦tools⟧<｜User｜>Hi<｜Assistant｜><think>",
    "earlier reasoning dropped": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜></think>Hello!<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think>",
    "earlier reasoning kept with tools": "<｜begin▁of▁sentence｜>Be brief.\n\n⟦tools⟧<｜User｜>Hi<｜Assistant｜><think>A greeting.</think>Hello!<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think>",
    "tool call and result": '<｜begin▁of▁sentence｜>Be brief.\n\n⟦tools⟧<｜User｜>Weather in Paris?<｜Assistant｜><think>Ask the tool.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny</tool_result><｜Assistant｜><think>',
    "tool result as content parts": '<｜begin▁of▁sentence｜>\n\n⟦tools⟧<｜User｜>Weather in Paris?<｜Assistant｜><think>Ask the tool.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny\n\n[Unsupported image_url]\n\n20 C</tool_result><｜Assistant｜><think>',
    "tool results sorted into call order": '<｜begin▁of▁sentence｜>\n\n⟦tools⟧<｜User｜>Weather in Paris?<｜Assistant｜><think>Both.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Rome</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name="get_time">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny</tool_result>\n\n<tool_result>Rain</tool_result>\n\n<tool_result>9:00</tool_result><｜Assistant｜><think>',
    "arguments of every JSON type": '<｜begin▁of▁sentence｜>\n\n⟦tools⟧<｜User｜>Hi<｜Assistant｜><think></think>Ok.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="s" string="true">x\ny</｜DSML｜parameter>\n<｜DSML｜parameter name="n" string="false">1.5</｜DSML｜parameter>\n<｜DSML｜parameter name="b" string="false">true</｜DSML｜parameter>\n<｜DSML｜parameter name="z" string="false">null</｜DSML｜parameter>\n<｜DSML｜parameter name="l" string="false">[1, "a"]</｜DSML｜parameter>\n<｜DSML｜parameter name="o" string="false">{"k": "é"}</｜DSML｜parameter>\n<｜DSML｜parameter name="q" string="true">42</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>done</tool_result><｜Assistant｜><think>',
    "reasoning effort max": "<｜begin▁of▁sentence｜>Reasoning Effort: Absolute maximum with no shortcuts permitted.\nYou MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\nExplicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\nBe brief.<｜User｜>Hi<｜Assistant｜><think>",
    "response format": '<｜begin▁of▁sentence｜>Be brief.\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n{"type": "json_object"}<｜User｜>Hi<｜Assistant｜><think>',
    "developer message": "<｜begin▁of▁sentence｜><｜User｜>Answer in French.<｜Assistant｜><think>",
    "latest reminder after the user turn": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜><think><｜latest_reminder｜>Today is Monday.",
    "continue the final message": "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>Greet.</think>Hel",
    "continue after a tool result": '<｜begin▁of▁sentence｜>\n\n⟦tools⟧<｜User｜>Weather in Paris?<｜Assistant｜><think>Ask the tool.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny</tool_result>',
    "action task": "<｜begin▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think><｜action｜>",
    "query task": "<｜begin▁of▁sentence｜><｜User｜>Weather in Paris?<｜query｜>",
    "no reasoning after a task": "<｜begin▁of▁sentence｜><｜User｜>Paris?<｜title｜>Paris weather<｜end▁of▁sentence｜>",
    "user messages in a row": "<｜begin▁of▁sentence｜><｜User｜>Hi\n\nAgain<｜Assistant｜><think>",
    "a user turn after a task turn": "<｜begin▁of▁sentence｜><｜User｜>Paris?<｜User｜>Again<｜Assistant｜><think>",
    "tool result and user text in a row": '<｜begin▁of▁sentence｜>\n\n⟦tools⟧<｜User｜>Weather in Paris?<｜Assistant｜><think>Ask the tool.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny</tool_result>\n\nThx<｜Assistant｜><think>',
    "latest reminder before the last user turn": "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>Hello!<｜end▁of▁sentence｜><｜latest_reminder｜>Today is Monday.<｜User｜>Weather in Paris?<｜Assistant｜><think>",
    "arguments not JSON": '<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="shell">\n<｜DSML｜parameter name="arguments" string="true">ls -la</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>a.txt</tool_result><｜Assistant｜><think>',
}
EXPECTED = {k: v.replace("⟦tools⟧", TOOLS_BLOCK) for k, v in EXPECTED.items()}


class TestDeepseekV4ChatTemplate(unittest.TestCase):

    def test_conversations_render_as_deepseeks_encoder(self):
        for name, messages, kwargs in CASES:
            with self.subTest(name):
                kwargs = {"add_generation_prompt": True, **kwargs}
                out = apply_chat_template(messages, **kwargs)
                self.assertEqual(out, EXPECTED[name])

    def test_arguments_as_json_text_or_decoded_render_the_same(self):
        # OpenAI clients send JSON text, mlx_lm.server decodes it.
        arguments = {**ARGS, "q": "42"}
        as_text = call("c", "f", json.dumps(arguments))
        messages = [HI, assistant("Ok.", tool_calls=[as_text]), tool("done")]
        out = apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True)
        self.assertEqual(out, EXPECTED["arguments of every JSON type"])
        # What is not an object is one parameter (DeepSeek's: null, text not JSON).
        for arguments, value in (
            (None, "null"),
            ("[1, 2]", "[1, 2]"),
            ([1, 2], "[1, 2]"),
        ):
            messages[1] = assistant("Ok.", tool_calls=[call("c", "f", arguments)])
            out = apply_chat_template(messages, add_generation_prompt=True)
            parameter = f'<｜DSML｜parameter name="arguments" string="false">{value}<'
            self.assertIn(parameter, out)

    def test_tools_given_as_functions_render_as_their_schemas(self):
        def get_weather(city: str, days: int):
            """
            The weather in a city.

            Args:
                city: The city.
                days: How many days.
            """

        schema = {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The city."},
                    "days": {"type": "integer", "description": "How many days."},
                },
                "required": ["city", "days"],
            },
        }
        as_function = apply_chat_template([HI], tools=[get_weather])
        as_dict = apply_chat_template([HI], tools=[{"function": schema}])
        self.assertEqual(as_function, as_dict)
        self.assertIn('\n\n{"name": "get_weather", ', as_function)

    def test_rendered_tool_calls_parse_back(self):
        arguments = {"a": "x\ny", "b": [1, 2], "c": {"d": False}, "e": 3.5, "f": "7"}
        calls = [{"name": "f", "arguments": arguments}, {"name": "g", "arguments": {}}]
        text = render_tool_calls([{"function": c} for c in calls])
        # The server strips the start marker before it parses.
        text = text.removeprefix(tool_call_start)
        self.assertEqual(parse_tool_call(text, None), calls)

    def test_invalid_input_raises_a_value_error(self):
        hi = {"role": "user", "content": "Hi"}
        bad = [
            ("reasoning_effort", [hi], {"reasoning_effort": "lowest"}),
            ("role `developer`", [{"role": "developer", "content": ""}], {}),
            ("Unknown role: bot", [hi, {"role": "bot", "content": "x"}], {}),
            ("Invalid task: 'bogus'", [user("x", task="bogus")], {}),
            (
                "tools are given both as an argument and in messages",
                [{"role": "system", "content": "s", "tools": TOOLS}, hi],
                {"tools": TOOLS},
            ),
        ]
        for field, messages, kwargs in bad:
            with self.subTest(field):
                with self.assertRaisesRegex(ValueError, field):
                    apply_chat_template(messages, **kwargs)
        with self.assertRaises(ValueError):
            apply_chat_template(
                [hi], add_generation_prompt=True, continue_final_message=True
            )
        with self.assertRaisesRegex(ValueError, "thinking_mode"):
            encode_messages([hi], thinking_mode="deep")

    def test_a_streamed_reply_splits_into_reasoning_text_and_calls(self):
        from mlx_lm.generate import TextStateMachine, make_text_state_machine
        from mlx_lm.tokenizer_utils import TokenizerWrapper

        D = "｜DSML｜"
        # The server's split of a reply after "<think>".
        words = Tokenizer(models.WordLevel({"?": 0, "<think>": 1, "</think>": 2}, "?"))
        tokenizer = TokenizerWrapper(
            PreTrainedTokenizerFast(tokenizer_object=words),
            tool_call_start=tool_call_start,
            tool_call_end=tool_call_end,
            tool_parser=parse_tool_call,
        )
        calls = [
            {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}},
            # A value may hold the block's closing tag.
            {"name": "write", "arguments": {"text": f"a\n</{D}tool_calls>\nb"}},
        ]
        block = (
            f"\n\n<{D}tool_calls>\n"
            f'<{D}invoke name="get_weather">\n'
            f'<{D}parameter name="city" string="true">Paris</{D}parameter>\n'
            f'<{D}parameter name="days" string="false">2</{D}parameter>\n'
            f"</{D}invoke>\n"
            f'<{D}invoke name="write">\n'
            f'<{D}parameter name="text" string="true">a\n</{D}tool_calls>\n'
            f"b</{D}parameter>\n"
            f"</{D}invoke>\n"
            f"</{D}tool_calls>"
        )
        reply = "Ask the tool.</think>Let me check." + block
        for step in (1, 3, 7, len(reply)):
            with self.subTest(step=step):
                state = make_text_state_machine(tokenizer).make_state("reasoning")
                out = {"reasoning": "", "normal": "", "tool": ""}
                for i in range(0, len(reply), step):
                    state, segments = TextStateMachine.split(state, reply[i : i + step])
                    for name, text in segments:
                        out[name] += text
                self.assertEqual(out["reasoning"], "Ask the tool.")
                self.assertEqual(out["normal"], "Let me check.")
                self.assertEqual(parse_tool_call(out["tool"], None), calls)

    def test_other_keywords_are_ignored(self):
        # As Hugging Face's templates ignore them (chat_template_kwargs).
        hi = [{"role": "user", "content": "Hi"}]
        self.assertEqual(
            apply_chat_template(hi, add_generation_prompt=True, tool_choice="auto"),
            apply_chat_template(hi, add_generation_prompt=True),
        )

    def test_thinking_drops_developer_messages_before_the_last_user_turn(self):
        messages = [
            msg("developer", "Answer in French."),
            user("Hi"),
            assistant("Salut.", "greet"),
            user("Again"),
        ]
        rest = f"{user_token}Hi<｜Assistant｜>"
        end = "<｜end▁of▁sentence｜><｜User｜>Again<｜Assistant｜>"
        for kwargs, want in (
            ({}, f"{bos_token}{rest}</think>Salut.{end}<think>"),
            (
                {"enable_thinking": False},
                f"{bos_token}{user_token}Answer in French.{rest}</think>Salut.{end}</think>",
            ),
            (
                {"drop_thinking": False},
                f"{bos_token}{user_token}Answer in French.{rest}<think>greet</think>Salut.{end}<think>",
            ),
        ):
            with self.subTest(**kwargs):
                out = apply_chat_template(
                    messages, add_generation_prompt=True, **kwargs
                )
                self.assertEqual(out, want)

    def test_continue_final_message_leaves_a_user_turn_open(self):
        # As mlx_lm.cache_prompt asks: the turn ends where its text ends.
        for role in ("user", "developer"):
            with self.subTest(role):
                messages = [{"role": role, "content": "The quick"}]
                text = apply_chat_template(messages, continue_final_message=True)
                self.assertEqual(text, f"{bos_token}{user_token}The quick")
                self.assertEqual(text, apply_chat_template(messages))

    def test_messages_are_not_changed(self):
        messages = json.loads(json.dumps([SYS, ASK, CALLS, SUNNY]))
        before = json.dumps(messages)
        apply_chat_template(messages, tools=TOOLS, continue_final_message=False)
        self.assertEqual(json.dumps(messages), before)


if __name__ == "__main__":
    unittest.main()
