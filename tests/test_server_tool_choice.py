# Copyright © 2026 Apple Inc.

import unittest

from server_fixture import user
from test_server_tool_finish import CALL, TOOL_TEMPLATE, TOOLS, ToolReplies


class TestServerToolChoice(ToolReplies):
    """tool_choice "none" answers without tools: none in the prompt, none
    called; other values are OpenAI's or a 400 naming the field."""

    # The tiny chat format, the names of the tools given after it.
    tokenizer_args = {
        "chat_template": TOOL_TEMPLATE
        + "{% for t in tools or [] %} {{ t.function.name }}{% endfor %}"
    }

    def prompt_tokens(self, **body):
        body = {"messages": user(), "max_tokens": 1, **body}
        status, answer = self.server.chat(body)
        self.assertEqual(status, 200, answer)
        return answer["usage"]["prompt_tokens"]

    def test_none_leaves_the_tools_out_of_the_prompt(self):
        without = self.prompt_tokens()
        self.assertGreater(self.prompt_tokens(tools=TOOLS), without)
        self.assertEqual(self.prompt_tokens(tools=TOOLS, tool_choice="none"), without)

    def test_none_returns_a_call_the_model_writes_as_text(self):
        self.assertAnswers([CALL], "", ["get_weather"], "tool_calls")
        self.assertAnswers([CALL], CALL, [], "stop", tool_choice="none")

    def test_openais_values_are_served_others_rejected(self):
        named = {"type": "function", "function": {"name": "get_weather"}}
        for choice in ("auto", "none", "required", named):
            with self.subTest(tool_choice=choice):
                self.prompt_tokens(tools=TOOLS, tool_choice=choice)
        for choice in ("any", {"type": "function"}, 1):
            with self.subTest(tool_choice=choice):
                body = {"messages": user(), "tools": TOOLS, "tool_choice": choice}
                self.assertRejected(body, 400, "tool_choice")


if __name__ == "__main__":
    unittest.main()
