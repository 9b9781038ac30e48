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
from mlx_lm.utils import _get_classes, save_model

from mlx_lm import server
from mlx_lm.models import llama

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


def make_tiny_tokenizer(path, vocab_size, chat_template=CHAT_TEMPLATE):
    """A byte-level BPE tokenizer of vocab_size tokens saved in path."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
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


def make_tiny_model_folder(path, model_type="llama", seed=0, **tokenizer_args):
    """Write a random tiny model (config, weights, tokenizer) to path."""
    config = TINY_CONFIGS[model_type]
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


def error_message(answer):
    """The message of an error answer: the error itself on 0.32.2, its
    message in OpenAI's shape (server-openai-errors)."""
    error = answer["error"]
    return error["message"] if isinstance(error, dict) else error


def user(text="The quick brown fox"):
    return [{"role": "user", "content": text}]


class ServerTestCase(unittest.TestCase):
    """A server on a tiny model folder, shared by a class's tests."""

    @classmethod
    def make_model_folder(cls, path):
        return make_tiny_model_folder(path)

    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        cls.path = cls.make_model_folder(Path(cls._tmp.name) / "model")
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
            self.assertIn(word, error_message(answer))
        self.assertServes()


class TestServerRequests(ServerTestCase):

    def test_empty_messages_name_the_field(self):
        self.assertRejected({"messages": []}, 400, "messages")

    def test_messages_that_are_not_a_list_name_the_field(self):
        for messages in ("Hi", {"role": "user", "content": "Hi"}, None, ["Hi"]):
            with self.subTest(messages=messages):
                self.assertRejected({"messages": messages}, 400, "messages")
        self.assertRejected({"max_tokens": 3}, 400, "messages")

    def test_a_role_the_chat_template_takes_is_served(self):
        # Llama 3.1's templates take ipython, the role of tool results.
        messages = user() + [{"role": "ipython", "content": "42"}]
        status, answer = self.server.chat({"messages": messages, "max_tokens": 3})
        self.assertEqual(status, 200, answer)

    def test_a_role_the_chat_template_rejects_is_a_400_with_its_message(self):
        body = {"messages": [{"role": "bogus", "content": "Hi"}], "max_tokens": 3}
        self.assertRejected(body, 400, "chat template", "Unknown role: bogus")
        body = {"messages": [{"content": "Hi"}], "max_tokens": 3}
        self.assertRejected(body, 400, "messages[0].role")

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

    def test_a_rope_scaled_model_serves_prompts_past_its_max_positions(self):
        text = "The quick brown fox jumps over the lazy dog. " * 20
        status, answer = self.server.chat({"messages": user(text), "max_tokens": 3})
        self.assertEqual(status, 200, answer)
        limit = TINY_CONFIGS["llama"]["max_position_embeddings"]
        self.assertGreater(answer["usage"]["prompt_tokens"], limit)
        body = {"prompt": text, "max_tokens": 3}
        status, answer = self.server.request("POST", "/v1/completions", body)
        self.assertEqual(status, 200, answer)

    def test_unknown_model_is_a_404_naming_it(self):
        body = {"model": "nobody/no-such-model", "messages": user(), "max_tokens": 3}
        self.assertRejected(body, 404, "nobody/no-such-model")

    def test_generation_error_is_a_500_and_the_server_goes_on(self):
        def fail(*args, **kwargs):
            raise RuntimeError("the forward pass broke")

        for stream in (False, True):
            with self.subTest(stream=stream):
                body = {"messages": user(), "max_tokens": 3, "stream": stream}
                with mock.patch.object(llama.Model, "__call__", fail):
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


if __name__ == "__main__":
    unittest.main()
