# Copyright © 2026 Apple Inc.

"""DeepSeek-V4's DSML tool calls, read as DeepSeek's encoding_dsv4.py reads them."""

import json
import re
from typing import Any, Optional

dsml = "｜DSML｜"
tool_call_start = f"\n\n<{dsml}tool_calls>"
# A value may hold any tag, so a block ends only with the reply.
tool_call_end = ""


def _read_until_stop(index, text, stop):
    found = [(p, s) for s in stop if (p := text.find(s, index)) >= 0]
    if not found:
        return len(text), text[index:], None
    p, matched = min(found)
    return p + len(matched), text[index:p], matched


def _decode_value(raw, string):
    if string == "true":
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        # Text, but not a value run past a damaged closing tag
        if dsml in raw:
            raise ValueError(f"Parameter value is not JSON: {raw!r}") from None
        return raw


def _parse_block(text):
    """Parse the calls after the start tag; raise where DeepSeek's parser does."""
    invoke, param = f"<{dsml}invoke", f"<{dsml}parameter"
    invoke_end, block_end = f"</{dsml}invoke", f"</{dsml}tool_calls>"
    if block_end not in text:
        raise ValueError(f"The tool calls have no closing {block_end}")
    calls = []
    expected = "\n"
    index, gap, stop = _read_until_stop(0, text, [invoke, block_end])
    while True:
        if gap != expected:
            raise ValueError(
                f"Tool call format error: expected {expected!r}, got {gap!r}"
            )
        expected = ">\n"
        if stop == block_end:
            if text[index:].strip():
                raise ValueError(f"Text after the tool calls: {text[index:]!r}")
            return calls
        index, head, stop = _read_until_stop(index, text, [param, invoke_end])
        # A call without parameters is written with a blank line
        name = re.fullmatch(r'\s*name="(.*?)">\n\n?', head, flags=re.DOTALL)
        if name is None:
            raise ValueError(f"Tool name format error: {head!r}")
        arguments = {}
        while stop == param:
            index, body, _ = _read_until_stop(index, text, [f"/{dsml}parameter"])
            m = re.fullmatch(
                r' name="(.*?)" string="(true|false)">(.*?)<', body, flags=re.DOTALL
            )
            if m is None:
                raise ValueError(f"Parameter format error: {body!r}")
            if m[1] in arguments:
                raise ValueError(f"Duplicate parameter name: {m[1]!r}")
            arguments[m[1]] = _decode_value(m[3], m[2])
            index, gap, stop = _read_until_stop(index, text, [param, invoke_end])
            if gap != ">\n":
                raise ValueError(
                    f"Parameter format error: expected '>\\n', got {gap!r}"
                )
        calls.append({"name": name[1], "arguments": arguments})
        index, gap, stop = _read_until_stop(index, text, [invoke, block_end])


def parse_tool_call(
    text: str, tools: Optional[Any] = None
) -> dict[str, Any] | list[dict[str, Any]]:
    calls = _parse_block(text)
    if not calls:
        raise ValueError("No tool call found.")
    return calls[0] if len(calls) == 1 else calls
