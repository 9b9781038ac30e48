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

# Linear-attention layers: a cache that cannot be trimmed is reused only at a
# segment's end.
CONFIG = {
    "model_type": "qwen3_5",
    "text_config": {
        "model_type": "qwen3_5_text",
        "vocab_size": 384,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "linear_num_value_heads": 2,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 8,
        "full_attention_interval": 2,
        "tie_word_embeddings": False,
    },
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


class TestServerPromptCache(ServerTestCase):

    def test_a_shared_system_prompt_comes_from_the_prompt_cache(self):
        system = {"role": "system", "content": "The quick brown fox. " * 8}
        cached = []
        for question in ("Jumps over?", "The lazy dog?"):
            messages = [system, {"role": "user", "content": question}]
            status, answer = self.chat({"messages": messages, "max_tokens": 2})
            self.assertEqual(status, 200, answer)
            cached.append(answer["usage"]["prompt_tokens_details"]["cached_tokens"])
        self.assertEqual(cached[0], 0)
        self.assertGreater(cached[1], 30)


if __name__ == "__main__":
    unittest.main()
