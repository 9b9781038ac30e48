# Copyright © 2026 Apple Inc.
"""The DeepSeek-V4 chat format, deeper than tests/test_deepseek_v4_chat.py:
34 more conversations against DeepSeek's reference strings, 0731's efforts on
all 11 of its cases; and the format a loaded checkpoint gets (the original's,
or 0731's where the checkpoint says so: its config's dspark_* fields, its own
encoding/encoding_dsv4.py), through mlx_lm.utils.load_tokenizer as the
commands and the server load it, by its model type."""

import json
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from long_decode import make_tokenizer  # noqa: E402
from test_deepseek_v4 import SPECIAL_TOKENS as special_tokens  # noqa: E402
from test_deepseek_v4_chat import (  # noqa: E402
    ASK,
    CALLS,
    CASES,
    CHAT,
    CONT,
    EXPECTED,
    HELLO,
    HI,
    MAX,
    NOW,
    PARIS,
    REMINDER,
    SUNNY,
    SYS,
    TOOLS_BLOCK,
    WEATHER,
    T,
    assistant,
    call,
    msg,
    tool,
    user,
)
from test_deepseek_v4_chat_checkpoints import PROMPTS_0731  # noqa: E402

from mlx_lm.chat_templates.deepseek_v4 import (  # noqa: E402
    REASONING_EFFORT_BEYOND,
    REASONING_EFFORT_MAX,
    apply_chat_template,
    bos_token,
)
from mlx_lm.utils import load_tokenizer  # noqa: E402

SYS_WEATHER = msg("system", "Be brief.", tools=[WEATHER])
OFFER = assistant("Anything else?", "Offer help.")
ANSWER = assistant("It is sunny.", "Sunny it is.")
THANKS = [ASK, CALLS, SUNNY, ANSWER, user("Thanks")]
DEV = msg("developer", "Be kind.")
NOT_JSON = assistant("", tool_calls=[call("c", "f", "not json")])
ASK_TIME = [user("Time?"), assistant("", tool_calls=[NOW]), tool("9:00", "call_3")]
FRENCH = msg("system", "Use French.")
VERBOSE = msg("system", "Now be verbose.")
SCHEMA = {"type": "json_schema", "json_schema": {"name": "w"}}
KEEP = {"drop_thinking": False}
HM = {"reasoning_content": "Hm"}
ASK_TOOL = assistant("", "Ask.", tool_calls=[PARIS])
NOT_READ = assistant("Hello!", reasoning="ignored")
HEL_LO = [HI, assistant("Hel", wo_eos=True), assistant("lo!"), ASK]
JSON_DEV = msg("developer", "Reply in JSON.", response_format={"type": "json_object"})
TITLE = [user("Weather?", task="title"), assistant("Weather"), ASK]

# (name, messages, options); the output of each is MORE_EXPECTED[name].
MORE_CASES = [
    ("empty user text", [user("")], {}),
    ("tools without a system message", [HI], T),
    ("tools with an empty system message", [msg("system", ""), HI], T),
    ("tools in chat mode", [SYS, HI], {**T, **CHAT}),
    ("earlier reasoning kept with drop_thinking=False", [SYS, HI, HELLO, ASK], KEEP),
    ("multi-turn chat mode", [SYS, HI, HELLO, ASK], CHAT),
    ("tool call and result, chat mode", [SYS, ASK, CALLS, SUNNY], {**T, **CHAT}),
    ("answer after a tool result", [SYS, ASK, CALLS, SUNNY, ANSWER, user("Thanks")], T),
    ("tool results then user text", [ASK, CALLS, SUNNY, user("And tomorrow?")], T),
    ("call without arguments", ASK_TIME, T),
    ("arguments that are not JSON", [HI, NOT_JSON, tool("done")], T),
    ("tool calls without tools dropping reasoning", [*THANKS], {}),
    ("tool result is the last user turn", [ASK, CALLS, SUNNY, ANSWER], {}),
    ("reasoning effort max with tools", [HI], {**MAX, **T}),
    ("reasoning effort max in chat mode", [SYS, HI], {**MAX, **CHAT}),
    ("reasoning effort high", [SYS, HI], {"reasoning_effort": "high"}),
    ("response format and tools", [msg("system", "", response_format=SCHEMA), HI], T),
    ("system message mid-conversation", [SYS, HI, HELLO, VERBOSE, ASK], {}),
    ("two leading system messages", [SYS, FRENCH, HI], {}),
    ("two leading system messages with tools", [SYS, FRENCH, HI], T),
    ("developer message with tools on it", [msg("developer", "Use tools.", **T)], {}),
    ("developer message before the last user turn", [SYS, DEV, HELLO, ASK], {}),
    ("developer message kept with drop_thinking=False", [SYS, DEV, HELLO, ASK], KEEP),
    ("system message with tools on it", [SYS_WEATHER, ASK, CALLS, SUNNY], {}),
    ("latest reminder mid-conversation", [SYS, HI, REMINDER, HELLO, ASK], {}),
    ("two assistant messages in a row", [HI, HELLO, OFFER, ASK], KEEP),
    ("ends with an assistant message", [HI, HELLO], {}),
    ("continue after reasoning only", [HI, {"role": "assistant", **HM}], CONT),
    ("continue in chat mode", [HI, assistant("Hel")], {**CONT, **CHAT}),
    ("continue after tool calls", [ASK, ASK_TOOL], {**CONT, **T}),
    ("reasoning read only from reasoning_content", [HI, NOT_READ, ASK], KEEP),
    ("wo_eos on an earlier assistant message", HEL_LO, KEEP),
    ("response format on a developer message", [JSON_DEV], CHAT),
    ("task output has no reasoning", TITLE, {}),
]

# Rendered by DeepSeek's encoding_dsv4.py (sha256 bdbd57c1...5055e0).
WEATHER_BLOCK = '## Tools\n\nYou have access to a set of tools to help answer the user\'s question. You can invoke tools by writing a "<｜DSML｜tool_calls>" block like the following:\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="$TOOL_NAME">\n<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n<｜DSML｜invoke name="$TOOL_NAME2">\n...\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>\n\nString parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.\n\nIf thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\nOtherwise, output directly after </think> with tool calls or final response.\n\n### Available Tool Schemas\n\n{"name": "get_weather", "description": "The weather in a city.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n'
# ⟦tools⟧ and ⟦weather⟧ stand for the two blocks.
MORE_EXPECTED = {
    "empty user text": "<｜begin▁of▁sentence｜><｜User｜><｜Assistant｜><think>",
    "tools without a system message": "<｜begin▁of▁sentence｜>\n\n⟦tools⟧<｜User｜>Hi<｜Assistant｜><think>",
    "tools with an empty system message": "<｜begin▁of▁sentence｜>\n\n⟦tools⟧<｜User｜>Hi<｜Assistant｜><think>",
    "tools in chat mode": "<｜begin▁of▁sentence｜>Be brief.\n\n⟦tools⟧<｜User｜>Hi<｜Assistant｜></think>",
    "earlier reasoning kept with drop_thinking=False": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜><think>A greeting.</think>Hello!<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think>",
    "multi-turn chat mode": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜></think>Hello!<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜></think>",
    "tool call and result, chat mode": '<｜begin▁of▁sentence｜>Be brief.\n\n⟦tools⟧<｜User｜>Weather in Paris?<｜Assistant｜></think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny</tool_result><｜Assistant｜></think>',
    "answer after a tool result": '<｜begin▁of▁sentence｜>Be brief.\n\n⟦tools⟧<｜User｜>Weather in Paris?<｜Assistant｜><think>Ask the tool.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny</tool_result><｜Assistant｜><think>Sunny it is.</think>It is sunny.<｜end▁of▁sentence｜><｜User｜>Thanks<｜Assistant｜><think>',
    "tool results then user text": '<｜begin▁of▁sentence｜>\n\n⟦tools⟧<｜User｜>Weather in Paris?<｜Assistant｜><think>Ask the tool.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny</tool_result>\n\nAnd tomorrow?<｜Assistant｜><think>',
    "call without arguments": '<｜begin▁of▁sentence｜>\n\n⟦tools⟧<｜User｜>Time?<｜Assistant｜><think></think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_time">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>9:00</tool_result><｜Assistant｜><think>',
    "arguments that are not JSON": '<｜begin▁of▁sentence｜>\n\n⟦tools⟧<｜User｜>Hi<｜Assistant｜><think></think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="arguments" string="true">not json</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>done</tool_result><｜Assistant｜><think>',
    "tool calls without tools dropping reasoning": '<｜begin▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜></think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny</tool_result><｜Assistant｜></think>It is sunny.<｜end▁of▁sentence｜><｜User｜>Thanks<｜Assistant｜><think>',
    "tool result is the last user turn": '<｜begin▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜></think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny</tool_result><｜Assistant｜><think>Sunny it is.</think>It is sunny.<｜end▁of▁sentence｜>',
    "reasoning effort max with tools": "<｜begin▁of▁sentence｜>Reasoning Effort: Absolute maximum with no shortcuts permitted.\nYou MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\nExplicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n\n\n⟦tools⟧<｜User｜>Hi<｜Assistant｜><think>",
    "reasoning effort max in chat mode": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜></think>",
    "reasoning effort high": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜><think>",
    "response format and tools": '<｜begin▁of▁sentence｜>\n\n⟦tools⟧\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n{"type": "json_schema", "json_schema": {"name": "w"}}<｜User｜>Hi<｜Assistant｜><think>',
    "system message mid-conversation": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜></think>Hello!<｜end▁of▁sentence｜>Now be verbose.<｜User｜>Weather in Paris?<｜Assistant｜><think>",
    "two leading system messages": "<｜begin▁of▁sentence｜>Be brief.Use French.<｜User｜>Hi<｜Assistant｜><think>",
    "two leading system messages with tools": "<｜begin▁of▁sentence｜>Be brief.\n\n⟦tools⟧Use French.<｜User｜>Hi<｜Assistant｜><think>",
    "developer message with tools on it": "<｜begin▁of▁sentence｜><｜User｜>Use tools.\n\n⟦tools⟧<｜Assistant｜><think>",
    "developer message before the last user turn": "<｜begin▁of▁sentence｜>Be brief.Hello!<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think>",
    "developer message kept with drop_thinking=False": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Be kind.<｜Assistant｜><think>A greeting.</think>Hello!<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think>",
    "system message with tools on it": '<｜begin▁of▁sentence｜>Be brief.\n\n⟦weather⟧<｜User｜>Weather in Paris?<｜Assistant｜><think>Ask the tool.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny</tool_result><｜Assistant｜><think>',
    "latest reminder mid-conversation": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜></think><｜latest_reminder｜>Today is Monday.Hello!<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think>",
    "two assistant messages in a row": "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>A greeting.</think>Hello!<｜end▁of▁sentence｜>Offer help.</think>Anything else?<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think>",
    "ends with an assistant message": "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>A greeting.</think>Hello!<｜end▁of▁sentence｜>",
    "continue after reasoning only": "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>Hm</think>",
    "continue in chat mode": "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>Hel",
    "continue after tool calls": '<｜begin▁of▁sentence｜>\n\n⟦tools⟧<｜User｜>Weather in Paris?<｜Assistant｜><think>Ask.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>',
    "reasoning read only from reasoning_content": "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think></think>Hello!<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think>",
    "wo_eos on an earlier assistant message": "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think></think>Hel</think>lo!<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think>",
    "response format on a developer message": '<｜begin▁of▁sentence｜><｜User｜>Reply in JSON.\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n{"type": "json_object"}<｜Assistant｜></think>',
    "task output has no reasoning": "<｜begin▁of▁sentence｜><｜User｜>Weather?<｜title｜>Weather<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think>",
}
MORE_EXPECTED = {
    k: v.replace("⟦tools⟧", TOOLS_BLOCK).replace("⟦weather⟧", WEATHER_BLOCK)
    for k, v in MORE_EXPECTED.items()
}

# The cases of DeepSeek's encoder in 0731's format (see tests/).
CASES_0731 = [
    "one user turn, thinking",
    "one user turn, chat",
    "system and user",
    "tools without a system message",
    "tools in chat mode",
    "tool call and result",
    "earlier reasoning dropped",
    "developer message",
    "latest reminder after the user turn",
    "continue the final message",
    "action task",
]

MESSAGES = [{"role": "user", "content": "Hi"}]
TAIL = "<｜User｜>Hi<｜Assistant｜><think>"


class TestDeepseekV4ChatSweep(unittest.TestCase):

    def test_more_conversations_render_as_deepseeks_encoder(self):
        self.assertEqual(len(CASES) + len(MORE_CASES), 59)
        for name, messages, kwargs in MORE_CASES:
            with self.subTest(name):
                kwargs = {"add_generation_prompt": True, **kwargs}
                out = apply_chat_template(messages, **kwargs)
                self.assertEqual(out, MORE_EXPECTED[name])

    def test_0731_conversations_render_as_deepseeks_encoder(self):
        expected = {**EXPECTED, **MORE_EXPECTED}
        cases = [c for c in CASES + MORE_CASES if c[0] in CASES_0731]
        self.assertEqual(len(cases), len(CASES_0731))
        for name, messages, kwargs in cases:
            thinking = kwargs.get("enable_thinking", True)
            for effort, prompt in PROMPTS_0731.items():
                with self.subTest(name, reasoning_effort=effort):
                    options = {"add_generation_prompt": True, **kwargs}
                    if effort is not None:
                        options["reasoning_effort"] = effort
                    out = apply_chat_template(messages, chat_format="0731", **options)
                    want = expected[name]
                    if thinking:
                        want = bos_token + prompt + want.removeprefix(bos_token)
                    self.assertEqual(out, want)


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
            (original, "max", REASONING_EFFORT_MAX),
            (original, "high", ""),
            (original, None, ""),
            (dspark, "max", REASONING_EFFORT_BEYOND),
            (dspark, "high", REASONING_EFFORT_MAX),
            # DeepSeek's API: "medium" and none given are 0731's "high".
            (dspark, "medium", REASONING_EFFORT_MAX),
            (dspark, "low", ""),
            (dspark, None, REASONING_EFFORT_MAX),
            (own, "max", REASONING_EFFORT_MAX),
        ]:
            with self.subTest(effort=effort, path=tokenizer.name_or_path):
                kwargs = {} if effort is None else {"reasoning_effort": effort}
                self.assertEqual(
                    self.render(tokenizer, **kwargs), bos_token + prompt + TAIL
                )
        # --chat-template-config / chat_template_kwargs name the format.
        out = self.render(dspark, reasoning_effort="max", chat_format="original")
        self.assertEqual(out, bos_token + REASONING_EFFORT_MAX + TAIL)


if __name__ == "__main__":
    unittest.main()
