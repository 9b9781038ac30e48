# Copyright © 2026 Apple Inc.

"""The DeepSeek-V4 chat format, for checkpoints without a chat template.

``BOS system <｜User｜>... <｜Assistant｜><think>...</think>... EOS``. Tool
results have no role of their own: they are folded into the next user turn.
"""

import json
from typing import Any, Dict, List

from .deepseek_v32 import to_json, tools_from_openai_format

bos_token = "<｜begin▁of▁sentence｜>"
eos_token = "<｜end▁of▁sentence｜>"
user_token = "<｜User｜>"
assistant_token = "<｜Assistant｜>"
thinking_start_token = "<think>"
thinking_end_token = "</think>"
dsml_token = "｜DSML｜"
# The tokens of the format a tokenizer must have (checked at load).
special_tokens = (
    bos_token,
    eos_token,
    user_token,
    assistant_token,
    thinking_start_token,
    thinking_end_token,
)

TOOLS_TEMPLATE = """## Tools

You can call the tools below. To call tools, end your reply with one block like this:

<{dsml}tool_calls>
<{dsml}invoke name="$TOOL_NAME">
<{dsml}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{dsml}parameter>
...
</{dsml}invoke>
<{dsml}invoke name="$TOOL_NAME_2">
...
</{dsml}invoke>
</{dsml}tool_calls>

Use string="true" for string values, written as is without quotes or escaping, and string="false" for every other value (numbers, booleans, arrays, objects), written as JSON. The results come back in the next user message, each as <tool_result>...</tool_result>.

The tools, as JSON schemas:
{schemas}"""


def render_tools(tools) -> str:
    schemas = "\n".join(to_json(t) for t in tools_from_openai_format(tools))
    return TOOLS_TEMPLATE.format(dsml=dsml_token, schemas=schemas)


def _render_parameter(name: str, value: Any) -> str:
    if isinstance(value, str):
        string = "true"
    else:
        string, value = "false", to_json(value)
    return (
        f'<{dsml_token}parameter name="{name}" string="{string}">'
        f"{value}</{dsml_token}parameter>"
    )


def render_tool_calls(tool_calls: List[Dict[str, Any]]) -> str:
    invokes = []
    for call in tool_calls:
        call = call.get("function", call)
        arguments = call.get("arguments") or {}
        if isinstance(arguments, str):
            arguments = json.loads(arguments)
        params = [_render_parameter(k, v) for k, v in arguments.items()]
        invokes.append(
            "\n".join(
                [f'<{dsml_token}invoke name="{call["name"]}">']
                + params
                + [f"</{dsml_token}invoke>"]
            )
        )
    return "\n\n" + "\n".join(
        [f"<{dsml_token}tool_calls>"] + invokes + [f"</{dsml_token}tool_calls>"]
    )


def _reasoning(message):
    return message.get("reasoning_content") or message.get("reasoning") or ""


def _user_part(message):
    content = message.get("content") or ""
    if message["role"] == "tool":
        return f"<tool_result>{content}</tool_result>"
    return content


def apply_chat_template(
    messages: List[Dict[str, Any]],
    tools=None,
    add_generation_prompt: bool = False,
    continue_final_message: bool = False,
    enable_thinking: bool = True,
    **kwargs,
) -> str:
    if continue_final_message and add_generation_prompt:
        raise ValueError(
            "Only one of continue_final_message or add_generation_prompt can be True"
        )
    thinking = kwargs.get("thinking", enable_thinking)

    n_system = 0
    while n_system < len(messages) and messages[n_system]["role"] in (
        "system",
        "developer",
    ):
        n_system += 1
    system = [m.get("content") or "" for m in messages[:n_system]]
    if tools:
        system.append(render_tools(tools))
    prompt = bos_token + "\n\n".join(s for s in system if s)

    last_user = max(
        (i for i, m in enumerate(messages) if m["role"] == "user"), default=-1
    )

    # A user turn is a run of user, tool and later system messages.
    turn = []
    for i, message in enumerate(messages[n_system:], start=n_system):
        if message["role"] != "assistant":
            turn.append(_user_part(message))
            continue
        if turn:
            prompt += user_token + "\n".join(turn)
            turn = []
        prompt += assistant_token
        final = continue_final_message and i == len(messages) - 1
        content = message.get("content") or ""
        tool_calls = message.get("tool_calls")
        # Reasoning before the last user message is kept only with tools.
        if thinking and (tools or i > last_user):
            prompt += thinking_start_token + _reasoning(message)
            if final and not content and not tool_calls:
                return prompt
        prompt += thinking_end_token + content
        if tool_calls:
            prompt += render_tool_calls(tool_calls)
        if not final:
            prompt += eos_token

    if turn:
        prompt += user_token + "\n".join(turn)
        if add_generation_prompt:
            prompt += assistant_token
            prompt += thinking_start_token if thinking else thinking_end_token
    return prompt
