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

# Qwen3.5's shape in small: linear-attention layers, whose cache cannot be
# trimmed, and a template that ends in <think> unless thinking is off.
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
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}"
    "<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}"
)
SPECIAL_TOKENS = ["<bos>", "<eos>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]


def make_model_folder(path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    path.mkdir(parents=True)
    mx.random.seed(0)
    model_class, args_class = _get_classes(CONFIG)
    model = model_class(args_class.from_dict(CONFIG))
    # Zero logits for BOS and EOS, so greedy decoding runs to the token limit.
    model.language_model.lm_head.weight[:2] = 0.0
    mx.eval(model.parameters())
    save_model(path, model, donate_model=True)
    with open(path / "config.json", "w") as f:
        json.dump(CONFIG, f)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=CONFIG["text_config"]["vocab_size"],
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(["The quick brown fox jumps. " * 4] * 8, trainer)
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<bos>",
        eos_token="<eos>",
        chat_template=CHAT_TEMPLATE,
    ).save_pretrained(path)
    return path


class TestServerUntrimmableCache(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        path = make_model_folder(Path(cls._tmp.name) / "model")
        argv = ["mlx_lm.server", "--model", str(path), "--log-level", "CRITICAL"]
        with mock.patch.object(server, "run") as run:
            with mock.patch.object(sys, "argv", argv):
                server.main()
        provider = run.call_args.args[2]
        cache = server.LRUPromptCache(provider.cli_args.prompt_cache_size)
        cls.generator = server.ResponseGenerator(provider, cache)
        cls.httpd = ThreadingHTTPServer(
            ("127.0.0.1", 0),
            lambda *a, **kw: server.APIHandler(cls.generator, *a, **kw),
        )
        threading.Thread(target=cls.httpd.serve_forever, daemon=True).start()

    @classmethod
    def tearDownClass(cls):
        cls.httpd.shutdown()
        cls.httpd.server_close()
        cls.generator.stop_and_join()
        cls._tmp.cleanup()

    def chat(self, **body):
        return self.post("/v1/chat/completions", **body)

    def post(self, path, **body):
        port = self.httpd.server_address[1]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        try:
            conn.request("POST", path, json.dumps(body))
            response = conn.getresponse()
            return response.status, response.read().decode()
        except (ConnectionError, http.client.HTTPException) as e:
            return None, repr(e)
        finally:
            conn.close()

    def test_a_request_repeated_after_one_without_thinking_is_served(self):
        messages = [{"role": "user", "content": "The quick brown fox"}]
        thinking_off = {"chat_template_kwargs": {"enable_thinking": False}}
        for kwargs in ({}, thinking_off, {}, thinking_off):
            status, answer = self.chat(messages=messages, max_tokens=4, **kwargs)
            self.assertEqual(status, 200, answer)
            usage = json.loads(answer)["usage"]
            self.assertEqual(usage["completion_tokens"], 4)

    def test_a_prompt_the_cache_holds_whole_is_served(self):
        # The chat request caches its prompt up to the thinking tail; the
        # completion's prompt is that text: its cache leaves nothing to feed.
        messages = [{"role": "user", "content": "The lazy dog"}]
        status, answer = self.chat(messages=messages, max_tokens=2)
        self.assertEqual(status, 200, answer)
        text = "<|im_start|>user\nThe lazy dog<|im_end|>\n<|im_start|>assistant\n"
        for _ in range(2):
            status, answer = self.post("/v1/completions", prompt=text, max_tokens=2)
            self.assertEqual(status, 200, answer)
        status, answer = self.chat(messages=messages, max_tokens=2)
        self.assertEqual(status, 200, answer)

    def test_a_failed_request_leaves_the_server_serving(self):
        places = [
            (server.BatchGenerator, "insert_segments"),
            (server.LRUPromptCache, "fetch_nearest_cache"),
        ]
        for i, (owner, name) in enumerate(places):
            with self.subTest(name):
                error = RuntimeError("no room for it")
                with mock.patch.object(owner, name, side_effect=error) as fail:
                    messages = [{"role": "user", "content": f"Hi {i}"}]
                    status, answer = self.chat(messages=messages)
                fail.assert_called_once()
                # That request fails (how it is answered is not this test's).
                self.assertNotEqual(status, 200, answer)
                messages = [{"role": "user", "content": f"The lazy dog {i}"}]
                status, answer = self.chat(messages=messages, max_tokens=3)
                self.assertEqual(status, 200, answer)


if __name__ == "__main__":
    unittest.main()
