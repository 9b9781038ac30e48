# Copyright © 2026 Apple Inc.

import json
import unittest

from server_fixture import ServerTestCase, user


class TestServerStreamLogprobs(ServerTestCase):
    """A streamed answer carries each token's logprobs, as the whole answer
    does."""

    def streamed(self, path, body):
        status, events = self.server.send("POST", path, dict(body, stream=True))
        self.assertEqual(status, 200, events)
        chunks = [
            json.loads(line[len("data: ") :])
            for line in events.splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"
        ]
        content = []
        for chunk in chunks:
            logprobs = chunk["choices"][0].get("logprobs")
            content += logprobs["content"] if logprobs else []
        return content

    def test_streamed_logprobs_are_the_answers(self):
        requests = [
            ("/v1/chat/completions", {"messages": user()}),
            ("/v1/completions", {"prompt": "The quick brown fox"}),
        ]
        for path, body in requests:
            for options in ({"logprobs": True}, {"logprobs": True, "top_logprobs": 3}):
                with self.subTest(path=path, **options):
                    body = dict(body, max_tokens=8, temperature=0.0, **options)
                    status, answer = self.server.request("POST", path, body)
                    self.assertEqual(status, 200, answer)
                    whole = answer["choices"][0]["logprobs"]["content"]
                    self.assertEqual(len(whole), 8)
                    streamed = self.streamed(path, body)
                    self.assertEqual(len(streamed), len(whole))
                    for got, expected in zip(streamed, whole):
                        self.assertEqual(got["id"], expected["id"])
                        self.assertAlmostEqual(
                            got["logprob"], expected["logprob"], places=4
                        )
                        top = [t["id"] for t in expected.get("top_logprobs", [])]
                        self.assertEqual(
                            [t["id"] for t in got.get("top_logprobs", [])], top
                        )

    def test_without_logprobs_no_chunk_has_them(self):
        body = {"messages": user(), "max_tokens": 4}
        self.assertEqual(self.streamed("/v1/chat/completions", body), [])


if __name__ == "__main__":
    unittest.main()
