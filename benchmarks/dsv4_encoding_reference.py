# Copyright © 2026 Apple Inc.
"""Random conversations through DeepSeek's encoder and mlx_lm's, compared.

    python benchmarks/dsv4_encoding_reference.py PATH/encoding/encoding_dsv4.py
    python benchmarks/dsv4_encoding_reference.py PATH_0731/encoding/encoding_dsv4.py --format 0731

PATH is a DeepSeek-V4 checkpoint's folder (its ``encoding_dsv4.py`` defines
``encode_messages(messages, thinking_mode, ..., reasoning_effort=None)``).
Tool call arguments reach DeepSeek's encoder as JSON text (OpenAI's form)
and mlx_lm's as text or decoded (mlx_lm.server's form). Prints how many
renderings differ (and the first one) and exits with 1 if any does; a
conversation both reject counts as agreeing.
"""

import argparse
import copy
import importlib.util
import json
import random
import sys

from mlx_lm.chat_templates.deepseek_v4 import REASONING_EFFORT_PROMPTS
from mlx_lm.chat_templates.deepseek_v4 import apply_chat_template as ours

PIECES = ["Hi", "a\nb", "", "é ✓", "42", "x</think>", "<think>", '"q"', " ", "\n"]
TASKS = ["action", "query", "authority", "domain", "title", "read_url"]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "f",
            "description": "A tool.",
            "parameters": {"type": "object", "properties": {"a": {"type": "string"}}},
        },
    }
]


def conversation(rng):
    def text():
        return "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 3))) or "w"

    def value(depth=0):
        kinds = [text, lambda: rng.randint(-5, 99), lambda: rng.random() < 0.5]
        if depth < 2:
            kinds.append(lambda: [value(depth + 1) for _ in range(rng.randint(0, 2))])
            kinds.append(lambda: {text(): value(depth + 1) for _ in range(2)})
        return rng.choice(kinds)()

    messages, calls = [], 0
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": text()})
    turns = rng.randint(1, 5)
    for turn in range(turns):
        role = "developer" if rng.random() < 0.15 else "user"
        messages.append({"role": role, "content": text()})
        if rng.random() < 0.1:
            messages.append({"role": "user", "content": text()})
        if rng.random() < 0.1:
            messages[-1]["task"] = rng.choice(TASKS)
        if rng.random() < 0.15:
            messages.append({"role": "latest_reminder", "content": text()})
        if turn == turns - 1:
            break
        reply = {"role": "assistant", "content": text()}
        if rng.random() < 0.6:
            reply["reasoning_content"] = text()
        messages.append(reply)
        if rng.random() < 0.5:
            reply["tool_calls"] = []
            for _ in range(rng.randint(1, 3)):
                calls += 1
                args = {f"p{i}": value() for i in range(rng.randint(0, 3))}
                if rng.random() < 0.3:
                    args = json.dumps(args, ensure_ascii=rng.random() < 0.5)
                elif rng.random() < 0.1:
                    args = text()
                reply["tool_calls"].append(
                    {
                        "id": f"call{calls}",
                        "type": "function",
                        "function": {"name": rng.choice("fg"), "arguments": args},
                    }
                )
            results = [
                {"role": "tool", "content": text(), "tool_call_id": c["id"]}
                for c in reply["tool_calls"]
            ]
            rng.shuffle(results)
            messages += results
    return messages


def render(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        return ("rejected", type(e).__name__)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("encoding", help="DeepSeek's encoding_dsv4.py")
    parser.add_argument("--format", default="original", choices=["original", "0731"])
    parser.add_argument("-n", type=int, default=3000, help="conversations")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    spec = importlib.util.spec_from_file_location("encoding_dsv4", args.encoding)
    reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reference)

    rng = random.Random(args.seed)
    # Named efforts only: a fork may default another one than the encoder.
    efforts = list(REASONING_EFFORT_PROMPTS[args.format])
    differ, first = 0, None
    for _ in range(args.n):
        messages = conversation(rng)
        tools = TOOLS if rng.random() < 0.4 else None
        thinking = rng.random() < 0.7
        effort = rng.choice(efforts)
        mode = "thinking" if thinking else "chat"
        # mlx-lm's keyword or DeepSeek's.
        if rng.random() < 0.5:
            keyword = {"enable_thinking": thinking}
        else:
            keyword = {"thinking_mode": mode, "enable_thinking": rng.random() < 0.5}
        mine = render(
            ours,
            copy.deepcopy(messages),
            tools=tools,
            add_generation_prompt=True,
            reasoning_effort=effort,
            chat_format=args.format,
            **keyword,
        )
        # DeepSeek's encoder reads the tools from the system message.
        theirs = copy.deepcopy(messages)
        for message in theirs:
            for call in message.get("tool_calls", []):
                if isinstance(call["function"]["arguments"], dict):
                    call["function"]["arguments"] = json.dumps(
                        call["function"]["arguments"]
                    )
        if tools:
            if not theirs or theirs[0]["role"] != "system":
                theirs.insert(0, {"role": "system", "content": ""})
            theirs[0]["tools"] = tools
        theirs = render(
            reference.encode_messages, theirs, mode, reasoning_effort=effort
        )
        agree = mine == theirs or (
            isinstance(mine, tuple) and isinstance(theirs, tuple)
        )
        if not agree:
            differ += 1
            first = first or (messages, mode, effort, mine, theirs)
    print(f"{args.n} conversations ({args.format} format), {differ} differ")
    if first:
        print("first:", *first, sep="\n  ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
