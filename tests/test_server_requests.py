# Copyright © 2026 Apple Inc.

import http.client
import json
import socket
import subprocess
import sys
import tempfile
import threading
import unittest
from http.server import ThreadingHTTPServer
from pathlib import Path
from unittest import mock

import mlx.core as mx
from test_deepseek_v4 import make_tiny_model_folder

from mlx_lm import server
from mlx_lm.models import deepseek_v4


def make_model_provider(model_path, *args):
    """The ModelProvider `mlx_lm.server` makes, with its default arguments."""
    argv = ["mlx_lm.server", "--model", str(model_path), "--log-level", "ERROR"]
    with mock.patch.object(server, "run") as run:
        with mock.patch.object(sys, "argv", argv + list(args)):
            server.main()
    return run.call_args.args[2]


# Run in a fresh process, whose heap has no free chunk that could serve the
# buffer: malloc an 8 MiB buffer after a 16 MiB one was freed and print how
# many new mappings it took (glibc's mallinfo2().hblks, the 4th field).
MMAP_PROBE = """
import ctypes, sys
from mlx_lm import server
if sys.argv[1] == "fix":
    server.fix_mmap_threshold()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
class MallInfo(ctypes.Structure):
    _fields_ = [(str(i), ctypes.c_size_t) for i in range(10)]
libc.mallinfo2.restype = MallInfo
libc.free(libc.malloc(16 << 20))
before = getattr(libc.mallinfo2(), "3")
buffer = libc.malloc(8 << 20)
print(getattr(libc.mallinfo2(), "3") - before)
"""


class ServerThread:
    """`mlx_lm.server` on a free loopback port, in this process."""

    def __init__(self, model_path, *args):
        provider = make_model_provider(model_path, *args)
        cache = server.LRUPromptCache(provider.cli_args.prompt_cache_size)
        self.generator = server.ResponseGenerator(provider, cache)
        self.httpd = ThreadingHTTPServer(
            ("127.0.0.1", 0),
            lambda *a, **kw: server.APIHandler(self.generator, *a, **kw),
        )
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.generator.stop_and_join()

    def request(self, method, path, body=None):
        """Send one request; return the status and the decoded JSON answer."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        if body is not None and not isinstance(body, str):
            body = json.dumps(body)
        conn.request(method, path, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
        conn.close()
        return response.status, json.loads(data) if data else None

    def chat(self, body):
        return self.request("POST", "/v1/chat/completions", body)


class CountingBatchGenerator(server.BatchGenerator):
    """A BatchGenerator that counts the tokens it generates for each uid."""

    generated = {}

    def next(self):
        prompt_responses, gen_responses = super().next()
        for r in gen_responses:
            self.generated[r.uid] = self.generated.get(r.uid, 0) + 1
        return prompt_responses, gen_responses


def user(text="The quick brown fox"):
    return [{"role": "user", "content": text}]


class TestServerRequests(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        cls.path = make_tiny_model_folder(Path(cls._tmp.name) / "model")
        cls._patch = mock.patch.object(server, "BatchGenerator", CountingBatchGenerator)
        cls._patch.start()
        cls.server = ServerThread(cls.path)

    @classmethod
    def tearDownClass(cls):
        cls.server.close()
        cls._patch.stop()
        cls._tmp.cleanup()

    def assertServes(self):
        status, answer = self.server.chat({"messages": user(), "max_tokens": 3})
        self.assertEqual(status, 200, answer)
        self.assertEqual(answer["usage"]["completion_tokens"], 3)

    def assertRejected(self, body, status, *words, path="/v1/chat/completions"):
        got, answer = self.server.request("POST", path, body)
        self.assertEqual(got, status, answer)
        for word in words:
            self.assertIn(word, answer["error"])
        self.assertServes()

    def test_empty_messages_name_the_field(self):
        self.assertRejected({"messages": []}, 400, "messages")

    def test_messages_that_are_not_a_list_name_the_field(self):
        for messages in ("Hi", {"role": "user", "content": "Hi"}, None, ["Hi"]):
            with self.subTest(messages=messages):
                self.assertRejected({"messages": messages}, 400, "messages")
        self.assertRejected({"max_tokens": 3}, 400, "messages")

    def test_unknown_role_is_rejected(self):
        body = {"messages": [{"role": "bogus", "content": "Hi"}], "max_tokens": 3}
        self.assertRejected(body, 400, "messages[0].role", "bogus")

    def test_wrong_types_name_the_field(self):
        cases = [
            ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
            ({"messages": user(), "max_tokens": True}, "max_tokens"),
            ({"messages": user(), "max_tokens": "8"}, "max_tokens"),
            ({"messages": user(), "temperature": "hot"}, "temperature"),
            ({"messages": user(), "stop": 5}, "stop"),
            ({"messages": user(), "tools": "get_weather"}, "tools"),
            ({"messages": user(), "stream": True, "stream_options": 1}, "include"),
        ]
        for body, field in cases:
            with self.subTest(field=field):
                self.assertRejected(body, 400, field)
        path = "/v1/completions"
        self.assertRejected({"prompt": [1, 2]}, 400, "prompt", path=path)

    def test_values_out_of_range_name_the_field(self):
        cases = [
            ({"max_tokens": 0}, "max_tokens"),
            ({"max_tokens": -5}, "max_tokens"),
            ({"temperature": -1}, "temperature"),
            ({"top_p": 1.5}, "top_p"),
            ({"top_p": -0.1}, "top_p"),
        ]
        for fields, field in cases:
            with self.subTest(**fields):
                self.assertRejected({"messages": user(), **fields}, 400, field)
        # json.loads reads NaN, which no range check catches.
        body = '{"messages": [{"role": "user", "content": "Hi"}], "temperature": NaN}'
        self.assertRejected(body, 400, "temperature")

    def test_more_than_one_choice_is_rejected(self):
        self.assertRejected({"messages": user(), "n": 2}, 400, "n must be 1")

    def test_prompt_longer_than_the_context_is_rejected(self):
        text = "The quick brown fox jumps over the lazy dog. " * 40
        body = {"messages": user(text), "max_tokens": 3}
        self.assertRejected(body, 400, "messages", "max_position_embeddings")
        body = {"prompt": text, "max_tokens": 3}
        path = "/v1/completions"
        self.assertRejected(body, 400, "prompt", "256", path=path)

    def test_unknown_model_is_a_404_naming_it(self):
        body = {"model": "nobody/no-such-model", "messages": user(), "max_tokens": 3}
        self.assertRejected(body, 404, "nobody/no-such-model")

    def test_generation_error_is_a_500_and_the_server_goes_on(self):
        def fail(*args, **kwargs):
            raise RuntimeError("the forward pass broke")

        for stream in (False, True):
            with self.subTest(stream=stream):
                body = {"messages": user(), "max_tokens": 3, "stream": stream}
                with mock.patch.object(deepseek_v4.Model, "__call__", fail):
                    conn = http.client.HTTPConnection(
                        "127.0.0.1", self.server.port, timeout=300
                    )
                    conn.request("POST", "/v1/chat/completions", json.dumps(body))
                    response = conn.getresponse()
                    data = response.read().decode()
                    conn.close()
                if stream:
                    # The stream began before the model ran: the error is an event.
                    self.assertIn('"error"', data)
                else:
                    self.assertEqual(response.status, 500, data)
                self.assertIn("the forward pass broke", data)
                self.assertServes()

    def test_models_lists_the_served_model_without_a_hub_cache(self):
        globals_ = server.scan_cache_dir.__globals__
        with tempfile.TemporaryDirectory() as tmp:
            missing = str(Path(tmp) / "no-hub-cache")
            with mock.patch.dict(globals_, {"HF_HUB_CACHE": missing}):
                status, answer = self.server.request("GET", "/v1/models")
        self.assertEqual(status, 200)
        self.assertEqual(answer["object"], "list")
        ids = [m["id"] for m in answer["data"]]
        self.assertIn(str(self.path.resolve()), ids)
        # Clients pass that id back as the model.
        body = {"model": ids[-1], "messages": user(), "max_tokens": 3}
        self.assertEqual(self.server.chat(body)[0], 200)

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
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=300)
        conn.request("POST", "/v1/chat/completions", json.dumps(body))
        data = conn.getresponse().read().decode()
        conn.close()
        return data

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


class TestServerMemory(unittest.TestCase):

    def test_an_idle_server_gives_the_memory_of_its_requests_back(self):
        # Without it the resident memory of a server between bursts of
        # requests moves by 10% with what malloc and MLX's cache kept.
        self.check_idle_release(batched=True)

    def test_an_idle_unbatched_server_gives_the_memory_back(self):
        # A draft model makes the server serve one request at a time.
        self.check_idle_release(batched=False)

    def check_idle_release(self, batched):
        trimmed = threading.Event()
        with tempfile.TemporaryDirectory() as tmp:
            path = make_tiny_model_folder(Path(tmp) / "model")
            args = [] if batched else ["--draft-model", str(path)]
            server_thread = ServerThread(path, *args)
            try:
                with mock.patch.object(
                    server, "_malloc_trim", lambda pad: trimmed.set()
                ):
                    body = {"messages": user(), "max_tokens": 8}
                    status, answer = server_thread.chat(body)
                    self.assertEqual(status, 200, answer)
                    self.assertTrue(trimmed.wait(60), "malloc_trim was not called")
                self.assertEqual(mx.get_cache_memory(), 0)
            finally:
                server_thread.close()

    @unittest.skipUnless(server._mallopt is not None, "glibc's malloc")
    def test_freed_buffers_go_back_to_the_system(self):
        # glibc raises its mmap threshold to the size of a freed buffer
        # (up to 32 MiB); smaller buffers then come from heaps that keep
        # their memory when freed. The server keeps the threshold.
        with mock.patch.object(server, "fix_mmap_threshold") as fix:
            with tempfile.TemporaryDirectory() as tmp:
                make_model_provider(make_tiny_model_folder(Path(tmp) / "model"))
        fix.assert_called_once()
        mapped = {}
        for arg in ("fix", "no-fix"):
            run = subprocess.run(
                [sys.executable, "-c", MMAP_PROBE, arg],
                capture_output=True,
                text=True,
                timeout=120,
            )
            self.assertEqual(run.returncode, 0, run.stderr)
            mapped[arg] = int(run.stdout)
        self.assertEqual(mapped, {"fix": 1, "no-fix": 0})


class TestServerWithABadModelFolder(unittest.TestCase):

    def test_requests_name_the_load_error(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = make_tiny_model_folder(Path(tmp) / "model")
            weights = path / "model.safetensors"
            with open(weights, "r+b") as f:
                f.truncate(weights.stat().st_size // 2)
            server = ServerThread(path)
            try:
                server.generator.join()
                status, answer = server.request("GET", "/health")
                self.assertEqual(status, 503)
                status, answer = server.chat({"messages": user(), "max_tokens": 3})
                self.assertEqual(status, 500)
                self.assertIn(str(weights), answer["error"])
            finally:
                server.close()


if __name__ == "__main__":
    unittest.main()
