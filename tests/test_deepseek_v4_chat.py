# Copyright © 2026 Apple Inc.

import json
import unittest

from mlx_lm.chat_templates.deepseek_v4 import (
    apply_chat_template,
    bos_token,
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


PARIS = call("call_1", "get_weather", {"city": "Paris", "days": 2})
ROME = call("call_2", "get_weather", {"city": "Rome"})
NOW = call("call_3", "get_time", {})

SYS = {"role": "system", "content": "Be brief."}
HI = {"role": "user", "content": "Hi"}
HELLO = {"role": "assistant", "content": "Hello!", "reasoning_content": "A greeting."}
ASK = {"role": "user", "content": "Weather in Paris?"}
CALLS = {
    "role": "assistant",
    "content": "",
    "reasoning_content": "Ask the tool.",
    "tool_calls": [PARIS],
}
SUNNY = {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"}
ANSWER = {
    "role": "assistant",
    "content": "It is sunny.",
    "reasoning_content": "Sunny it is.",
}

CASES = [
    ("one user turn, thinking", [HI], {}),
    ("one user turn, chat", [HI], {"enable_thinking": False}),
    ("system and user", [SYS, HI], {}),
    ("no generation prompt", [SYS, HI], {"add_generation_prompt": False}),
    ("empty user text", [{"role": "user", "content": ""}], {}),
    ("tools without a system message", [HI], {"tools": TOOLS}),
    (
        "tools with an empty system message",
        [{"role": "system", "content": ""}, HI],
        {"tools": TOOLS},
    ),
    ("tools with a system message", [SYS, HI], {"tools": TOOLS}),
    ("tools in chat mode", [SYS, HI], {"tools": TOOLS, "enable_thinking": False}),
    ("earlier reasoning dropped", [SYS, HI, HELLO, ASK], {}),
    (
        "earlier reasoning kept with drop_thinking=False",
        [SYS, HI, HELLO, ASK],
        {"drop_thinking": False},
    ),
    ("earlier reasoning kept with tools", [SYS, HI, HELLO, ASK], {"tools": TOOLS}),
    ("multi-turn chat mode", [SYS, HI, HELLO, ASK], {"enable_thinking": False}),
    ("tool call and result", [SYS, ASK, CALLS, SUNNY], {"tools": TOOLS}),
    (
        "tool call and result, chat mode",
        [SYS, ASK, CALLS, SUNNY],
        {"tools": TOOLS, "enable_thinking": False},
    ),
    (
        "answer after a tool result",
        [SYS, ASK, CALLS, SUNNY, ANSWER, {"role": "user", "content": "Thanks"}],
        {"tools": TOOLS},
    ),
    (
        "tool results sorted into call order",
        [
            ASK,
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "Both.",
                "tool_calls": [PARIS, ROME, NOW],
            },
            {"role": "tool", "tool_call_id": "call_3", "content": "9:00"},
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
            {"role": "tool", "tool_call_id": "call_2", "content": "Rain"},
        ],
        {"tools": TOOLS},
    ),
    (
        "tool results then user text",
        [ASK, CALLS, SUNNY, {"role": "user", "content": "And tomorrow?"}],
        {"tools": TOOLS},
    ),
    (
        "tool result as text parts",
        [
            ASK,
            CALLS,
            {
                "role": "tool",
                "tool_call_id": "call_1",
                "content": [
                    {"type": "text", "text": "Sunny"},
                    {"type": "text", "text": "22 C"},
                ],
            },
        ],
        {"tools": TOOLS},
    ),
    (
        "call without arguments",
        [
            {"role": "user", "content": "Time?"},
            {"role": "assistant", "content": "", "tool_calls": [NOW]},
            {"role": "tool", "tool_call_id": "call_3", "content": "9:00"},
        ],
        {"tools": TOOLS},
    ),
    (
        "arguments of every JSON type",
        [
            HI,
            {
                "role": "assistant",
                "content": "Ok.",
                "tool_calls": [
                    call(
                        "c",
                        "f",
                        {
                            "s": "x\ny",
                            "n": 1.5,
                            "b": True,
                            "z": None,
                            "l": [1, "a"],
                            "o": {"k": "é"},
                            "q": "42",
                        },
                    )
                ],
            },
            {"role": "tool", "content": "done"},
        ],
        {"tools": TOOLS},
    ),
    (
        "arguments that are not JSON",
        [
            HI,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [call("c", "f", "not json")],
            },
            {"role": "tool", "content": "done"},
        ],
        {"tools": TOOLS},
    ),
    (
        "tool calls without tools dropping reasoning",
        [ASK, CALLS, SUNNY, ANSWER, {"role": "user", "content": "Thanks"}],
        {},
    ),
    ("tool result is the last user turn", [ASK, CALLS, SUNNY, ANSWER], {}),
    ("reasoning effort max", [SYS, HI], {"reasoning_effort": "max"}),
    (
        "reasoning effort max with tools",
        [HI],
        {"reasoning_effort": "max", "tools": TOOLS},
    ),
    (
        "reasoning effort max in chat mode",
        [SYS, HI],
        {"reasoning_effort": "max", "enable_thinking": False},
    ),
    ("reasoning effort high", [SYS, HI], {"reasoning_effort": "high"}),
    ("response format", [SYS, HI], {"response_format": {"type": "json_object"}}),
    (
        "response format and tools",
        [HI],
        {
            "response_format": {"type": "json_schema", "json_schema": {"name": "w"}},
            "tools": TOOLS,
        },
    ),
    (
        "system message mid-conversation",
        [SYS, HI, HELLO, {"role": "system", "content": "Now be verbose."}, ASK],
        {},
    ),
    (
        "two leading system messages",
        [SYS, {"role": "system", "content": "Use French."}, HI],
        {},
    ),
    (
        "two leading system messages with tools",
        [SYS, {"role": "system", "content": "Use French."}, HI],
        {"tools": TOOLS},
    ),
    ("developer message", [{"role": "developer", "content": "Answer in French."}], {}),
    (
        "developer message with tools on it",
        [{"role": "developer", "content": "Use tools.", "tools": TOOLS}],
        {},
    ),
    (
        "developer message before the last user turn",
        [SYS, {"role": "developer", "content": "Be kind."}, HELLO, ASK],
        {},
    ),
    (
        "developer message kept with drop_thinking=False",
        [SYS, {"role": "developer", "content": "Be kind."}, HELLO, ASK],
        {"drop_thinking": False},
    ),
    (
        "system message with tools on it",
        [
            {"role": "system", "content": "Be brief.", "tools": [WEATHER]},
            ASK,
            CALLS,
            SUNNY,
        ],
        {},
    ),
    (
        "latest reminder after the user turn",
        [SYS, HI, {"role": "latest_reminder", "content": "Today is Monday."}],
        {},
    ),
    (
        "latest reminder mid-conversation",
        [
            SYS,
            HI,
            {"role": "latest_reminder", "content": "Today is Monday."},
            HELLO,
            ASK,
        ],
        {},
    ),
    (
        "two assistant messages in a row",
        [
            HI,
            HELLO,
            {
                "role": "assistant",
                "content": "Anything else?",
                "reasoning_content": "Offer help.",
            },
            ASK,
        ],
        {"drop_thinking": False},
    ),
    ("ends with an assistant message", [HI, HELLO], {}),
    (
        "continue the final message",
        [HI, {"role": "assistant", "content": "Hel", "reasoning_content": "Greet."}],
        {"continue_final_message": True, "add_generation_prompt": False},
    ),
    (
        "continue after reasoning only",
        [HI, {"role": "assistant", "reasoning_content": "Hm"}],
        {"continue_final_message": True, "add_generation_prompt": False},
    ),
    (
        "continue in chat mode",
        [HI, {"role": "assistant", "content": "Hel"}],
        {
            "continue_final_message": True,
            "add_generation_prompt": False,
            "enable_thinking": False,
        },
    ),
    (
        "continue after tool calls",
        [
            ASK,
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "Ask.",
                "tool_calls": [PARIS],
            },
        ],
        {
            "continue_final_message": True,
            "add_generation_prompt": False,
            "tools": TOOLS,
        },
    ),
    (
        "reasoning read only from reasoning_content",
        [HI, {"role": "assistant", "content": "Hello!", "reasoning": "ignored"}, ASK],
        {"drop_thinking": False},
    ),
    (
        "query task",
        [{"role": "user", "content": "Weather in Paris?", "task": "query"}],
        {},
    ),
    (
        "action task",
        [{"role": "user", "content": "Weather in Paris?", "task": "action"}],
        {},
    ),
    (
        "wo_eos on an earlier assistant message",
        [
            HI,
            {"role": "assistant", "content": "Hel", "wo_eos": True},
            {"role": "assistant", "content": "lo!"},
            ASK,
        ],
        {"drop_thinking": False},
    ),
    (
        "response format on a developer message",
        [
            {
                "role": "developer",
                "content": "Reply in JSON.",
                "response_format": {"type": "json_object"},
            }
        ],
        {"enable_thinking": False},
    ),
    (
        "task output has no reasoning",
        [
            {"role": "user", "content": "Weather?", "task": "title"},
            {"role": "assistant", "content": "Weather"},
            ASK,
        ],
        {},
    ),
]


# Rendered by DeepSeek's encoding_dsv4.py (sha256 bdbd57c1...5055e0).
TOOLS_BLOCK = '## Tools\n\nYou have access to a set of tools to help answer the user\'s question. You can invoke tools by writing a "<｜DSML｜tool_calls>" block like the following:\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="$TOOL_NAME">\n<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n<｜DSML｜invoke name="$TOOL_NAME2">\n...\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>\n\nString parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.\n\nIf thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\nOtherwise, output directly after </think> with tool calls or final response.\n\n### Available Tool Schemas\n\n{"name": "get_weather", "description": "The weather in a city.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}\n{"name": "get_time", "description": "The time now.", "parameters": {"type": "object", "properties": {}}}\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n'
WEATHER_BLOCK = '## Tools\n\nYou have access to a set of tools to help answer the user\'s question. You can invoke tools by writing a "<｜DSML｜tool_calls>" block like the following:\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="$TOOL_NAME">\n<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n<｜DSML｜invoke name="$TOOL_NAME2">\n...\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>\n\nString parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.\n\nIf thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\nOtherwise, output directly after </think> with tool calls or final response.\n\n### Available Tool Schemas\n\n{"name": "get_weather", "description": "The weather in a city.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n'
EXPECTED = {
    "one user turn, thinking": "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>",
    "one user turn, chat": "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>",
    "system and user": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜><think>",
    "no generation prompt": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi",
    "empty user text": "<｜begin▁of▁sentence｜><｜User｜><｜Assistant｜><think>",
    "tools without a system message": "<｜begin▁of▁sentence｜>\n\n"
    + TOOLS_BLOCK
    + "<｜User｜>Hi<｜Assistant｜><think>",
    "tools with an empty system message": "<｜begin▁of▁sentence｜>\n\n"
    + TOOLS_BLOCK
    + "<｜User｜>Hi<｜Assistant｜><think>",
    "tools with a system message": "<｜begin▁of▁sentence｜>Be brief.\n\n"
    + TOOLS_BLOCK
    + "<｜User｜>Hi<｜Assistant｜><think>",
    "tools in chat mode": "<｜begin▁of▁sentence｜>Be brief.\n\n"
    + TOOLS_BLOCK
    + "<｜User｜>Hi<｜Assistant｜></think>",
    "earlier reasoning dropped": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜></think>Hello!<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think>",
    "earlier reasoning kept with drop_thinking=False": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜><think>A greeting.</think>Hello!<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think>",
    "earlier reasoning kept with tools": "<｜begin▁of▁sentence｜>Be brief.\n\n"
    + TOOLS_BLOCK
    + "<｜User｜>Hi<｜Assistant｜><think>A greeting.</think>Hello!<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think>",
    "multi-turn chat mode": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜></think>Hello!<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜></think>",
    "tool call and result": "<｜begin▁of▁sentence｜>Be brief.\n\n"
    + TOOLS_BLOCK
    + '<｜User｜>Weather in Paris?<｜Assistant｜><think>Ask the tool.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny</tool_result><｜Assistant｜><think>',
    "tool call and result, chat mode": "<｜begin▁of▁sentence｜>Be brief.\n\n"
    + TOOLS_BLOCK
    + '<｜User｜>Weather in Paris?<｜Assistant｜></think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny</tool_result><｜Assistant｜></think>',
    "answer after a tool result": "<｜begin▁of▁sentence｜>Be brief.\n\n"
    + TOOLS_BLOCK
    + '<｜User｜>Weather in Paris?<｜Assistant｜><think>Ask the tool.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny</tool_result><｜Assistant｜><think>Sunny it is.</think>It is sunny.<｜end▁of▁sentence｜><｜User｜>Thanks<｜Assistant｜><think>',
    "tool results sorted into call order": "<｜begin▁of▁sentence｜>\n\n"
    + TOOLS_BLOCK
    + '<｜User｜>Weather in Paris?<｜Assistant｜><think>Both.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Rome</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name="get_time">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny</tool_result>\n\n<tool_result>Rain</tool_result>\n\n<tool_result>9:00</tool_result><｜Assistant｜><think>',
    "tool results then user text": "<｜begin▁of▁sentence｜>\n\n"
    + TOOLS_BLOCK
    + '<｜User｜>Weather in Paris?<｜Assistant｜><think>Ask the tool.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny</tool_result>\n\nAnd tomorrow?<｜Assistant｜><think>',
    "tool result as text parts": "<｜begin▁of▁sentence｜>\n\n"
    + TOOLS_BLOCK
    + '<｜User｜>Weather in Paris?<｜Assistant｜><think>Ask the tool.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny\n\n22 C</tool_result><｜Assistant｜><think>',
    "call without arguments": "<｜begin▁of▁sentence｜>\n\n"
    + TOOLS_BLOCK
    + '<｜User｜>Time?<｜Assistant｜><think></think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_time">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>9:00</tool_result><｜Assistant｜><think>',
    "arguments of every JSON type": "<｜begin▁of▁sentence｜>\n\n"
    + TOOLS_BLOCK
    + '<｜User｜>Hi<｜Assistant｜><think></think>Ok.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="s" string="true">x\ny</｜DSML｜parameter>\n<｜DSML｜parameter name="n" string="false">1.5</｜DSML｜parameter>\n<｜DSML｜parameter name="b" string="false">true</｜DSML｜parameter>\n<｜DSML｜parameter name="z" string="false">null</｜DSML｜parameter>\n<｜DSML｜parameter name="l" string="false">[1, "a"]</｜DSML｜parameter>\n<｜DSML｜parameter name="o" string="false">{"k": "é"}</｜DSML｜parameter>\n<｜DSML｜parameter name="q" string="true">42</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>done</tool_result><｜Assistant｜><think>',
    "arguments that are not JSON": "<｜begin▁of▁sentence｜>\n\n"
    + TOOLS_BLOCK
    + '<｜User｜>Hi<｜Assistant｜><think></think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="arguments" string="true">not json</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>done</tool_result><｜Assistant｜><think>',
    "tool calls without tools dropping reasoning": '<｜begin▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜></think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny</tool_result><｜Assistant｜></think>It is sunny.<｜end▁of▁sentence｜><｜User｜>Thanks<｜Assistant｜><think>',
    "tool result is the last user turn": '<｜begin▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜></think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny</tool_result><｜Assistant｜><think>Sunny it is.</think>It is sunny.<｜end▁of▁sentence｜>',
    "reasoning effort max": "<｜begin▁of▁sentence｜>Reasoning Effort: Absolute maximum with no shortcuts permitted.\nYou MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\nExplicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\nBe brief.<｜User｜>Hi<｜Assistant｜><think>",
    "reasoning effort max with tools": "<｜begin▁of▁sentence｜>Reasoning Effort: Absolute maximum with no shortcuts permitted.\nYou MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\nExplicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n\n\n"
    + TOOLS_BLOCK
    + "<｜User｜>Hi<｜Assistant｜><think>",
    "reasoning effort max in chat mode": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜></think>",
    "reasoning effort high": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜><think>",
    "response format": '<｜begin▁of▁sentence｜>Be brief.\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n{"type": "json_object"}<｜User｜>Hi<｜Assistant｜><think>',
    "response format and tools": "<｜begin▁of▁sentence｜>\n\n"
    + TOOLS_BLOCK
    + '\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n{"type": "json_schema", "json_schema": {"name": "w"}}<｜User｜>Hi<｜Assistant｜><think>',
    "system message mid-conversation": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜></think>Hello!<｜end▁of▁sentence｜>Now be verbose.<｜User｜>Weather in Paris?<｜Assistant｜><think>",
    "two leading system messages": "<｜begin▁of▁sentence｜>Be brief.Use French.<｜User｜>Hi<｜Assistant｜><think>",
    "two leading system messages with tools": "<｜begin▁of▁sentence｜>Be brief.\n\n"
    + TOOLS_BLOCK
    + "Use French.<｜User｜>Hi<｜Assistant｜><think>",
    "developer message": "<｜begin▁of▁sentence｜><｜User｜>Answer in French.<｜Assistant｜><think>",
    "developer message with tools on it": "<｜begin▁of▁sentence｜><｜User｜>Use tools.\n\n"
    + TOOLS_BLOCK
    + "<｜Assistant｜><think>",
    "developer message before the last user turn": "<｜begin▁of▁sentence｜>Be brief.Hello!<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think>",
    "developer message kept with drop_thinking=False": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Be kind.<｜Assistant｜><think>A greeting.</think>Hello!<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think>",
    "system message with tools on it": "<｜begin▁of▁sentence｜>Be brief.\n\n"
    + WEATHER_BLOCK
    + '<｜User｜>Weather in Paris?<｜Assistant｜><think>Ask the tool.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny</tool_result><｜Assistant｜><think>',
    "latest reminder after the user turn": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜><think><｜latest_reminder｜>Today is Monday.",
    "latest reminder mid-conversation": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜></think><｜latest_reminder｜>Today is Monday.Hello!<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think>",
    "two assistant messages in a row": "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>A greeting.</think>Hello!<｜end▁of▁sentence｜>Offer help.</think>Anything else?<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think>",
    "ends with an assistant message": "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>A greeting.</think>Hello!<｜end▁of▁sentence｜>",
    "continue the final message": "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>Greet.</think>Hel",
    "continue after reasoning only": "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>Hm</think>",
    "continue in chat mode": "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>Hel",
    "continue after tool calls": "<｜begin▁of▁sentence｜>\n\n"
    + TOOLS_BLOCK
    + '<｜User｜>Weather in Paris?<｜Assistant｜><think>Ask.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>',
    "reasoning read only from reasoning_content": "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think></think>Hello!<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think>",
    "query task": "<｜begin▁of▁sentence｜><｜User｜>Weather in Paris?<｜query｜>",
    "action task": "<｜begin▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think><｜action｜>",
    "wo_eos on an earlier assistant message": "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think></think>Hel</think>lo!<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think>",
    "response format on a developer message": '<｜begin▁of▁sentence｜><｜User｜>Reply in JSON.\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n{"type": "json_object"}<｜Assistant｜></think>',
    "task output has no reasoning": "<｜begin▁of▁sentence｜><｜User｜>Weather?<｜title｜>Weather<｜end▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think>",
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

    def test_openai_reasoning_efforts_map_as_vllm_maps_them(self):
        messages = [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "Hi"},
        ]

        def render(**kwargs):
            return apply_chat_template(messages, add_generation_prompt=True, **kwargs)

        expected = {
            "none": render(enable_thinking=False),
            "minimal": render(reasoning_effort="high"),
            "low": render(reasoning_effort="high"),
            "medium": render(reasoning_effort="high"),
            "xhigh": render(reasoning_effort="max"),
        }
        self.assertNotEqual(expected["none"], expected["low"])
        self.assertNotEqual(expected["low"], expected["xhigh"])
        for effort, text in expected.items():
            with self.subTest(effort):
                self.assertEqual(render(reasoning_effort=effort), text)
        with self.assertRaisesRegex(ValueError, "'none', 'minimal', 'low'"):
            render(reasoning_effort="lowest")

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
