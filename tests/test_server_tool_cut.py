# Copyright © 2026 Apple Inc.

import unittest

from test_server_tool_finish import CALL, ToolReplies

# The call as max_tokens leaves it: the model had not written its end marker.
CUT = CALL.removesuffix("</tool_call>")


class TestServerToolCut(ToolReplies):
    """A tool call that max_tokens cut off is the answer's text, not a call:
    the model had not finished it."""

    def test_a_call_cut_by_max_tokens_is_text(self):
        self.assertAnswers([CUT], CUT, [], "length", finish="length")
        reply = [CALL, " and ", CUT]
        calls = ["get_weather"]
        self.assertAnswers(reply, " and " + CUT, calls, "length", finish="length")

    def test_a_call_the_model_ended_is_parsed(self):
        # The model stopped (EOS) inside its last call: read as before.
        self.assertAnswers([CUT], "", ["get_weather"], "tool_calls")


if __name__ == "__main__":
    unittest.main()
