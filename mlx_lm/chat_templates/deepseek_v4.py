# Copyright © 2026 Apple Inc.

"""The DeepSeek-V4 chat format, as DeepSeek's ``encoding_dsv4.py`` writes it."""

import json
from typing import Any, Dict, List, Optional

from .deepseek_v32 import (
    bos_token,
    dsml_token,
    eos_token,
    find_last_user_index,
    response_format_template,
    thinking_end_token,
    thinking_start_token,
    to_json,
    tools_from_openai_format,
)

user_token = "<｜User｜>"
assistant_token = "<｜Assistant｜>"
latest_reminder_token = "<｜latest_reminder｜>"
task_tokens = {
    "action": "<｜action｜>",
    "query": "<｜query｜>",
    "authority": "<｜authority｜>",
    "domain": "<｜domain｜>",
    "title": "<｜title｜>",
    "read_url": "<｜read_url｜>",
}

REASONING_EFFORT_MAX = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose "
    "the problem to resolve the root cause, rigorously stress-testing your "
    "logic against all potential paths, edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every "
    "intermediate step, considered alternative, and rejected hypothesis to "
    "ensure absolutely no assumption is left unchecked.\n\n"
)

TOOLS_TEMPLATE = """## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<{dsml_token}tool_calls>" block like the following:

<{dsml_token}tool_calls>
<{dsml_token}invoke name="$TOOL_NAME">
<{dsml_token}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{dsml_token}parameter>
...
</{dsml_token}invoke>
<{dsml_token}invoke name="$TOOL_NAME2">
...
</{dsml_token}invoke>
</{dsml_token}tool_calls>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by {thinking_start_token}), you MUST output your complete reasoning inside {thinking_start_token}...{thinking_end_token} BEFORE any tool calls or final response.

Otherwise, output directly after {thinking_end_token} with tool calls or final response.

### Available Tool Schemas

{tool_schemas}

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
"""


def render_tools(tools) -> str:
    return TOOLS_TEMPLATE.format(
        tool_schemas="\n".join(map(to_json, tools_from_openai_format(tools))),
        dsml_token=dsml_token,
        thinking_start_token=thinking_start_token,
        thinking_end_token=thinking_end_token,
    )


def encode_arguments_to_dsml(tool_call: Dict[str, Any]) -> str:
    """Render a call's arguments, JSON text or decoded, as DSML parameters."""
    arguments = tool_call["arguments"]
    if not isinstance(arguments, dict):
        try:
            arguments = json.loads(arguments)
        except (TypeError, ValueError):
            pass
    # What is not an object is one parameter, as DeepSeek's for text not JSON
    if not isinstance(arguments, dict):
        arguments = {"arguments": arguments}
    parameters = []
    for name, value in arguments.items():
        string = "true" if isinstance(value, str) else "false"
        value = value if isinstance(value, str) else to_json(value)
        parameters.append(
            f'<{dsml_token}parameter name="{name}" string="{string}">'
            f"{value}</{dsml_token}parameter>"
        )
    return "\n".join(parameters)


def render_tool_calls(tool_calls: List[Dict[str, Any]]) -> str:
    """Render OpenAI-format tool calls as a DSML block after a blank line."""
    invokes = []
    for call in tool_calls:
        function = call["function"]
        invokes.append(
            f'<{dsml_token}invoke name="{function["name"]}">\n'
            f"{encode_arguments_to_dsml(function)}\n</{dsml_token}invoke>"
        )
    invokes = "\n".join(invokes)
    return f"\n\n<{dsml_token}tool_calls>\n{invokes}\n</{dsml_token}tool_calls>"


def _tool_result_text(content):
    # As DeepSeek's encoder: a list of content parts gives its text parts.
    if not isinstance(content, list):
        return content
    return "\n\n".join(
        (
            p.get("text", "")
            if p.get("type") == "text"
            else f"[Unsupported {p.get('type')}]"
        )
        for p in content
    )


def render_message(
    index: int,
    messages: List[Dict[str, Any]],
    thinking_mode: str,
    drop_thinking: bool,
) -> str:
    """Render ``messages[index]``; the messages come from ``merge_tool_messages``."""
    message = messages[index]
    role = message["role"]
    content = message.get("content")
    thinking = thinking_mode == "thinking"
    last_user = find_last_user_index(messages)

    if role == "system":
        text = content or ""
    elif role == "developer":
        if not content:
            raise ValueError(f"Invalid message for role `{role}`: {message}")
        text = user_token + content
    elif role == "user":
        parts = []
        for part in message["content_blocks"]:
            if part["type"] == "tool_result":
                result = _tool_result_text(part["content"])
                parts.append(f"<tool_result>{result}</tool_result>")
            else:
                parts.append(part["text"])
        text = user_token + "\n\n".join(parts)
    elif role == "latest_reminder":
        text = f"{latest_reminder_token}{content}"
    elif role == "assistant":
        text = ""
        prev_task = index > 0 and messages[index - 1].get("task") is not None
        if thinking and not prev_task and (not drop_thinking or index > last_user):
            text = f"{message.get('reasoning_content') or ''}{thinking_end_token}"
        text += content or ""
        if message.get("tool_calls"):
            text += render_tool_calls(message["tool_calls"])
        if not message.get("wo_eos", False):
            text += eos_token
    else:
        raise ValueError(f"Unknown role: {role}")

    if role in ("system", "developer"):
        if tools := message.get("tools"):
            text += "\n\n" + render_tools(tools)
        if response_format := message.get("response_format"):
            text += "\n\n" + response_format_template.format(
                schema=to_json(response_format)
            )

    if index + 1 < len(messages) and messages[index + 1]["role"] not in (
        "assistant",
        "latest_reminder",
    ):
        return text
    think = thinking_start_token if thinking else thinking_end_token
    task = message.get("task")
    if task is not None:
        if task not in task_tokens:
            raise ValueError(
                f"Invalid task: '{task}'. Valid tasks are: {list(task_tokens)}"
            )
        if task == "action":
            text += assistant_token + think
        text += task_tokens[task]
    elif role in ("user", "developer"):
        if drop_thinking and index < last_user:
            think = thinking_end_token
        text += assistant_token + think
    return text


def merge_tool_messages(messages: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Merge each run of tool and user messages into one user turn."""
    merged = []
    for message in messages:
        role = message.get("role")
        last = merged[-1] if merged else {}
        if role == "tool":
            part = {
                "type": "tool_result",
                "tool_use_id": message.get("tool_call_id", ""),
                "content": message.get("content", ""),
            }
            if last.get("role") == "user":
                last["content_blocks"].append(part)
            else:
                merged.append({"role": "user", "content_blocks": [part]})
        elif role == "user":
            part = {"type": "text", "text": message.get("content", "")}
            if last.get("role") == "user" and last.get("task") is None:
                last["content_blocks"].append(part)
            else:
                turn = {"role": "user", "content_blocks": [part]}
                if "task" in message:
                    turn["task"] = message["task"]
                merged.append(turn)
        else:
            merged.append(dict(message))
    return merged


def sort_tool_results_by_call_order(
    messages: List[Dict[str, Any]],
) -> List[Dict[str, Any]]:
    order = {}
    for message in messages:
        if message["role"] == "assistant" and message.get("tool_calls"):
            order = {}
            for i, call in enumerate(message["tool_calls"]):
                call_id = call.get("id") or call.get("function", {}).get("id", "")
                if call_id:
                    order[call_id] = i
        elif message["role"] == "user":
            parts = message["content_blocks"]
            results = [p for p in parts if p["type"] == "tool_result"]
            if len(results) > 1 and order:
                results = sorted(results, key=lambda p: order.get(p["tool_use_id"], 0))
                results = iter(results)
                message["content_blocks"] = [
                    next(results) if p["type"] == "tool_result" else p for p in parts
                ]
    return messages


def _drop_developer_messages(messages):
    last_user = find_last_user_index(messages)
    return [
        m for i, m in enumerate(messages) if m["role"] != "developer" or i >= last_user
    ]


def encode_messages(
    messages: List[Dict[str, Any]],
    thinking_mode: str = "thinking",
    *,
    drop_thinking: bool = True,
    reasoning_effort: Optional[str] = None,
    tools: Optional[List[Dict[str, Any]]] = None,
) -> str:
    """DeepSeek's ``encode_messages``; ``tools`` go on the first system message."""
    if thinking_mode not in ("chat", "thinking"):
        raise ValueError(
            f"Invalid thinking_mode {thinking_mode!r}, expected 'chat' or 'thinking'"
        )
    if reasoning_effort not in (None, "high", "max"):
        raise ValueError(
            f"Invalid reasoning_effort {reasoning_effort!r}, "
            "expected None, 'high' or 'max'"
        )

    messages = sort_tool_results_by_call_order(merge_tool_messages(messages))
    if tools:
        if not messages or messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": ""})
        elif messages[0].get("tools"):
            raise ValueError("tools are given both as an argument and in messages[0]")
        messages[0]["tools"] = tools
    if any(m.get("tools") for m in messages):
        drop_thinking = False
    if thinking_mode == "thinking" and drop_thinking:
        messages = _drop_developer_messages(messages)

    prompt = bos_token
    if messages and thinking_mode == "thinking" and reasoning_effort == "max":
        prompt += REASONING_EFFORT_MAX
    for index in range(len(messages)):
        prompt += render_message(index, messages, thinking_mode, drop_thinking)
    return prompt


def apply_chat_template(
    messages: List[Dict[str, Any]],
    tools: Optional[List[Dict[str, Any]]] = None,
    add_generation_prompt: bool = False,
    continue_final_message: bool = False,
    enable_thinking: bool = True,
    drop_thinking: bool = True,
    reasoning_effort: Optional[str] = None,
    **kwargs,
) -> str:
    """Render the messages with mlx-lm's keywords; other keywords are ignored,
    as Hugging Face's templates ignore them."""
    if continue_final_message and add_generation_prompt:
        raise ValueError(
            "Only one of continue_final_message or add_generation_prompt can be True"
        )
    thinking_mode = "thinking" if enable_thinking else "chat"
    if continue_final_message and messages and messages[-1]["role"] == "assistant":
        messages = [*messages[:-1], {**messages[-1], "wo_eos": True}]

    prompt = encode_messages(
        messages,
        thinking_mode,
        drop_thinking=drop_thinking,
        reasoning_effort=reasoning_effort,
        tools=tools,
    )

    # As deepseek_v32: without a generation prompt a final user turn ends here.
    role = messages[-1].get("role") if messages else None
    if not add_generation_prompt and role in ("user", "tool", "developer"):
        thinking = thinking_mode == "thinking"
        think = thinking_start_token if thinking else thinking_end_token
        prompt = prompt.removesuffix(assistant_token + think)
    return prompt
