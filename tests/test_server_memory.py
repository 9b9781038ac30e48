# Copyright © 2026 Apple Inc.

import http.client
import json
import subprocess
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


def make_provider(path, *args):
    """The ModelProvider `mlx_lm.server` makes, with its default arguments."""
    argv = ["mlx_lm.server", "--model", str(path), "--log-level", "ERROR", *args]
    with mock.patch.object(server, "run") as run, mock.patch.object(sys, "argv", argv):
        server.main()
    return run.call_args.args[2]


def start_server(path, *args):
    """mlx_lm.server on the model folder path, on a free loopback port."""
    provider = make_provider(path, *args)
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
            path = make_model_folder(Path(tmp))
            args = [] if batched else ["--draft-model", str(path)]
            httpd, generator = start_server(path, *args)
            try:
                with mock.patch.object(
                    server, "_malloc_trim", lambda pad: trimmed.set()
                ):
                    body = {"messages": user(), "max_tokens": 8}
                    port = httpd.server_address[1]
                    status, answer = request(port, "POST", "/v1/chat/completions", body)
                    self.assertEqual(status, 200, answer)
                    self.assertTrue(trimmed.wait(60), "malloc_trim was not called")
                self.assertEqual(mx.get_cache_memory(), 0)
            finally:
                httpd.shutdown()
                httpd.server_close()
                generator.stop_and_join()

    @unittest.skipUnless(server._mallopt is not None, "glibc's malloc")
    def test_freed_buffers_go_back_to_the_system(self):
        # glibc raises its mmap threshold to the size of a freed buffer
        # (up to 32 MiB); smaller buffers then come from heaps that keep
        # their memory when freed. The server keeps the threshold.
        with mock.patch.object(server, "fix_mmap_threshold") as fix:
            with tempfile.TemporaryDirectory() as tmp:
                make_provider(make_model_folder(Path(tmp)))
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


if __name__ == "__main__":
    unittest.main()
