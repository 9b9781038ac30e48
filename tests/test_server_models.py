# Copyright © 2026 Apple Inc.

import http.client
import json
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


class ServerTestCase(unittest.TestCase):
    """A server on a tiny model folder, shared by the class's tests."""

    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        cls.path = make_model_folder(Path(cls._tmp.name))
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


class TestServerModels(ServerTestCase):

    def test_models_lists_the_served_model_without_a_hub_cache(self):
        globals_ = server.scan_cache_dir.__globals__
        with tempfile.TemporaryDirectory() as tmp:
            missing = str(Path(tmp) / "no-hub-cache")
            with mock.patch.dict(globals_, {"HF_HUB_CACHE": missing}):
                status, answer = request(self.port, "GET", "/v1/models")
        self.assertEqual(status, 200)
        self.assertEqual(answer["object"], "list")
        ids = [m["id"] for m in answer["data"]]
        self.assertIn(str(self.path.resolve()), ids)
        # Clients pass that id back as the model.
        body = {"model": ids[-1], "messages": user(), "max_tokens": 3}
        self.assertEqual(self.chat(body)[0], 200)


if __name__ == "__main__":
    unittest.main()
