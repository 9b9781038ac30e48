# Copyright © 2026 Apple Inc.

import http.client
import unittest
from unittest import mock

from server_fixture import ServerTestCase, user

from mlx_lm import server


class TestServerFetchErrors(ServerTestCase):
    def chat(self, **body):
        try:
            return self.server.send("POST", "/v1/chat/completions", body)
        except (ConnectionError, http.client.HTTPException) as e:
            return None, repr(e)

    def test_a_failed_request_leaves_the_server_serving(self):
        places = [
            (server.ResponseGenerator, "_make_state_machine"),
            (server.LRUPromptCache, "fetch_nearest_cache"),
            (server.BatchGenerator, "insert_segments"),
        ]
        for i, (owner, name) in enumerate(places):
            with self.subTest(name):
                error = RuntimeError("no room for it")
                with mock.patch.object(owner, name, side_effect=error) as fail:
                    status, answer = self.chat(messages=user(f"Hi {i}"))
                fail.assert_called_once()
                # That request fails (how it is answered is not this test's).
                self.assertNotEqual(status, 200, answer)
                messages = user(f"The lazy dog {i}")
                status, answer = self.chat(messages=messages, max_tokens=3)
                self.assertEqual(status, 200, answer)


if __name__ == "__main__":
    unittest.main()
