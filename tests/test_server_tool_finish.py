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
from mlx_lm.server import Response
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
    # The markers name the json_tools parser: <tool_call>{json}</tool_call>.
    "{# <tool_call> tool_call.name #}"
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
        special_tokens=[
            "<bos>",
            "<eos>",
            "<|start|>",
            "<|sep|>",
            "<tool_call>",
            "</tool_call>",
        ],
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


CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
NOT_A_CALL = "<tool_call>the weather in Paris</tool_call>"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {}}},
        },
    }
]


class TestServerToolFinish(ServerTestCase):

    def replying(self, reply):
        """Patch the server to answer with reply instead of the model's text."""
        generator = self.generator
        generate = generator.generate

        def answer(request, args, progress_callback=None):
            ctx, response = generate(request, args, progress_callback)

            def texts():
                for _ in response:
                    pass
                for text in reply:
                    yield Response(text, 0, 0.0, None, {})
                yield Response("", 0, 0.0, "stop", {})

            return ctx, texts()

        return mock.patch.object(generator, "generate", answer)

    def ask(self, reply, stream):
        """(content, tool call names, finish_reason) as a client sees them."""
        body = {"messages": user(), "tools": TOOLS, "max_tokens": 2, "stream": stream}
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        with self.replying(reply):
            conn.request("POST", "/v1/chat/completions", json.dumps(body))
            data = conn.getresponse().read().decode()
        conn.close()
        if not stream:
            choice = json.loads(data)["choices"][0]
            calls = choice["message"].get("tool_calls") or []
            content = choice["message"]["content"] or ""
            names = [c["function"]["name"] for c in calls]
            return content, names, choice["finish_reason"]
        content, names, finish = "", [], None
        for line in data.splitlines():
            if line.startswith("data: {"):
                choice = json.loads(line[len("data: ") :])["choices"][0]
                content += choice["delta"].get("content") or ""
                calls = choice["delta"].get("tool_calls") or []
                names += [c["function"]["name"] for c in calls]
                finish = choice["finish_reason"] or finish
        return content, names, finish

    def assertAnswers(self, reply, content, names, finish_reason):
        for stream in (False, True):
            with self.subTest(stream=stream):
                self.assertEqual(
                    self.ask(reply, stream), (content, names, finish_reason)
                )

    def test_a_parsed_call_finishes_with_tool_calls(self):
        self.assertAnswers([CALL], "", ["get_weather"], "tool_calls")
        self.assertAnswers([CALL, " Done."], " Done.", ["get_weather"], "tool_calls")

    def test_an_unparsed_call_finishes_with_stop_streamed_or_not(self):
        # OpenAI's finish_reason is tool_calls only where tool calls are
        # returned; the text that does not parse comes back as content.
        self.assertAnswers([NOT_A_CALL], NOT_A_CALL, [], "stop")
        self.assertAnswers([NOT_A_CALL, " Done."], NOT_A_CALL + " Done.", [], "stop")

    def test_a_parsed_and_an_unparsed_call_finish_with_tool_calls(self):
        reply = [NOT_A_CALL, " and ", CALL]
        self.assertAnswers(reply, NOT_A_CALL + " and ", ["get_weather"], "tool_calls")


if __name__ == "__main__":
    unittest.main()
