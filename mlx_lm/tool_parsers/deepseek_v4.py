# Copyright © 2026 Apple Inc.

"""Tool call parser for DeepSeek-V4 (DSML), as DeepSeek's encoding_dsv4.py: a
value may hold any tag, so the block has no end marker but the reply's end."""

import json
import re
from typing import Any, Optional

dsml = "｜DSML｜"
tool_call_start = f"\n\n<{dsml}tool_calls>"
tool_call_end = ""

_start = re.compile(rf"\s*<{dsml}tool_calls>")


def _until(text, i, stops):
    found = [(p, s) for s in stops if (p := text.find(s, i)) >= 0]
    if not found:
        return len(text), text[i:], None
    p, stop = min(found)
    return p + len(stop), text[i:p], stop


def _value(raw, string):
    if string == "true":
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _parse_block(text):
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
        i, head, stop = _until(text, i, [param, invoke_end])
        # "\n?" here and below copies DeepSeek's "$", which matches before a final "\n".
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
        calls.append({"name": name[1], "arguments": {k: _value(*v) for k, v in params}})
        i, gap, stop = _until(text, i, [invoke, block_end])


def parse_tool_call(
    text: str, tools: Optional[Any] = None
) -> dict[str, Any] | list[dict[str, Any]]:
    if m := _start.match(text):
        text = text[m.end() :]
    calls = _parse_block(text)
    if not calls:
        raise ValueError("No tool call found.")
    return calls[0] if len(calls) == 1 else calls
