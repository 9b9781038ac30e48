# Copyright © 2026 Apple Inc.

import json
import unittest
from unittest import mock

from server_fixture import CHAT_TEMPLATE, ServerTestCase, user

from mlx_lm.server import Response

# The markers name the json_tools parser: <tool_call>{json}</tool_call>.
TOOL_TEMPLATE = CHAT_TEMPLATE + "{# <tool_call> tool_call.name #}"
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
NOT_A_CALL = "<tool_call>the weather in Paris</tool_call>"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {}}},
        },
    }
]


class ToolReplies(ServerTestCase):
    """A server on a tokenizer with json_tools' markers, made to reply with
    given texts."""

    tokenizer_args = {"chat_template": TOOL_TEMPLATE}

    def replying(self, reply, finish="stop"):
        """Patch the server to answer with reply instead of the model's text,
        ending it with ``finish``."""
        generator = self.server.generator
        generate = generator.generate

        def answer(request, args, progress_callback=None):
            ctx, response = generate(request, args, progress_callback)

            def texts():
                for _ in response:
                    pass
                for text in reply:
                    yield Response(text, 0, 0.0, None, {})
                yield Response("", 0, 0.0, finish, {})

            return ctx, texts()

        return mock.patch.object(generator, "generate", answer)

    def ask(self, reply, stream, finish="stop"):
        """(content, tool call names, finish_reason) as a client sees them."""
        body = {"messages": user(), "tools": TOOLS, "max_tokens": 2, "stream": stream}
        with self.replying(reply, finish):
            _, data = self.server.send("POST", "/v1/chat/completions", body)
        if not stream:
            choice = json.loads(data)["choices"][0]
            calls = choice["message"].get("tool_calls") or []
            content = choice["message"]["content"] or ""
            names = [c["function"]["name"] for c in calls]
            return content, names, choice["finish_reason"]
        content, names, finish = "", [], None
        for line in data.splitlines():
            if line.startswith("data: {"):
                choice = json.loads(line[len("data: ") :])["choices"][0]
                content += choice["delta"].get("content") or ""
                calls = choice["delta"].get("tool_calls") or []
                names += [c["function"]["name"] for c in calls]
                finish = choice["finish_reason"] or finish
        return content, names, finish

    def assertAnswers(self, reply, content, names, finish_reason, finish="stop"):
        for stream in (False, True):
            with self.subTest(stream=stream):
                self.assertEqual(
                    self.ask(reply, stream, finish), (content, names, finish_reason)
                )


class TestServerToolFinish(ToolReplies):

    def test_a_parsed_call_finishes_with_tool_calls(self):
        self.assertAnswers([CALL], "", ["get_weather"], "tool_calls")
        self.assertAnswers([CALL, " Done."], " Done.", ["get_weather"], "tool_calls")

    def test_an_unparsed_call_finishes_with_stop_streamed_or_not(self):
        # OpenAI's finish_reason is tool_calls only where tool calls are
        # returned; the text that does not parse comes back as content.
        self.assertAnswers([NOT_A_CALL], NOT_A_CALL, [], "stop")
        self.assertAnswers([NOT_A_CALL, " Done."], NOT_A_CALL + " Done.", [], "stop")

    def test_a_parsed_and_an_unparsed_call_finish_with_tool_calls(self):
        reply = [NOT_A_CALL, " and ", CALL]
        self.assertAnswers(reply, NOT_A_CALL + " and ", ["get_weather"], "tool_calls")


if __name__ == "__main__":
    unittest.main()
