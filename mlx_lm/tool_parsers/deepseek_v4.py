# Copyright © 2026 Apple Inc.

"""Tool call parser for DeepSeek-V4 (DSML)."""

import json
from typing import Any, Optional

import regex as re

tool_call_start = "<｜DSML｜tool_calls>"
tool_call_end = "</｜DSML｜tool_calls>"

# An element ends at its closing tag, at the next opening tag, or at the end
# of the text, since quantized models often cut the closing tag short.
_DSML = r"[｜|]DSML[｜|]"
_invoke_regex = re.compile(
    rf"<{_DSML}invoke\s+name=\"(?P<name>[^\"]*)\"\s*>"
    rf"(?P<body>.*?)(?=</{_DSML}invoke|<{_DSML}invoke|</{_DSML}tool_calls|\Z)",
    re.DOTALL,
)
_param_regex = re.compile(
    rf"<{_DSML}parameter\s+name=\"(?P<name>[^\"]*)\""
    r"(?:\s+string=\"(?P<string>[^\"]*)\")?\s*>"
    rf"(?P<value>.*?)(?=</{_DSML}|<{_DSML}parameter|\Z)",
    re.DOTALL,
)
# The start of a closing tag cut off at the end of the text.
_cut_regex = re.compile(r"</?(?:[｜|](?:D(?:S(?:M(?:L(?:[｜|][a-z_]*)?)?)?)?)?)?\Z")


def _param_value(raw: str, string: Optional[str]) -> Any:
    if string == "true":
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw.strip()


def parse_tool_call(
    text: str, tools: Optional[Any] = None
) -> dict[str, Any] | list[dict[str, Any]]:
    calls = []
    for invoke in _invoke_regex.finditer(text):
        arguments = {}
        for param in _param_regex.finditer(invoke.group("body")):
            value = param.group("value")
            if param.end() == len(invoke.group("body")):
                value = _cut_regex.sub("", value)
            arguments[param.group("name")] = _param_value(value, param.group("string"))
        calls.append({"name": invoke.group("name"), "arguments": arguments})
    if not calls:
        raise ValueError("No tool call found.")
    if len(calls) == 1:
        return calls[0]
    return calls
