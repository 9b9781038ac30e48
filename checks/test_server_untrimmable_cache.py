# Copyright © 2026 Apple Inc.
"""server-untrimmable-cache through the server (tests/server_fixture.py) on
Qwen3.5 with a template that ends in <think>: a chat prompt cached up to its
thinking tail, sent whole as a completion, is served; requests with thinking
on and off in turn are served."""

import http.client
import json
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from server_fixture import ServerTestCase  # noqa: E402

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


if __name__ == "__main__":
    unittest.main()
