# Copyright © 2026 Apple Inc.

import json
import shutil
import tempfile
import unittest
from pathlib import Path

from mlx_lm.chat_templates.deepseek_v4 import (
    apply_chat_template,
    bos_token,
    chat_format_of,
    for_checkpoint,
    render_tool_calls,
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
SYS_WEATHER = msg("system", "Be brief.", tools=[WEATHER])
HI = user("Hi")
HELLO = assistant("Hello!", "A greeting.")
OFFER = assistant("Anything else?", "Offer help.")
ASK = user("Weather in Paris?")
CALLS = assistant("", "Ask the tool.", tool_calls=[PARIS])
SUNNY = tool("Sunny", "call_1")
ANSWER = assistant("It is sunny.", "Sunny it is.")
THANKS = [ASK, CALLS, SUNNY, ANSWER, user("Thanks")]
DEV = msg("developer", "Be kind.")
REMINDER = msg("latest_reminder", "Today is Monday.")
ARGS = {"s": "x\ny", "n": 1.5, "b": True, "z": None, "l": [1, "a"], "o": {"k": "é"}}
BOTH = assistant("", "Both.", tool_calls=[PARIS, ROME, NOW])
RESULTS = [tool("9:00", "call_3"), tool("Sunny", "call_1"), tool("Rain", "call_2")]
PARTS = tool([{"type": "text", "text": t} for t in ("Sunny", "22 C")], "call_1")
EVERY_TYPE = assistant("Ok.", tool_calls=[call("c", "f", {**ARGS, "q": "42"})])
NOT_JSON = assistant("", tool_calls=[call("c", "f", "not json")])
ASK_TIME = [user("Time?"), assistant("", tool_calls=[NOW]), RESULTS[0]]
FRENCH = msg("system", "Use French.")
VERBOSE = msg("system", "Now be verbose.")
MAX = {"reasoning_effort": "max"}
SCHEMA = {"type": "json_schema", "json_schema": {"name": "w"}}

T = {"tools": TOOLS}
CHAT = {"enable_thinking": False}
KEEP = {"drop_thinking": False}
CONT = {"continue_final_message": True, "add_generation_prompt": False}
HM = {"reasoning_content": "Hm"}
ASK_TOOL = assistant("", "Ask.", tool_calls=[PARIS])
NOT_READ = assistant("Hello!", reasoning="ignored")
HEL_LO = [HI, assistant("Hel", wo_eos=True), assistant("lo!"), ASK]
JSON_DEV = msg("developer", "Reply in JSON.", response_format={"type": "json_object"})
TITLE = [user("Weather?", task="title"), assistant("Weather"), ASK]

# (name, messages, options); the output of each is EXPECTED[name].
CASES = [
    ("one user turn, thinking", [HI], {}),
    ("one user turn, chat", [HI], CHAT),
    ("system and user", [SYS, HI], {}),
    ("no generation prompt", [SYS, HI], {"add_generation_prompt": False}),
    ("empty user text", [user("")], {}),
    ("tools without a system message", [HI], T),
    ("tools with an empty system message", [msg("system", ""), HI], T),
    ("tools with a system message", [SYS, HI], T),
    ("tools in chat mode", [SYS, HI], {**T, **CHAT}),
    ("earlier reasoning dropped", [SYS, HI, HELLO, ASK], {}),
    ("earlier reasoning kept with drop_thinking=False", [SYS, HI, HELLO, ASK], KEEP),
    ("earlier reasoning kept with tools", [SYS, HI, HELLO, ASK], T),
    ("multi-turn chat mode", [SYS, HI, HELLO, ASK], CHAT),
    ("tool call and result", [SYS, ASK, CALLS, SUNNY], T),
    ("tool call and result, chat mode", [SYS, ASK, CALLS, SUNNY], {**T, **CHAT}),
    ("answer after a tool result", [SYS, ASK, CALLS, SUNNY, ANSWER, user("Thanks")], T),
    ("tool results sorted into call order", [ASK, BOTH, *RESULTS], T),
    ("tool results then user text", [ASK, CALLS, SUNNY, user("And tomorrow?")], T),
    ("tool result as text parts", [ASK, CALLS, PARTS], T),
    ("call without arguments", ASK_TIME, T),
    ("arguments of every JSON type", [HI, EVERY_TYPE, tool("done")], T),
    ("arguments that are not JSON", [HI, NOT_JSON, tool("done")], T),
    ("tool calls without tools dropping reasoning", [*THANKS], {}),
    ("tool result is the last user turn", [ASK, CALLS, SUNNY, ANSWER], {}),
    ("reasoning effort max", [SYS, HI], MAX),
    ("reasoning effort max with tools", [HI], {**MAX, **T}),
    ("reasoning effort max in chat mode", [SYS, HI], {**MAX, **CHAT}),
    ("reasoning effort high", [SYS, HI], {"reasoning_effort": "high"}),
    ("response format", [SYS, HI], {"response_format": {"type": "json_object"}}),
    ("response format and tools", [HI], {"response_format": SCHEMA, **T}),
    ("system message mid-conversation", [SYS, HI, HELLO, VERBOSE, ASK], {}),
    ("two leading system messages", [SYS, FRENCH, HI], {}),
    ("two leading system messages with tools", [SYS, FRENCH, HI], T),
    ("developer message", [msg("developer", "Answer in French.")], {}),
    ("developer message with tools on it", [msg("developer", "Use tools.", **T)], {}),
    ("developer message before the last user turn", [SYS, DEV, HELLO, ASK], {}),
    ("developer message kept with drop_thinking=False", [SYS, DEV, HELLO, ASK], KEEP),
    ("system message with tools on it", [SYS_WEATHER, ASK, CALLS, SUNNY], {}),
    ("latest reminder after the user turn", [SYS, HI, REMINDER], {}),
    ("latest reminder mid-conversation", [SYS, HI, REMINDER, HELLO, ASK], {}),
    ("two assistant messages in a row", [HI, HELLO, OFFER, ASK], KEEP),
    ("ends with an assistant message", [HI, HELLO], {}),
    ("continue the final message", [HI, assistant("Hel", "Greet.")], CONT),
    ("continue after reasoning only", [HI, {"role": "assistant", **HM}], CONT),
    ("continue in chat mode", [HI, assistant("Hel")], {**CONT, **CHAT}),
    ("continue after tool calls", [ASK, ASK_TOOL], {**CONT, **T}),
    ("reasoning read only from reasoning_content", [HI, NOT_READ, ASK], KEEP),
    ("query task", [user("Weather in Paris?", task="query")], {}),
    ("action task", [user("Weather in Paris?", task="action")], {}),
    ("wo_eos on an earlier assistant message", HEL_LO, KEEP),
    ("response format on a developer message", [JSON_DEV], CHAT),
    ("task output has no reasoning", TITLE, {}),
]


# Rendered by DeepSeek's encoding_dsv4.py (sha256 bdbd57c1...5055e0).
TOOLS_BLOCK = '## Tools\n\nYou have access to a set of tools to help answer the user\'s question. You can invoke tools by writing a "<｜DSML｜tool_calls>" block like the following:\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="$TOOL_NAME">\n<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n<｜DSML｜invoke name="$TOOL_NAME2">\n...\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>\n\nString parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.\n\nIf thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\nOtherwise, output directly after </think> with tool calls or final response.\n\n### Available Tool Schemas\n\n{"name": "get_weather", "description": "The weather in a city.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}\n{"name": "get_time", "description": "The time now.", "parameters": {"type": "object", "properties": {}}}\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n'
WEATHER_BLOCK = '## Tools\n\nYou have access to a set of tools to help answer the user\'s question. You can invoke tools by writing a "<｜DSML｜tool_calls>" block like the following:\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="$TOOL_NAME">\n<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n<｜DSML｜invoke name="$TOOL_NAME2">\n...\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>\n\nString parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.\n\nIf thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\nOtherwise, output directly after </think> with tool calls or final response.\n\n### Available Tool Schemas\n\n{"name": "get_weather", "description": "The weather in a city.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n'
# ⟦tools⟧ and ⟦weather⟧ stand for the two blocks.
EXPECTED = {
    "one user turn, thinking": "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>",
    "one user turn, chat": "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>",
    "system and user": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜><think>",
    "no generation prompt": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi",
    "empty user text": "<｜begin▁of▁sentence｜><｜User｜><｜Assistant｜><think>",
    "tools without a system message": "<｜begin▁of▁sentence｜>\n\n⟦tools⟧<｜User｜>Hi<｜Assistant｜><think>",
    "tools with an empty system message": "<｜begin▁of▁sentence｜>\n\n⟦tools⟧<｜User｜>Hi<｜Assistant｜><think>",
    "tools with a system message": "<｜begin▁of▁sentence｜>Be brief.\n\n⟦tools⟧<｜User｜>Hi<｜Assistant｜><think>",
    "tools in chat mode": "<｜begin▁of▁sentence｜>Be brief.\n\n⟦tools⟧<｜User｜>Hi<｜Assistant｜></think>",
    "earlier reasoning dropped": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜></think>Hello!<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think>",
    "earlier reasoning kept with drop_thinking=False": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜><think>A greeting.</think>Hello!<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think>",
    "earlier reasoning kept with tools": "<｜begin▁of▁sentence｜>Be brief.\n\n⟦tools⟧<｜User｜>Hi<｜Assistant｜><think>A greeting.</think>Hello!<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think>",
    "multi-turn chat mode": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜></think>Hello!<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜></think>",
    "tool call and result": '<｜begin▁of▁sentence｜>Be brief.\n\n⟦tools⟧<｜User｜>Weather in Paris?<｜Assistant｜><think>Ask the tool.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny</tool_result><｜Assistant｜><think>',
    "tool call and result, chat mode": '<｜begin▁of▁sentence｜>Be brief.\n\n⟦tools⟧<｜User｜>Weather in Paris?<｜Assistant｜></think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny</tool_result><｜Assistant｜></think>',
    "answer after a tool result": '<｜begin▁of▁sentence｜>Be brief.\n\n⟦tools⟧<｜User｜>Weather in Paris?<｜Assistant｜><think>Ask the tool.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny</tool_result><｜Assistant｜><think>Sunny it is.</think>It is sunny.<｜end▁of▁sentence｜><｜User｜>Thanks<｜Assistant｜><think>',
    "tool results sorted into call order": '<｜begin▁of▁sentence｜>\n\n⟦tools⟧<｜User｜>Weather in Paris?<｜Assistant｜><think>Both.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Rome</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name="get_time">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny</tool_result>\n\n<tool_result>Rain</tool_result>\n\n<tool_result>9:00</tool_result><｜Assistant｜><think>',
    "tool results then user text": '<｜begin▁of▁sentence｜>\n\n⟦tools⟧<｜User｜>Weather in Paris?<｜Assistant｜><think>Ask the tool.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny</tool_result>\n\nAnd tomorrow?<｜Assistant｜><think>',
    "tool result as text parts": '<｜begin▁of▁sentence｜>\n\n⟦tools⟧<｜User｜>Weather in Paris?<｜Assistant｜><think>Ask the tool.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny\n\n22 C</tool_result><｜Assistant｜><think>',
    "call without arguments": '<｜begin▁of▁sentence｜>\n\n⟦tools⟧<｜User｜>Time?<｜Assistant｜><think></think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_time">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>9:00</tool_result><｜Assistant｜><think>',
    "arguments of every JSON type": '<｜begin▁of▁sentence｜>\n\n⟦tools⟧<｜User｜>Hi<｜Assistant｜><think></think>Ok.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="s" string="true">x\ny</｜DSML｜parameter>\n<｜DSML｜parameter name="n" string="false">1.5</｜DSML｜parameter>\n<｜DSML｜parameter name="b" string="false">true</｜DSML｜parameter>\n<｜DSML｜parameter name="z" string="false">null</｜DSML｜parameter>\n<｜DSML｜parameter name="l" string="false">[1, "a"]</｜DSML｜parameter>\n<｜DSML｜parameter name="o" string="false">{"k": "é"}</｜DSML｜parameter>\n<｜DSML｜parameter name="q" string="true">42</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>done</tool_result><｜Assistant｜><think>',
    "arguments that are not JSON": '<｜begin▁of▁sentence｜>\n\n⟦tools⟧<｜User｜>Hi<｜Assistant｜><think></think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="arguments" string="true">not json</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>done</tool_result><｜Assistant｜><think>',
    "tool calls without tools dropping reasoning": '<｜begin▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜></think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny</tool_result><｜Assistant｜></think>It is sunny.<｜end▁of▁sentence｜><｜User｜>Thanks<｜Assistant｜><think>',
    "tool result is the last user turn": '<｜begin▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜></think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny</tool_result><｜Assistant｜><think>Sunny it is.</think>It is sunny.<｜end▁of▁sentence｜>',
    "reasoning effort max": "<｜begin▁of▁sentence｜>Reasoning Effort: Absolute maximum with no shortcuts permitted.\nYou MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\nExplicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\nBe brief.<｜User｜>Hi<｜Assistant｜><think>",
    "reasoning effort max with tools": "<｜begin▁of▁sentence｜>Reasoning Effort: Absolute maximum with no shortcuts permitted.\nYou MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\nExplicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n\n\n⟦tools⟧<｜User｜>Hi<｜Assistant｜><think>",
    "reasoning effort max in chat mode": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜></think>",
    "reasoning effort high": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜><think>",
    "response format": '<｜begin▁of▁sentence｜>Be brief.\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n{"type": "json_object"}<｜User｜>Hi<｜Assistant｜><think>',
    "response format and tools": '<｜begin▁of▁sentence｜>\n\n⟦tools⟧\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n{"type": "json_schema", "json_schema": {"name": "w"}}<｜User｜>Hi<｜Assistant｜><think>',
    "system message mid-conversation": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜></think>Hello!<｜end▁of▁sentence｜>Now be verbose.<｜User｜>Weather in Paris?<｜Assistant｜><think>",
    "two leading system messages": "<｜begin▁of▁sentence｜>Be brief.Use French.<｜User｜>Hi<｜Assistant｜><think>",
    "two leading system messages with tools": "<｜begin▁of▁sentence｜>Be brief.\n\n⟦tools⟧Use French.<｜User｜>Hi<｜Assistant｜><think>",
    "developer message": "<｜begin▁of▁sentence｜><｜User｜>Answer in French.<｜Assistant｜><think>",
    "developer message with tools on it": "<｜begin▁of▁sentence｜><｜User｜>Use tools.\n\n⟦tools⟧<｜Assistant｜><think>",
    "developer message before the last user turn": "<｜begin▁of▁sentence｜>Be brief.Hello!<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think>",
    "developer message kept with drop_thinking=False": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Be kind.<｜Assistant｜><think>A greeting.</think>Hello!<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think>",
    "system message with tools on it": '<｜begin▁of▁sentence｜>Be brief.\n\n⟦weather⟧<｜User｜>Weather in Paris?<｜Assistant｜><think>Ask the tool.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny</tool_result><｜Assistant｜><think>',
    "latest reminder after the user turn": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜><think><｜latest_reminder｜>Today is Monday.",
    "latest reminder mid-conversation": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜></think><｜latest_reminder｜>Today is Monday.Hello!<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think>",
    "two assistant messages in a row": "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>A greeting.</think>Hello!<｜end▁of▁sentence｜>Offer help.</think>Anything else?<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think>",
    "ends with an assistant message": "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>A greeting.</think>Hello!<｜end▁of▁sentence｜>",
    "continue the final message": "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>Greet.</think>Hel",
    "continue after reasoning only": "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>Hm</think>",
    "continue in chat mode": "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>Hel",
    "continue after tool calls": '<｜begin▁of▁sentence｜>\n\n⟦tools⟧<｜User｜>Weather in Paris?<｜Assistant｜><think>Ask.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>',
    "reasoning read only from reasoning_content": "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think></think>Hello!<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think>",
    "query task": "<｜begin▁of▁sentence｜><｜User｜>Weather in Paris?<｜query｜>",
    "action task": "<｜begin▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think><｜action｜>",
    "wo_eos on an earlier assistant message": "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think></think>Hel</think>lo!<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think>",
    "response format on a developer message": '<｜begin▁of▁sentence｜><｜User｜>Reply in JSON.\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n{"type": "json_object"}<｜Assistant｜></think>',
    "task output has no reasoning": "<｜begin▁of▁sentence｜><｜User｜>Weather?<｜title｜>Weather<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think>",
}
EXPECTED = {
    k: v.replace("⟦tools⟧", TOOLS_BLOCK).replace("⟦weather⟧", WEATHER_BLOCK)
    for k, v in EXPECTED.items()
}


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
    "tools without a system message",
    "tools in chat mode",
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

# A block whose value holds a whole block end: it runs to the reply's end.
STREAMED = (
    '\n<｜DSML｜invoke name="write">\n<｜DSML｜parameter name="text" string="true"></｜DSML｜invoke>\n</｜DSML｜tool_calls></｜DSML｜parameter>\n<｜DSML｜parameter name="after" string="true">kept</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name="g">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>',
    [
        {
            "name": "write",
            "arguments": {
                "text": "</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
                "after": "kept",
            },
        },
        {"name": "g", "arguments": {}},
    ],
)

DSML = "｜DSML｜"


def invoke(city, name="get_weather"):
    return (
        f'<{DSML}invoke name="{name}">\n'
        f'<{DSML}parameter name="city" string="true">{city}</{DSML}parameter>\n'
        f"</{DSML}invoke>"
    )


def block(body, opener=f"<{DSML}tool_calls>"):
    return f"{opener}\n{body}\n</{DSML}tool_calls>"


SEOUL = [{"name": "get_weather", "arguments": {"city": "Seoul"}}]
QUOTE = block(invoke("Paris"))

# Replies with DSML written slightly damaged, as vLLM's and SGLang's
# DeepSeek-V4 parsers recover it: (name, reply, content, calls).
DAMAGED_CASES = [
    (
        "an invoke without the tool_calls wrapper",
        "Checking.\n" + invoke("Seoul") + f"\n</{DSML}tool_calls>",
        "Checking.\n",
        SEOUL,
    ),
    (
        "an invoke without the wrapper or its end",
        "Checking.\n" + invoke("Seoul"),
        "Checking.\n",
        SEOUL,
    ),
    (
        "the opener misspelled toolcalls",
        "\n\n" + block(invoke("Seoul"), f"<{DSML}toolcalls>"),
        "",
        SEOUL,
    ),
    (
        "the opener cut to tool",
        "\n\n" + block(invoke("Seoul"), f"<{DSML}tool>"),
        "",
        SEOUL,
    ),
    (
        "the opener without its >",
        "Sure.\n\n" + block(invoke("Seoul"), f"<{DSML}tool_calls"),
        "Sure.",
        SEOUL,
    ),
    (
        "indented lines",
        "Let me check.\n\n"
        + "\n".join("  " + line for line in block(invoke("Seoul")).split("\n")),
        "Let me check.\n\n  ",
        SEOUL,
    ),
    (
        "DSML quoted in a code fence before the call",
        f"The format:\n\n```\n{QUOTE}\n```\n\nNow the call:\n\n"
        + block(invoke("Seoul")),
        f"The format:\n\n```\n{QUOTE}\n```\n\nNow the call:",
        SEOUL,
    ),
    (
        "an invoke quoted in a fence with a language, then a bare invoke",
        f"```xml\n{invoke('Paris')}\n```\nCalling it:\n" + invoke("Seoul"),
        f"```xml\n{invoke('Paris')}\n```\nCalling it:\n",
        SEOUL,
    ),
]

# Replies whose DSML is not a call: the whole reply is content.
NOT_CALLS = [
    ("DSML only quoted in a code fence", f"Like this:\n\n```\n{QUOTE}\n```\n\nDone."),
    ("a truncated invoke", f'Docs quote <{DSML}invoke name="get_wea'),
    ("an invoke of an undeclared tool", invoke("Seoul", name="not_declared")),
    (
        "an invoke without its closing tag",
        invoke("Seoul").removesuffix(f"</{DSML}invoke>"),
    ),
    ("a function_calls block", block(invoke("Seoul"), f"<{DSML}function_calls>")),
    ("a tag in prose", f'The tag <{DSML}invoke name="get_weather"> starts a call.'),
    ("an invoke then text", invoke("Seoul") + "\nThat is all."),
]


class TestDeepseekV4ChatTemplate(unittest.TestCase):

    def test_conversations_render_as_deepseeks_encoder(self):
        self.assertGreaterEqual(len(CASES), 30)
        for name, messages, kwargs in CASES:
            with self.subTest(name):
                kwargs = {"add_generation_prompt": True, **kwargs}
                out = apply_chat_template(messages, **kwargs)
                self.assertEqual(out, EXPECTED[name])

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

    def test_the_chat_format_is_read_from_the_checkpoint(self):
        def checkpoint(config, encoder=None):
            path = Path(tempfile.mkdtemp())
            self.addCleanup(shutil.rmtree, path)
            if config is not None:
                (path / "config.json").write_text(json.dumps(config))
            if encoder is not None:
                # Read as text, never run.
                (path / "encoding").mkdir()
                text = "raise SystemExit('executed')\n" + encoder
                (path / "encoding" / "encoding_dsv4.py").write_text(text)
            return path

        dspark = {"dspark_block_size": 5}
        cases = [
            (None, None, "original"),
            ({"model_type": "deepseek_v4"}, None, "original"),
            (dspark, None, "0731"),
            ({}, f"PROMPT = {BEYOND!r}", "0731"),
            (dspark, "REASONING_EFFORT_MAX = ''", "original"),
            ({"dspark_markov_rank": 256}, "# another encoder", "0731"),
        ]
        for config, encoder, chat_format in cases:
            with self.subTest(config=config, encoder=encoder):
                self.assertEqual(
                    chat_format_of(checkpoint(config, encoder)), chat_format
                )
        template = for_checkpoint(checkpoint(dspark))
        self.assertTrue(template.keeps_tool_parts)
        out = template([SYS, HI], add_generation_prompt=True, **MAX)
        want = EXPECTED["system and user"].removeprefix(bos_token)
        self.assertEqual(out, bos_token + BEYOND + want)
        # chat_template_kwargs / --chat-template-config name another.
        out = template(
            [SYS, HI], add_generation_prompt=True, chat_format="original", **MAX
        )
        self.assertEqual(out, EXPECTED["reasoning effort max"])

    def test_continue_final_message_leaves_a_user_turn_open(self):
        # As mlx_lm.cache_prompt asks: the turn ends where its text ends.
        for role in ("user", "developer"):
            with self.subTest(role):
                messages = [{"role": role, "content": "The quick"}]
                text = apply_chat_template(messages, continue_final_message=True)
                self.assertEqual(text, f"{bos_token}{user_token}The quick")
                self.assertEqual(text, apply_chat_template(messages))

    def test_messages_are_not_changed(self):
        messages = json.loads(json.dumps(CASES[13][1]))
        before = json.dumps(messages)
        apply_chat_template(messages, tools=TOOLS, continue_final_message=False)
        self.assertEqual(json.dumps(messages), before)


if __name__ == "__main__":
    unittest.main()
