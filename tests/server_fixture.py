# Copyright © 2026 Apple Inc.
"""The server PRs' test fixture: a tiny random model folder written to a
temporary folder, `mlx_lm.server` in this process on a free loopback port,
and helpers to send it requests. Not a test file: the tests import it."""

import http.client
import json
import os
import sys
import tempfile
import threading
import time
import unittest
from http.server import ThreadingHTTPServer
from pathlib import Path
from unittest import mock

import mlx.core as mx

from mlx_lm import server
from mlx_lm.utils import _get_classes, save_model

TINY_CONFIGS = {
    # A yarn-scaled Llama: its prompts may be longer than max_position_embeddings.
    "llama": {
        "model_type": "llama",
        "vocab_size": 384,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 64,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        "tie_word_embeddings": False,
    },
    # Linear-attention layers: a cache that cannot be trimmed.
    "qwen3_5": {
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
    },
}

# A chat format whose turns are "<|start|>role<|sep|>content"; it takes the
# roles of Llama 3.1 (ipython) and Qwen (tool), as templates decide.
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m.role not in ['system', 'user', 'assistant', 'ipython', 'tool'] %}"
    "{{ raise_exception('Unknown role: ' + m.role) }}{% endif %}"
    "<|start|>{{ m.role }}<|sep|>{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant<|sep|>{% endif %}"
)
SPECIAL_TOKENS = (
    "<bos>",
    "<eos>",
    "<|start|>",
    "<|sep|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
)


def make_tiny_tokenizer(
    path, vocab_size, chat_template=CHAT_TEMPLATE, special_tokens=SPECIAL_TOKENS
):
    """A byte-level BPE tokenizer of vocab_size tokens saved in path; its
    first two special tokens are BOS and EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = ["The quick brown fox jumps over the lazy dog. " * 4] * 8
    tokenizer.train_from_iterator(text, trainer)
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=special_tokens[0],
        eos_token=special_tokens[1],
        chat_template=chat_template,
    ).save_pretrained(path)


def make_tiny_model_folder(
    path, model_type="llama", seed=0, config=None, **tokenizer_args
):
    """Write a random tiny model (config, weights, tokenizer) to path: the
    config of TINY_CONFIGS[model_type], its fields in config replaced;
    tokenizer_args go to make_tiny_tokenizer (chat_template, special_tokens).
    The tokenizer holds fewer tokens than the model's vocabulary (298 of
    384 with the default tokenizer): the ids past its tokens are none."""
    config = {**TINY_CONFIGS[model_type], **(config or {})}
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    mx.random.seed(seed)
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    # Zero logits for BOS and EOS, so greedy decoding runs to the token limit.
    getattr(model, "language_model", model).lm_head.weight[:2] = 0.0
    mx.eval(model.parameters())
    save_model(path, model, donate_model=True)
    with open(path / "config.json", "w") as f:
        json.dump(config, f, indent=2)
    vocab_size = config.get("vocab_size") or config["text_config"]["vocab_size"]
    make_tiny_tokenizer(path, vocab_size, **tokenizer_args)
    return path


def make_model_provider(model_path, *args):
    """The ModelProvider `mlx_lm.server` makes, with its default arguments."""
    argv = ["mlx_lm.server", "--model", str(model_path), "--log-level", "ERROR"]
    with mock.patch.object(server, "run") as run:
        with mock.patch.object(sys, "argv", argv + list(args)):
            server.main()
    return run.call_args.args[2]


def join_generation_thread(generator):
    """Stop the server's generation thread and wait until it has exited: its
    thread-local MLX compile cache is freed after Python's join returns, and a
    process that exits meanwhile can abort ("terminate called without an
    active exception")."""
    generator.stop_and_join()
    task = f"/proc/self/task/{generator._generation_thread.native_id}"
    while os.path.exists(task):
        time.sleep(0.01)


class ServerThread:
    """`mlx_lm.server` on a free loopback port, in this process; args are
    the command's options after --model."""

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
        join_generation_thread(self.generator)

    def send(self, method, path, body=None):
        """Send one request (body: JSON, or a str sent as it is); return the
        status and the answer's text (a stream's events)."""
        if body is not None and not isinstance(body, str):
            body = json.dumps(body)
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        try:
            conn.request(method, path, body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            return response.status, response.read().decode()
        finally:
            conn.close()

    def request(self, method, path, body=None):
        """Send one request; return the status and the decoded JSON answer."""
        status, data = self.send(method, path, body)
        return status, json.loads(data) if data else None

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


def error_message(answer):
    """The message of an error answer: the error itself on 0.32.2, its
    message in OpenAI's shape (server-openai-errors)."""
    error = answer["error"]
    return error["message"] if isinstance(error, dict) else error


def user(text="The quick brown fox"):
    return [{"role": "user", "content": text}]


class ServerTestCase(unittest.TestCase):
    """A server (``cls.server``, a ServerThread) on a tiny model folder
    (``cls.path``), shared by a class's tests, its BatchGenerator a
    CountingBatchGenerator. A class picks the folder's model_type, config
    and tokenizer_args (make_tiny_model_folder's), or makes its own folder
    in make_model_folder."""

    model_type = "llama"
    config = None
    tokenizer_args = {}

    @classmethod
    def make_model_folder(cls, path):
        return make_tiny_model_folder(
            path, cls.model_type, config=cls.config, **cls.tokenizer_args
        )

    @classmethod
    def setUpClass(cls):
        tmp = tempfile.TemporaryDirectory()
        cls.addClassCleanup(tmp.cleanup)
        cls.path = cls.make_model_folder(Path(tmp.name) / "model")
        patch = mock.patch.object(server, "BatchGenerator", CountingBatchGenerator)
        patch.start()
        cls.addClassCleanup(patch.stop)
        cls.server = ServerThread(cls.path)
        cls.addClassCleanup(cls.server.close)

    def assertServes(self):
        status, answer = self.server.chat({"messages": user(), "max_tokens": 3})
        self.assertEqual(status, 200, answer)
        self.assertEqual(answer["usage"]["completion_tokens"], 3)

    def assertRejected(self, body, status, *words, path="/v1/chat/completions"):
        got, answer = self.server.request("POST", path, body)
        self.assertEqual(got, status, answer)
        for word in words:
            self.assertIn(word, error_message(answer))
        self.assertServes()
