# Copyright © 2026 Apple Inc.

import json
import socket
import threading
import unittest

from server_fixture import CountingBatchGenerator, ServerTestCase, user


class TestServerDisconnect(ServerTestCase):

    def _disconnect_mid_answer(self, stream):
        """Three answers at once; the client of the first goes away. Return
        the tokens generated for it and the other two answers' token counts."""
        generated = CountingBatchGenerator.generated
        generated.clear()
        long_answer = 5000

        def send(max_tokens):
            sock = socket.create_connection(("127.0.0.1", self.server.port))
            body = json.dumps(
                {"messages": user(), "max_tokens": max_tokens, "stream": stream}
            ).encode()
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            return sock

        first = send(long_answer)
        # Once its first tokens are out, leave.
        while not generated:
            threading.Event().wait(0.01)
        first.close()
        others = []

        def other():
            body = {"messages": user("Write a story"), "max_tokens": 64}
            body["stream"] = stream
            others.append(self.server.chat(body) if not stream else self._chunks(body))

        threads = [threading.Thread(target=other) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # A request that cannot join a batch waits for the batch to empty.
        status, _ = self.server.chat({"messages": user(), "max_tokens": 2, "seed": 1})
        self.assertEqual(status, 200)
        return generated[min(generated)], long_answer, others

    def _chunks(self, body):
        return self.server.send("POST", "/v1/chat/completions", body)[1]

    def test_client_leaving_a_stream_frees_its_slot(self):
        first, limit, others = self._disconnect_mid_answer(stream=True)
        self.assertLess(first, limit // 2)
        for data in others:
            self.assertTrue(data.rstrip().endswith("data: [DONE]"))
            self.assertIn('"finish_reason": "length"', data)

    def test_client_leaving_before_the_answer_frees_its_slot(self):
        first, limit, others = self._disconnect_mid_answer(stream=False)
        self.assertLess(first, limit // 2)
        for status, answer in others:
            self.assertEqual(status, 200)
            self.assertEqual(answer["usage"]["completion_tokens"], 64)


if __name__ == "__main__":
    unittest.main()
