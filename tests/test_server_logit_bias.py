# Copyright © 2026 Apple Inc.

import json
import threading
import unittest

from server_fixture import ServerTestCase, user


class TestServerLogitBias(ServerTestCase):
    """A logit_bias token id the model does not have is the request's 400; the
    requests batched beside it are served."""

    def test_a_token_id_outside_the_vocabulary_is_a_400(self):
        body = {"messages": user(), "max_tokens": 8, "temperature": 0}
        answers = {}

        def send(name, body):
            answers[name] = self.server.send("POST", "/v1/chat/completions", body)

        threads = [
            threading.Thread(target=send, args=("plain", body)),
            threading.Thread(
                target=send, args=("bad", dict(body, logit_bias={"99999": 3}))
            ),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        status, text = answers["bad"]
        self.assertEqual(status, 400, text)
        error = json.loads(text)["error"]
        self.assertEqual(error["param"], "logit_bias")
        self.assertIn("token id 99999", error["message"])
        status, text = answers["plain"]
        self.assertEqual(status, 200, text)
        self.assertEqual(json.loads(text)["usage"]["completion_tokens"], 8)
        for token in ("-1", "0"):
            with self.subTest(token=token):
                answer = self.server.send(
                    "POST", "/v1/chat/completions", dict(body, logit_bias={token: 1})
                )
                self.assertEqual(answer[0], 400 if token == "-1" else 200, answer)


if __name__ == "__main__":
    unittest.main()
