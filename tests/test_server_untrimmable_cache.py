# Copyright © 2026 Apple Inc.

import http.client
import json
import unittest
from unittest import mock

from server_fixture import ServerTestCase

from mlx_lm import server

# Qwen3.5's shape in small: linear-attention layers, whose cache cannot be
# trimmed, and a template that ends in <think> unless thinking is off.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}"
    "<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}"
)
SPECIAL_TOKENS = ["<bos>", "<eos>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]


class TestServerUntrimmableCache(ServerTestCase):
    model_type = "qwen3_5"
    tokenizer_args = {"chat_template": CHAT_TEMPLATE, "special_tokens": SPECIAL_TOKENS}

    def chat(self, **body):
        return self.post("/v1/chat/completions", **body)

    def post(self, path, **body):
        try:
            return self.server.send("POST", path, body)
        except (ConnectionError, http.client.HTTPException) as e:
            return None, repr(e)

    def test_a_request_repeated_after_one_without_thinking_is_served(self):
        messages = [{"role": "user", "content": "The quick brown fox"}]
        thinking_off = {"chat_template_kwargs": {"enable_thinking": False}}
        for kwargs in ({}, thinking_off, {}, thinking_off):
            status, answer = self.chat(messages=messages, max_tokens=4, **kwargs)
            self.assertEqual(status, 200, answer)
            usage = json.loads(answer)["usage"]
            self.assertEqual(usage["completion_tokens"], 4)

    def test_a_prompt_the_cache_holds_whole_is_served(self):
        # The chat request caches its prompt up to the thinking tail; the
        # completion's prompt is that text: its cache leaves nothing to feed.
        messages = [{"role": "user", "content": "The lazy dog"}]
        status, answer = self.chat(messages=messages, max_tokens=2)
        self.assertEqual(status, 200, answer)
        text = "<|im_start|>user\nThe lazy dog<|im_end|>\n<|im_start|>assistant\n"
        for _ in range(2):
            status, answer = self.post("/v1/completions", prompt=text, max_tokens=2)
            self.assertEqual(status, 200, answer)
        status, answer = self.chat(messages=messages, max_tokens=2)
        self.assertEqual(status, 200, answer)

    def test_a_failed_request_leaves_the_server_serving(self):
        places = [
            (server.BatchGenerator, "insert_segments"),
            (server.LRUPromptCache, "fetch_nearest_cache"),
        ]
        for i, (owner, name) in enumerate(places):
            with self.subTest(name):
                error = RuntimeError("no room for it")
                with mock.patch.object(owner, name, side_effect=error) as fail:
                    messages = [{"role": "user", "content": f"Hi {i}"}]
                    status, answer = self.chat(messages=messages)
                fail.assert_called_once()
                # That request fails (how it is answered is not this test's).
                self.assertNotEqual(status, 200, answer)
                messages = [{"role": "user", "content": f"The lazy dog {i}"}]
                status, answer = self.chat(messages=messages, max_tokens=3)
                self.assertEqual(status, 200, answer)


if __name__ == "__main__":
    unittest.main()
