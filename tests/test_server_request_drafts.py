# Copyright © 2026 Apple Inc.

import tempfile
import unittest
from pathlib import Path

from server_fixture import ServerThread, error_message, user
from test_deepseek_v4_mtp import make_model_folder


class TestServerRequestDrafts(unittest.TestCase):
    """A request's num_draft_tokens past what the drafter's caches take back
    is the request's error, where the server's --num-draft-tokens stops it
    at start."""

    @classmethod
    def setUpClass(cls):
        tmp = tempfile.TemporaryDirectory()
        cls.addClassCleanup(tmp.cleanup)
        path = make_model_folder(Path(tmp.name) / "mtp")
        cls.server = ServerThread(path, "--mtp")
        cls.addClassCleanup(cls.server.close)

    def test_too_many_drafts_are_a_bad_request(self):
        # Served alone (a seed) or batched.
        for extra in ({"seed": 1}, {}):
            with self.subTest(extra=extra):
                body = {"messages": user(), "max_tokens": 3, **extra}
                status, answer = self.server.chat({**body, "num_draft_tokens": 32})
                self.assertEqual(status, 400, answer)
                self.assertEqual(answer["error"]["param"], "num_draft_tokens")
                self.assertIn("at most 31 draft tokens", error_message(answer))
                status, answer = self.server.chat({**body, "num_draft_tokens": 31})
                self.assertEqual(status, 200, answer)


if __name__ == "__main__":
    unittest.main()
