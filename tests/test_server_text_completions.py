# Copyright © 2026 Apple Inc.

import json
import unittest

from server_fixture import ServerTestCase
from transformers import AutoTokenizer


class TestServerTextCompletions(ServerTestCase):
    """/v1/completions answers the model's text as it is: a reasoning
    marker is text there, not a state whose text is dropped."""

    def bias(self, marker):
        """A logit bias that makes ``marker`` every token generated."""
        tokenizer = AutoTokenizer.from_pretrained(self.path)
        (marker_id,) = tokenizer.encode(marker, add_special_tokens=False)
        return {str(marker_id): 100.0}

    def complete(self, marker, **body):
        body = {
            "prompt": "The quick brown fox",
            "max_tokens": 3,
            "temperature": 0.0,
            "logit_bias": self.bias(marker),
            **body,
        }
        return self.server.send("POST", "/v1/completions", body)

    def test_reasoning_markers_are_text(self):
        # Batched, and served alone (a request with a seed).
        for extra in ({}, {"seed": 0}):
            with self.subTest(**extra):
                status, answer = self.complete("<think>", **extra)
                self.assertEqual(status, 200, answer)
                choice = json.loads(answer)["choices"][0]
                self.assertEqual(choice["text"], "<think>" * 3)
                self.assertEqual(choice["finish_reason"], "length")

    def test_streamed_text_is_the_same(self):
        status, events = self.complete("<think>", stream=True)
        self.assertEqual(status, 200, events)
        text = "".join(
            json.loads(line[len("data: ") :])["choices"][0].get("text", "")
            for line in events.splitlines()
            if line.startswith("data: {")
        )
        self.assertEqual(text, "<think>" * 3)

    def test_chat_still_separates_reasoning(self):
        status, answer = self.server.chat(
            {
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 3,
                "temperature": 0.0,
                "logit_bias": self.bias("<think>"),
            }
        )
        self.assertEqual(status, 200, answer)
        message = answer["choices"][0]["message"]
        self.assertNotIn("<think>", message["content"] or "")
        self.assertEqual(message["reasoning"], "<think>" * 2)


if __name__ == "__main__":
    unittest.main()
