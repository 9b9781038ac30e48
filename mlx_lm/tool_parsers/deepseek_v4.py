# Copyright © 2026 Apple Inc.

"""Tool call parser for DeepSeek-V4 (DSML).

A block is read as DeepSeek's ``encoding_dsv4.py`` reads it: a parameter
value runs to its ``</｜DSML｜parameter>``, so it may hold any other DSML tag.
Since a value may hold ``</｜DSML｜tool_calls>`` too, the block has no end
marker for the server: it runs to the end of the reply, where DeepSeek's
format ends it. Blocks that format rejects are read leniently (``|`` for
``｜``, a missing closing tag, closing tags cut short at the end, as quantized
models write them), or not at all: a block is parsed whole or raises.

The server keeps the start of the call in the text (``tool_call_starts``), so
calls the model writes slightly damaged are found too: invokes without the
``tool_calls`` wrapper, a misspelled opener or one without its ``>``, and
indented lines. Such a call is taken only if the request declares its tool
and each invoke is closed. DSML quoted in a markdown code fence before the
call stays content: the text from the start to the fence that closes it is
given back as text, ahead of the calls.
"""

import json
import re
from typing import Any, Optional

from ..chat_templates.deepseek_v32 import to_json

dsml = "｜DSML｜"
tool_call_start = f"\n\n<{dsml}tool_calls>"
tool_call_end = ""
tool_call_starts = (f"\n\n<{dsml}", f"<{dsml}")

_start = re.compile(rf"\s*<{dsml}tool_calls>")
# Openers models write damaged: a misspelled name or no ">".
_damaged_start = re.compile(r"\s*<[｜|]DSML[｜|](?:tool_?calls?|tool)(?:>|(?=\s))")
_bare_invoke = re.compile(r"(?:\n\n)?[ \t]*<[｜|]DSML[｜|]invoke\b")
_any_tag = re.compile(r"<[｜|]DSML[｜|]")
_fence = re.compile(r"^[ \t]*```", flags=re.MULTILINE)


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


def _parse_lenient(text, closed=False):
    """The calls of a block read leniently; with closed, each invoke must end
    with its closing tag."""
    text = _cut.sub("", text)
    calls, call, param, pos, done = [], None, None, 0, False
    ended = 0

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
            ended += call is not None
            call = None
        elif kind == "tool_calls":
            done, call = closing, None
    rest = text[pos:]
    if param is not None:
        close_param(rest)
    elif rest.strip():
        raise ValueError(f"Unexpected text in the tool calls: {rest!r}")
    if closed and ended < len(calls):
        raise ValueError("A tool call without its closing tag")
    return calls


def _parse_block(text, names):
    """The calls of the block at the start of text. A block with a damaged
    opener or none is taken only with closed invokes of declared tools."""
    if m := _start.match(text):
        text, names = text[m.end() :], None
    elif m := _damaged_start.match(text):
        text = text[m.end() :]
    elif not _bare_invoke.match(text):
        # The text after the start marker.
        names = None
    if names is None:
        # DeepSeek's parser takes no text after the block, not even a newline.
        calls = _parse_exact(text.rstrip())
        return calls if calls is not None else _parse_lenient(text)
    calls = _parse_lenient(text, closed=True)
    if undeclared := [c["name"] for c in calls if c["name"] not in names]:
        raise ValueError(f"Tool calls of undeclared tools: {undeclared}")
    return calls


def _block_starts(text):
    """Where the block may start: the start of the text, and the first tag
    after each fence that closes one, the first closing a fence opened before
    the text."""
    starts, fences = [0], list(_fence.finditer(text))
    for fence in fences[::2]:
        if m := _any_tag.search(text, fence.end()):
            starts.append(m.start())
    return sorted(set(starts))


def _tool_names(tools):
    names = set()
    for tool in tools or []:
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            names.add(function["name"])
    return names


def parse_tool_call(
    text: str, tools: Optional[Any] = None
) -> dict[str, Any] | list[dict[str, Any] | str]:
    """The calls in text; text ahead of them that is content comes first in
    the list, as a string."""
    names, error = _tool_names(tools), None
    for start in _block_starts(text):
        try:
            calls = _parse_block(text[start:], names)
        except ValueError as e:
            error = error or e
            continue
        if not calls:
            continue
        head = text[:start].removesuffix("\n\n")
        if head:
            return [head, *calls]
        return calls[0] if len(calls) == 1 else calls
    raise error or ValueError("No tool call found.")
