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

CONFIG = {
    "model_type": "llama",
    "vocab_size": 320,
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


def make_model_folder(path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    path.mkdir(parents=True)
    mx.random.seed(0)
    model_class, args_class = _get_classes(CONFIG)
    model = model_class(args_class.from_dict(CONFIG))
    # Zero logits for BOS and EOS, so greedy decoding runs to the token limit.
    model.lm_head.weight[:2] = 0.0
    mx.eval(model.parameters())
    save_model(path, model, donate_model=True)
    with open(path / "config.json", "w") as f:
        json.dump(CONFIG, f)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=CONFIG["vocab_size"],
        special_tokens=["<bos>", "<eos>", "<|start|>", "<|sep|>"],
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


class TestServerLogprobs(unittest.TestCase):

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

    def post(self, path, **body):
        port = self.httpd.server_address[1]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        conn.request("POST", path, json.dumps(body))
        response = conn.getresponse()
        answer = json.loads(response.read())
        conn.close()
        self.assertEqual(response.status, 200, answer)
        return answer

    def logprobs(self, path, temperature, seed=0):
        body = {"max_tokens": 8, "temperature": temperature, "seed": seed}
        body.update(logprobs=True, top_logprobs=5)
        if path == "/v1/completions":
            body["prompt"] = "The quick brown fox"
        else:
            body["messages"] = [{"role": "user", "content": "The quick brown fox"}]
        content = self.post(path, **body)["choices"][0]["logprobs"]["content"]
        self.assertEqual(len(content), 8)
        for entry in content:
            tops = entry["top_logprobs"]
            self.assertEqual(len(tops), 5)
            values = [t["logprob"] for t in tops]
            self.assertEqual(values, sorted(values, reverse=True))
            self.assertLessEqual(entry["logprob"], values[0])
            for top in tops:
                if top["id"] == entry["id"]:
                    self.assertEqual(top, {k: entry[k] for k in top})
        return content

    def test_greedy_logprobs_name_the_argmax_and_sort_the_tops(self):
        for path in ("/v1/chat/completions", "/v1/completions"):
            with self.subTest(path=path):
                for entry in self.logprobs(path, temperature=0.0):
                    best = entry["top_logprobs"][0]
                    self.assertEqual(entry["id"], best["id"])
                    self.assertEqual(entry["token"], best["token"])
                    self.assertEqual(entry["logprob"], best["logprob"])

    def test_sampled_logprobs_name_the_sampled_token(self):
        # At temperature 10 some tokens are not the argmax; each entry still
        # names the token generated: its text is the completion's.
        body = {"prompt": "The quick brown fox", "max_tokens": 8, "seed": 3}
        body["temperature"] = 10.0
        text = self.post("/v1/completions", **body)["choices"][0]["text"]
        content = self.logprobs("/v1/completions", temperature=10.0, seed=3)
        tokenizer = self.generator.model_provider.tokenizer
        ids = [entry["id"] for entry in content]
        self.assertEqual(tokenizer.decode(ids), text)
        self.assertTrue(any(e["id"] != e["top_logprobs"][0]["id"] for e in content))


if __name__ == "__main__":
    unittest.main()
