# Copyright © 2026 Apple Inc.

import json
import unittest

from server_fixture import ServerTestCase, user


class TestServerUsageChunk(ServerTestCase):
    """The usage chunk of a stream (stream_options.include_usage) has the
    stream's object, as its other chunks."""

    def test_usage_chunk_has_the_streams_object(self):
        requests = [
            ("/v1/chat/completions", {"messages": user()}, "chat.completion.chunk"),
            ("/v1/completions", {"prompt": "The quick brown fox"}, "text_completion"),
        ]
        for path, body, object_type in requests:
            with self.subTest(path=path):
                body = dict(
                    body,
                    max_tokens=3,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                status, events = self.server.send("POST", path, body)
                self.assertEqual(status, 200, events)
                chunks = [
                    json.loads(line[len("data: ") :])
                    for line in events.splitlines()
                    if line.startswith("data: {")
                ]
                usage = [c for c in chunks if "usage" in c]
                self.assertEqual(len(usage), 1)
                self.assertEqual(usage[0]["usage"]["completion_tokens"], 3)
                self.assertEqual({c["object"] for c in chunks}, {object_type})


if __name__ == "__main__":
    unittest.main()
