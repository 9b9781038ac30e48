# Copyright © 2026 Apple Inc.

import json
import unittest

from server_fixture import ServerTestCase, user

from mlx_lm.utils import load_tokenizer

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


def answer_text(answer):
    choice = answer["choices"][0]
    return choice["text"] if "text" in choice else choice["message"]["content"]


def streamed(data):
    """The text and the last finish_reason of a streamed answer."""
    text, finish_reason = "", None
    for line in data.splitlines():
        if not line.startswith("data: {"):
            continue
        choice = json.loads(line[len("data: ") :])["choices"][0]
        delta = choice.get("delta") or {}
        text += choice.get("text") or delta.get("content") or ""
        finish_reason = choice["finish_reason"] or finish_reason
    return text, finish_reason


class TestServerStopStrings(ServerTestCase):
    """A stop string ends the answer where it appears in the text, however
    the model's tokens split it (OpenAI's `stop`)."""

    max_tokens = 16

    def bodies(self):
        prompt = {"prompt": "The quick brown fox"}
        return ((COMPLETIONS, prompt), (CHAT, {"messages": user()}))

    def plain(self, path, body):
        """The answer without a stop string, and its tokens' texts."""
        body = {**body, "max_tokens": self.max_tokens, "logprobs": True}
        status, answer = self.server.request("POST", path, body)
        self.assertEqual(status, 200, answer)
        self.assertEqual(answer["choices"][0]["finish_reason"], "length")
        ids = [t["id"] for t in answer["choices"][0]["logprobs"]["content"]]
        tokenizer = load_tokenizer(self.path)
        return answer_text(answer), [tokenizer.decode([i]) for i in ids]

    def test_the_answer_ends_before_the_stop_string(self):
        for path, body in self.bodies():
            with self.subTest(path=path):
                plain, pieces = self.plain(path, body)
                # A token of three characters or more less its first: a stop
                # string that begins inside a token, so no sequence of the
                # answer's tokens is the stop string's.
                stop = next(p[1:] for p in pieces if len(p.strip()) > 2)
                expected = plain[: plain.index(stop)]
                body = {**body, "max_tokens": self.max_tokens, "stop": [stop]}
                status, answer = self.server.request("POST", path, body)
                self.assertEqual(status, 200, answer)
                self.assertEqual(answer_text(answer), expected)
                self.assertEqual(answer["choices"][0]["finish_reason"], "stop")
                self.assertLess(answer["usage"]["completion_tokens"], self.max_tokens)
                # Streamed, the same text.
                status, data = self.server.send("POST", path, {**body, "stream": True})
                self.assertEqual(status, 200, data)
                self.assertEqual(streamed(data), (expected, "stop"))

    def test_a_stop_string_that_does_not_appear(self):
        for path, body in self.bodies():
            with self.subTest(path=path):
                plain, _ = self.plain(path, body)
                self.assertNotIn("\n\n\n", plain)
                body = {**body, "max_tokens": self.max_tokens, "stop": "\n\n\n"}
                status, answer = self.server.request("POST", path, body)
                self.assertEqual(answer_text(answer), plain)
                self.assertEqual(answer["choices"][0]["finish_reason"], "length")


if __name__ == "__main__":
    unittest.main()
