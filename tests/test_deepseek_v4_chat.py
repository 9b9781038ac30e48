# Copyright © 2026 Apple Inc.

import json
import tempfile
import unittest
from pathlib import Path

from mlx_lm.utils import load_tokenizer

from mlx_lm.chat_templates.deepseek_v4 import (
    apply_chat_template,
    bos_token,
    eos_token,
    render_tool_calls,
    special_tokens,
    user_token,
)

# Conversations, as mlx_lm.server hands them to the encoder (tool call
# arguments decoded), each with the options of the call.

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
DSML = "｜DSML｜"


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
HI = user("Hi")
HELLO = assistant("Hello!", "A greeting.")
ASK = user("Weather in Paris?")
CALLS = assistant("", "Ask the tool.", tool_calls=[PARIS])
SUNNY = tool("Sunny", "call_1")
REMINDER = msg("latest_reminder", "Today is Monday.")
ARGS = {"s": "x\ny", "n": 1.5, "b": True, "z": None, "l": [1, "a"], "o": {"k": "é"}}
BOTH = assistant("", "Both.", tool_calls=[PARIS, ROME, NOW])
RESULTS = [tool("9:00", "call_3"), tool("Sunny", "call_1"), tool("Rain", "call_2")]
PARTS = tool([{"type": "text", "text": t} for t in ("Sunny", "22 C")], "call_1")
EVERY_TYPE = assistant("Ok.", tool_calls=[call("c", "f", {**ARGS, "q": "42"})])
MAX = {"reasoning_effort": "max"}

T = {"tools": TOOLS}
CHAT = {"enable_thinking": False}
CONT = {"continue_final_message": True, "add_generation_prompt": False}

# (name, messages, options); the output of each is EXPECTED[name]. The
# deeper sweep, 35 more: checks/test_deepseek_v4_chat_format.py.
CASES = [
    ("one user turn, thinking", [HI], {}),
    ("one user turn, chat", [HI], CHAT),
    ("system and user", [SYS, HI], {}),
    ("no generation prompt", [SYS, HI], {"add_generation_prompt": False}),
    ("tools with a system message", [SYS, HI], T),
    ("earlier reasoning dropped", [SYS, HI, HELLO, ASK], {}),
    ("earlier reasoning kept with tools", [SYS, HI, HELLO, ASK], T),
    ("tool call and result", [SYS, ASK, CALLS, SUNNY], T),
    ("tool results sorted into call order", [ASK, BOTH, *RESULTS], T),
    ("tool result as text parts", [ASK, CALLS, PARTS], T),
    ("arguments of every JSON type", [HI, EVERY_TYPE, tool("done")], T),
    ("reasoning effort max", [SYS, HI], MAX),
    ("response format", [SYS, HI], {"response_format": {"type": "json_object"}}),
    ("developer message", [msg("developer", "Answer in French.")], {}),
    ("latest reminder after the user turn", [SYS, HI, REMINDER], {}),
    ("continue the final message", [HI, assistant("Hel", "Greet.")], CONT),
    ("action task", [user("Weather in Paris?", task="action")], {}),
]


# Rendered by DeepSeek's encoding_dsv4.py (sha256 bdbd57c1...5055e0).
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
    "tool results sorted into call order": '<｜begin▁of▁sentence｜>\n\n⟦tools⟧<｜User｜>Weather in Paris?<｜Assistant｜><think>Both.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Rome</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name="get_time">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny</tool_result>\n\n<tool_result>Rain</tool_result>\n\n<tool_result>9:00</tool_result><｜Assistant｜><think>',
    "tool result as text parts": '<｜begin▁of▁sentence｜>\n\n⟦tools⟧<｜User｜>Weather in Paris?<｜Assistant｜><think>Ask the tool.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny\n\n22 C</tool_result><｜Assistant｜><think>',
    "arguments of every JSON type": '<｜begin▁of▁sentence｜>\n\n⟦tools⟧<｜User｜>Hi<｜Assistant｜><think></think>Ok.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="s" string="true">x\ny</｜DSML｜parameter>\n<｜DSML｜parameter name="n" string="false">1.5</｜DSML｜parameter>\n<｜DSML｜parameter name="b" string="false">true</｜DSML｜parameter>\n<｜DSML｜parameter name="z" string="false">null</｜DSML｜parameter>\n<｜DSML｜parameter name="l" string="false">[1, "a"]</｜DSML｜parameter>\n<｜DSML｜parameter name="o" string="false">{"k": "é"}</｜DSML｜parameter>\n<｜DSML｜parameter name="q" string="true">42</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>done</tool_result><｜Assistant｜><think>',
    "reasoning effort max": "<｜begin▁of▁sentence｜>Reasoning Effort: Absolute maximum with no shortcuts permitted.\nYou MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\nExplicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\nBe brief.<｜User｜>Hi<｜Assistant｜><think>",
    "response format": '<｜begin▁of▁sentence｜>Be brief.\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n{"type": "json_object"}<｜User｜>Hi<｜Assistant｜><think>',
    "developer message": "<｜begin▁of▁sentence｜><｜User｜>Answer in French.<｜Assistant｜><think>",
    "latest reminder after the user turn": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜><think><｜latest_reminder｜>Today is Monday.",
    "continue the final message": "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>Greet.</think>Hel",
    "action task": "<｜begin▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think><｜action｜>",
}
EXPECTED = {k: v.replace("⟦tools⟧", TOOLS_BLOCK) for k, v in EXPECTED.items()}


# DeepSeek's effort prompts, byte for byte: the original's "max" is 0731's
# "high"; 0731's "max" (encoding_dsv4.py of V4-Flash-0731 and later).
ABSOLUTE = "Reasoning Effort: Absolute maximum with no shortcuts permitted.\nYou MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\nExplicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n"
BEYOND = "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\nYou MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively decompose the problem into its most fundamental components, trace every causal chain to its root, and resolve the underlying cause rather than any surface symptom.\nDo not stop reasoning until you have independently verified the solution from multiple angles and are certain that no assumption remains unchecked and no error remains undiscovered.\n\n"

# 0731's encoder is the original's but for the effort prompts (the two
# releases' encoding/tests/ are the same files): in thinking mode the prompt
# of the effort goes right after the BOS, "low" (the default) adding none.
PROMPTS_0731 = {None: "", "low": "", "high": ABSOLUTE, "max": BEYOND}
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

# OpenAI's reasoning_effort values and the DeepSeek effort each renders in
# the original format and in 0731's ("-": chat mode).
OPENAI_EFFORTS = """
none     -     -
minimal  high  low
low      high  low
medium   high  low
high     high  high
xhigh    max   high
max      max   max
"""
OPENAI_EFFORTS = {
    chat_format: {
        row.split()[0]: row.split()[i].replace("-", "") or None
        for row in OPENAI_EFFORTS.strip().split("\n")
    }
    for i, chat_format in ((1, "original"), (2, "0731"))
}


def make_checkpoint(path, config=None, encoder=None):
    """A checkpoint's tokenizer that names DeepSeek-V4's encoder and DSML
    parser (as deepseek_v4's TOKENIZER_DEFAULTS do), with its config.json
    and its own encoding/encoding_dsv4.py if given."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = list(special_tokens) + ["Hi"]
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


class TestDeepseekV4ChatTemplate(unittest.TestCase):

    def test_conversations_render_as_deepseeks_encoder(self):
        for name, messages, kwargs in CASES:
            with self.subTest(name):
                kwargs = {"add_generation_prompt": True, **kwargs}
                out = apply_chat_template(messages, **kwargs)
                self.assertEqual(out, EXPECTED[name])

    def test_0731_conversations_render_as_deepseeks_encoder(self):
        self.assertEqual(len({ABSOLUTE, BEYOND, ""}), 3)
        for name, messages, kwargs in CASES:
            if name not in CASES_0731:
                continue
            thinking = kwargs.get("enable_thinking", True)
            for effort, prompt in PROMPTS_0731.items():
                with self.subTest(name, reasoning_effort=effort):
                    options = {"add_generation_prompt": True, **kwargs}
                    if effort is not None:
                        options["reasoning_effort"] = effort
                    out = apply_chat_template(messages, chat_format="0731", **options)
                    want = EXPECTED[name]
                    if thinking:
                        want = bos_token + prompt + want.removeprefix(bos_token)
                    self.assertEqual(out, want)

    def test_openai_reasoning_efforts_map_as_vllm_maps_them(self):
        messages = [SYS, HI]
        for chat_format, efforts in OPENAI_EFFORTS.items():

            def render(**kwargs):
                return apply_chat_template(
                    messages,
                    add_generation_prompt=True,
                    chat_format=chat_format,
                    **kwargs,
                )

            for effort, native in efforts.items():
                with self.subTest(chat_format, reasoning_effort=effort):
                    want = (
                        render(enable_thinking=False)
                        if native is None
                        else render(reasoning_effort=native)
                    )
                    self.assertEqual(render(reasoning_effort=effort), want)
            with self.assertRaisesRegex(ValueError, "'none', 'minimal', 'low'"):
                render(reasoning_effort="lowest")
        original = apply_chat_template(messages, add_generation_prompt=True)
        self.assertEqual(original, EXPECTED["system and user"])

    def test_each_checkpoint_gets_its_chat_format(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        dspark = {"dspark_block_size": 5}
        # Its own encoder wins over its config; it is read, never run.
        run = "raise SystemExit('executed')\n"
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
                    [HI], add_generation_prompt=True, tokenize=False, **MAX
                )
                self.assertEqual(out, bos_token + prompt + turn)
        # chat_template_kwargs / --chat-template-config name another.
        out = tokenizer.apply_chat_template(
            [HI],
            add_generation_prompt=True,
            tokenize=False,
            chat_format="original",
            **MAX,
        )
        self.assertEqual(out, bos_token + ABSOLUTE + turn)

    def test_arguments_as_json_text_or_decoded_render_the_same(self):
        decoded = {"city": "Paris", "days": 2}
        for a in (decoded, json.dumps(decoded)):
            calls = [{"function": {"name": "f", "arguments": a}}]
            self.assertEqual(
                render_tool_calls(calls),
                f'\n\n<{DSML}tool_calls>\n<{DSML}invoke name="f">\n'
                f'<{DSML}parameter name="city" string="true">Paris</{DSML}parameter>\n'
                f'<{DSML}parameter name="days" string="false">2</{DSML}parameter>\n'
                f"</{DSML}invoke>\n</{DSML}tool_calls>",
            )

    def test_inputs_deepseeks_encoder_rejects_raise_naming_the_field(self):
        hi = {"role": "user", "content": "Hi"}

        def assistant(call):
            return {"role": "assistant", "content": "", "tool_calls": [call]}

        bad = [
            ("reasoning_effort", [hi], {"reasoning_effort": "lowest"}),
            ("'deep'", [hi], {"deep": True}),
            ("developer", [{"role": "developer", "content": ""}], {}),
            ("role 'bot'", [hi, {"role": "bot", "content": "x"}], {}),
            (
                "JSON object",
                [hi, assistant({"function": {"name": "f", "arguments": "[1]"}})],
                {},
            ),
            ("'function'", [hi, assistant({"name": "f", "arguments": {}})], {}),
            ("task", [{"role": "user", "content": "x", "task": "bogus"}], {}),
            (r"messages\[0\]: user content", [{"role": "user", "content": None}], {}),
            (r"tools\[0\]", [hi], {"tools": [{"name": "f"}]}),
            ("thinking_mode", [hi], {"thinking_mode": "deep"}),
            ("chat_format", [hi], {"chat_format": "0730"}),
            (
                "reasoning_effort",
                [hi],
                {"chat_format": "0731", **{"reasoning_effort": "x"}},
            ),
            (
                "continue_final_message",
                [{"role": "system", "content": "s"}],
                {"continue_final_message": True},
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
