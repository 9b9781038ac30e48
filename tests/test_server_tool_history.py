# Copyright © 2026 Apple Inc.

import unittest

from server_fixture import ServerTestCase, user


class TestServerToolHistory(ServerTestCase):
    """Tool calls in a conversation's history that the server cannot read
    are the request's error, named, not a failure of the server."""

    def test_malformed_tool_calls_name_the_field(self):
        def history(tool_calls):
            return user() + [{"role": "assistant", "tool_calls": tool_calls}]

        function = {"name": "get_weather", "arguments": "{not json"}
        cases = [
            ([{"function": function}], "messages[1].tool_calls[0].function.arguments"),
            ([{"function": "get_weather"}], "messages[1].tool_calls[0].function"),
            ("get_weather", "messages[1].tool_calls"),
        ]
        for tool_calls, field in cases:
            with self.subTest(field=field):
                body = {"messages": history(tool_calls), "max_tokens": 3}
                self.assertRejected(body, 400, field)

    def test_arguments_as_json_text_or_an_object_are_served(self):
        for arguments in ('{"city": "Paris"}', {"city": "Paris"}, ""):
            with self.subTest(arguments=arguments):
                function = {"name": "get_weather", "arguments": arguments}
                messages = user() + [
                    {"role": "assistant", "tool_calls": [{"function": function}]},
                    {"role": "user", "content": "And now?"},
                ]
                status, answer = self.server.chat(
                    {"messages": messages, "max_tokens": 3}
                )
                self.assertEqual(status, 200, answer)


if __name__ == "__main__":
    unittest.main()
