# Copyright © 2026 Apple Inc.

"""Tool call parser for DeepSeek-V4 (DSML).

A block is read as DeepSeek's ``encoding_dsv4.py`` reads it: a parameter
value runs to its ``</｜DSML｜parameter>``, so it may hold any other DSML tag.
Since a value may hold ``</｜DSML｜tool_calls>`` too, the block has no end
marker for the server: it runs to the end of the reply, where DeepSeek's
format ends it. Blocks that format rejects are read leniently (``|`` for
``｜``, a missing closing tag, closing tags cut short at the end, as quantized
models write them), or not at all: a block is parsed whole or raises.
"""

import json
import re
from typing import Any, Optional

from ..chat_templates.deepseek_v32 import to_json

dsml = "｜DSML｜"
tool_call_start = f"\n\n<{dsml}tool_calls>"
tool_call_end = ""

_start = re.compile(rf"\s*<{dsml}tool_calls>")


def _until(text, i, stops):
    """(end, text up to the first of stops, that stop or None)."""
    found = [(p, s) for s in stops if (p := text.find(s, i)) >= 0]
    if not found:
        return len(text), text[i:], None
    p, stop = min(found)
    return p + len(stop), text[i:p], stop


def _arguments(params):
    # The arguments as the JSON text DeepSeek's parser writes, if it is JSON.
    pairs = [
        f"{to_json(k)}: {to_json(v) if s == 'true' else v}" for k, (v, s) in params
    ]
    try:
        return json.loads("{" + ", ".join(pairs) + "}")
    except ValueError:
        return {k: _value(v, s) for k, (v, s) in params}


def _value(raw, string):
    if string == "true":
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw.strip()


def _parse_exact(text):
    """The calls of a block that DeepSeek's parser accepts, else None."""
    invoke, param = f"<{dsml}invoke", f"<{dsml}parameter"
    invoke_end, block_end = f"</{dsml}invoke", f"</{dsml}tool_calls>"
    # Each invoke and the block end follow a ">" and a newline.
    text = ">" + text
    calls = []
    i, gap, stop = _until(text, 0, [invoke, block_end])
    while True:
        if gap != ">\n":
            return None
        if stop == block_end:
            return calls if i == len(text) else None
        if stop is None:
            return None
        i, head, stop = _until(text, i, [param, invoke_end])
        name = re.fullmatch(r'\s*name="(.*?)">\n\n?', head, flags=re.DOTALL)
        if name is None:
            return None
        params = []
        while stop == param:
            i, body, _ = _until(text, i, [f"/{dsml}parameter"])
            m = re.fullmatch(
                r' name="(.*?)" string="(true|false)">(.*?)<\n?', body, flags=re.DOTALL
            )
            if m is None or m[1] in dict(params):
                return None
            params.append((m[1], (m[3], m[2])))
            i, gap, stop = _until(text, i, [param, invoke_end])
            if gap != ">\n":
                return None
        calls.append({"name": name[1], "arguments": _arguments(params)})
        i, gap, stop = _until(text, i, [invoke, block_end])


_tag = re.compile(
    r"<(/?)[｜|]DSML[｜|](tool_calls|invoke|parameter)"
    r'((?:\s+\w+="[^"]*")*)\s*(?:>|\Z)'
)
_attr = re.compile(r'(\w+)="([^"]*)"')
# The start of a tag cut off at the end of the text.
_cut = re.compile(r"</?(?:[｜|](?:D(?:S(?:M(?:L(?:[｜|][a-z_]*)?)?)?)?)?)?\Z")


def _parse_lenient(text):
    """The calls of a block read leniently."""
    text = _cut.sub("", text)
    calls, call, param, pos, done = [], None, None, 0, False

    def close_param(value):
        name, string = param
        if name in call["arguments"]:
            raise ValueError(f"Duplicate parameter {name!r}")
        call["arguments"][name] = _value(value, string)

    for tag in _tag.finditer(text):
        closing, kind = tag[1] == "/", tag[2]
        between, pos = text[pos : tag.start()], tag.end()
        if param is not None:
            close_param(
                between if closing and kind == "parameter" else between.rstrip("\n")
            )
            param = None
            if closing and kind == "parameter":
                continue
        elif between.strip() or done and (closing or kind != "tool_calls"):
            raise ValueError(f"Unexpected text in the tool calls: {between!r}")
        attrs = dict(_attr.findall(tag[3]))
        if kind == "invoke" and not closing:
            if "name" not in attrs:
                raise ValueError(f"Tool call without a name: {tag[0]!r}")
            call = {"name": attrs["name"], "arguments": {}}
            calls.append(call)
        elif kind == "parameter" and not closing:
            if call is None or "name" not in attrs:
                raise ValueError(f"Parameter outside a tool call: {tag[0]!r}")
            param = (attrs["name"], attrs.get("string"))
        elif kind == "invoke":
            call = None
        elif kind == "tool_calls":
            done, call = closing, None
    rest = text[pos:]
    if param is not None:
        close_param(rest)
    elif rest.strip():
        raise ValueError(f"Unexpected text in the tool calls: {rest!r}")
    return calls


def parse_tool_call(
    text: str, tools: Optional[Any] = None
) -> dict[str, Any] | list[dict[str, Any]]:
    """The calls of the block in text, with or without its start marker."""
    if m := _start.match(text):
        text = text[m.end() :]
    # DeepSeek's parser takes no text after the block, not even a newline.
    calls = _parse_exact(text.rstrip())
    if calls is None:
        calls = _parse_lenient(text)
    if not calls:
        raise ValueError("No tool call found.")
    return calls[0] if len(calls) == 1 else calls
