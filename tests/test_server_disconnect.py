# Copyright © 2026 Apple Inc.

import http.client
import json
import socket
import sys
import tempfile
import threading
import unittest
from http.server import ThreadingHTTPServer
from pathlib import Path
from unittest import mock

import mlx.core as mx
from mlx_lm.utils import _get_classes, save_config, save_model

from mlx_lm import server

CONFIG = {
    "model_type": "llama",
    "vocab_size": 384,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}
CHAT_TEMPLATE = (
    "{% for m in messages %}<|start|>{{ m.role }}<|sep|>{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant<|sep|>{% endif %}"
)


def make_model_folder(path, config=CONFIG, chat_template=CHAT_TEMPLATE):
    """A random tiny model and a byte-level BPE tokenizer trained on a line."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    mx.random.seed(0)
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    # Zero logits for BOS and EOS, so greedy decoding runs to the token limit.
    getattr(model, "language_model", model).lm_head.weight[:2] = 0.0
    save_model(path, model)
    save_config(dict(config), path / "config.json")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384,
        special_tokens=["<bos>", "<eos>", "<|start|>", "<|sep|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = ["The quick brown fox jumps over the lazy dog. " * 4] * 8
    tokenizer.train_from_iterator(text, trainer)
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<bos>",
        eos_token="<eos>",
        chat_template=chat_template,
    ).save_pretrained(path)
    return path


def start_server(path, *args):
    """mlx_lm.server on the model folder path, on a free loopback port."""
    argv = ["mlx_lm.server", "--model", str(path), "--log-level", "ERROR", *args]
    with mock.patch.object(server, "run") as run, mock.patch.object(sys, "argv", argv):
        server.main()
    provider = run.call_args.args[2]
    cache = server.LRUPromptCache(provider.cli_args.prompt_cache_size)
    generator = server.ResponseGenerator(provider, cache)
    httpd = ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *a, **kw: server.APIHandler(generator, *a, **kw)
    )
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, generator


def request(port, method, path, body=None):
    """Send one request; return the status and the decoded JSON answer."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    conn.request(method, path, None if body is None else json.dumps(body))
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, json.loads(data)


def user(text="The quick brown fox"):
    return [{"role": "user", "content": text}]


class CountingBatchGenerator(server.BatchGenerator):
    """A BatchGenerator that counts the tokens it generates for each uid."""

    generated = {}

    def next(self):
        prompt_responses, gen_responses = super().next()
        for r in gen_responses:
            self.generated[r.uid] = self.generated.get(r.uid, 0) + 1
        return prompt_responses, gen_responses


class ServerTestCase(unittest.TestCase):
    """A server on a tiny model folder, shared by the class's tests."""

    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        cls.path = make_model_folder(Path(cls._tmp.name))
        patch = mock.patch.object(server, "BatchGenerator", CountingBatchGenerator)
        patch.start()
        cls.addClassCleanup(patch.stop)
        cls.httpd, cls.generator = start_server(cls.path)
        cls.port = cls.httpd.server_address[1]

    @classmethod
    def tearDownClass(cls):
        cls.httpd.shutdown()
        cls.httpd.server_close()
        cls.generator.stop_and_join()
        cls._tmp.cleanup()

    def chat(self, body):
        return request(self.port, "POST", "/v1/chat/completions", body)


class TestServerDisconnect(ServerTestCase):

    def _disconnect_mid_answer(self, stream):
        """Three answers at once; the client of the first goes away. Return
        the tokens generated for it and the other two answers' token counts."""
        generated = CountingBatchGenerator.generated
        generated.clear()
        long_answer = 5000

        def send(max_tokens):
            sock = socket.create_connection(("127.0.0.1", self.port))
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
            others.append(self.chat(body) if not stream else self._chunks(body))

        threads = [threading.Thread(target=other) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # A request that cannot join a batch waits for the batch to empty.
        status, _ = self.chat({"messages": user(), "max_tokens": 2, "seed": 1})
        self.assertEqual(status, 200)
        return generated[min(generated)], long_answer, others

    def _chunks(self, body):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
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


if __name__ == "__main__":
    unittest.main()
