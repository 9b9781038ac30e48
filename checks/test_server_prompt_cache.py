# Copyright © 2026 Apple Inc.
"""server-prompt-cache through the server (tests/server_fixture.py): a
shared system prompt comes from the prompt cache on Qwen3.5."""

import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from server_fixture import ServerTestCase  # noqa: E402


class TestServerPromptCache(ServerTestCase):
    # Linear-attention layers: a cache that cannot be trimmed is reused only
    # at a segment's end.
    model_type = "qwen3_5"

    def test_a_shared_system_prompt_comes_from_the_prompt_cache(self):
        system = {"role": "system", "content": "The quick brown fox. " * 8}
        cached = []
        for question in ("Jumps over?", "The lazy dog?"):
            messages = [system, {"role": "user", "content": question}]
            status, answer = self.server.chat({"messages": messages, "max_tokens": 2})
            self.assertEqual(status, 200, answer)
            cached.append(answer["usage"]["prompt_tokens_details"]["cached_tokens"])
        self.assertEqual(cached[0], 0)
        self.assertGreater(cached[1], 30)


if __name__ == "__main__":
    unittest.main()
