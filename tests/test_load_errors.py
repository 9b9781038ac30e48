# Copyright © 2026 Apple Inc.

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from server_fixture import ServerThread

from mlx_lm import load
from mlx_lm.chat_templates.deepseek_v4 import (
    bos_token,
    eos_token,
    special_tokens,
)
from mlx_lm.models import llama
from mlx_lm.models.cache import make_prompt_cache, save_prompt_cache
from mlx_lm.utils import _get_classes, load_model

# Tiny folders: a Llama; a Mamba, whose cache cannot be quantized; a Qwen3.5,
# whose config nests its fields in text_config.
LLAMA = {
    "model_type": "llama",
    "vocab_size": 64,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
}
MAMBA = {
    "model_type": "mamba",
    "vocab_size": 64,
    "hidden_size": 16,
    "intermediate_size": 32,
    "state_size": 4,
    "num_hidden_layers": 1,
    "conv_kernel": 3,
    "use_bias": False,
    "use_conv_bias": True,
    "time_step_rank": 4,
}
QWEN3_5 = {
    "model_type": "qwen3_5",
    "text_config": {
        **LLAMA,
        "model_type": "qwen3_5_text",
        "head_dim": 8,
        "linear_num_value_heads": 2,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 8,
        "full_attention_interval": 1,
    },
}


def make_tokenizer(path, tokens=special_tokens):
    """A word-level tokenizer of 64 words, ``tokens`` first, that names
    DeepSeek-V4's chat format (whose tokens load checks)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = list(tokens) + [f"w{i}" for i in range(len(tokens), 64)]
    tokenizer = Tokenizer(models.WordLevel(dict(zip(words, range(64))), "w63"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=bos_token, eos_token=eos_token
    ).save_pretrained(path)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config["chat_template_type"] = "deepseek_v4"
    (path / "tokenizer_config.json").write_text(json.dumps(config))


def make_folder(path, config=LLAMA):
    """A folder ``mlx_lm.load`` reads: config, random weights, tokenizer."""
    path.mkdir(parents=True)
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    (path / "config.json").write_text(json.dumps(config))
    make_tokenizer(path)
    return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Faults of a model folder; each returns what the error must name.
def truncate_weights(path):
    weights = path / "model.safetensors"
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size // 2)
    return str(weights)


def break_config(path):
    config = path / "config.json"
    config.write_text(config.read_text()[:20])
    return str(config)


def drop_shard(path):
    """Move half the weights to a second shard the index lists, then lose it."""
    weights = mx.load(str(path / "model.safetensors"))
    keys = sorted(weights)
    mx.save_safetensors(
        str(path / "model.safetensors"), {k: weights[k] for k in keys[::2]}
    )
    shards = {k: "model.safetensors" for k in keys[::2]}
    shards.update({k: "model-00002-of-00002.safetensors" for k in keys[1::2]})
    index = {"weight_map": shards}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    return str(path / "model-00002-of-00002.safetensors")


def drop_chat_tokens(path):
    make_tokenizer(path, tokens=[bos_token, eos_token])
    return "<｜User｜>"


def mistype_config(path, key="num_attention_heads"):
    config = json.loads((path / "config.json").read_text())
    (config.get("text_config") or config)[key] = "4"
    (path / "config.json").write_text(json.dumps(config))
    return f"`{key}` '4' is not an integer"


class TemporaryFolderTestCase(unittest.TestCase):

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = Path(self._tmp.name)

    def tearDown(self):
        self._tmp.cleanup()

    def serve(self, path, *options):
        """Start the server on ``path``; return its exit code and stderr, or
        fail if it answers on its port instead."""
        port = free_port()
        cmd = [sys.executable, "-m", "mlx_lm", "server", "--model", str(path)]
        cmd += ["--port", str(port), *options]
        process = subprocess.Popen(
            cmd, cwd=path.parent, stderr=subprocess.PIPE, text=True
        )
        try:
            while process.poll() is None:
                try:
                    urllib.request.urlopen(
                        f"http://127.0.0.1:{port}/health", timeout=60
                    )
                except urllib.error.HTTPError:
                    pass
                except OSError:
                    time.sleep(0.5)
                    continue
                self.fail("mlx_lm.server serves a model it cannot load")
        finally:
            process.kill()
            _, stderr = process.communicate()
        return process.returncode, stderr


class TestBadModelFolders(TemporaryFolderTestCase):

    def test_truncated_safetensors_name_the_file(self):
        path = make_folder(self.tmp / "model")
        truncate_weights(path)
        with self.assertRaisesRegex(ValueError, "model.safetensors"):
            load(str(path))

    def test_tokenizer_without_the_chat_tokens_names_them(self):
        path = make_folder(self.tmp / "model")
        drop_chat_tokens(path)
        with self.assertRaisesRegex(ValueError, "<｜User｜>.*deepseek_v4"):
            load(str(path))

    def test_a_missing_tokenizer_file_is_named(self):
        path = make_folder(self.tmp / "model")
        (path / "tokenizer.json").unlink()
        with self.assertRaisesRegex(ValueError, "has no tokenizer.json"):
            load(str(path))

    def test_a_tokenizer_class_that_builds_from_nothing_is_refused(self):
        # Qwen2Tokenizer (Qwen3.5's) builds an empty vocabulary without
        # tokenizer.json: every prompt encoded to no tokens.
        path = make_folder(self.tmp / "model")
        (path / "tokenizer.json").unlink()
        config = json.loads((path / "tokenizer_config.json").read_text())
        config["tokenizer_class"] = "Qwen2Tokenizer"
        (path / "tokenizer_config.json").write_text(json.dumps(config))
        with self.assertRaisesRegex(ValueError, "has no tokenizer.json"):
            load(str(path))

    def test_a_missing_folder_is_named(self):
        # Paths that cannot be Hugging Face repo ids are not looked up there.
        for path in (self.tmp / "missing", "./missing", "../missing/model"):
            with self.subTest(path=path):
                with self.assertRaisesRegex(FileNotFoundError, f"{path} "):
                    load(str(path))

    def test_a_missing_shard_is_named_where_sanitize_fails(self):
        # A model whose sanitize checks the checkpoint (DeepSeek-V4's) fails
        # on what the lost shard held: the lost file is the cause to name.
        class Model(llama.Model):
            def sanitize(self, weights):
                raise ValueError("the checkpoint is incomplete")

        def classes(config):
            return Model, llama.ModelArgs

        path = make_folder(self.tmp / "model")
        with self.assertRaisesRegex(ValueError, "the checkpoint is incomplete"):
            load_model(path, get_model_classes=classes)
        shard = drop_shard(path)
        with self.assertRaisesRegex(FileNotFoundError, f"Missing {shard} "):
            load_model(path, get_model_classes=classes)

    def test_mistyped_config_values_name_the_field(self):
        for config, key in ((LLAMA, "num_attention_heads"), (QWEN3_5, "hidden_size")):
            with self.subTest(model_type=config["model_type"]):
                path = make_folder(self.tmp / config["model_type"], config)
                named = mistype_config(path, key)
                with self.assertRaisesRegex(ValueError, named):
                    load(str(path))


class TestCommandsWithBadModelFolders(TemporaryFolderTestCase):
    """Every command stops on a folder it cannot load with one line on
    stderr, exit status 1; MLX_LM_DEBUG=1 shows the traceback."""

    def run_command(self, command, *options, env=None):
        cmd = [sys.executable, "-m", "mlx_lm", command, *map(str, options)]
        return subprocess.run(
            cmd,
            input="q\n",
            capture_output=True,
            text=True,
            timeout=300,
            cwd=self.tmp,
            env={**os.environ, **(env or {})},
        )

    def assertOneLine(self, run, named):
        self.assertEqual(run.returncode, 1, run.stderr)
        self.assertEqual(len(run.stderr.strip().splitlines()), 1, run.stderr)
        self.assertIn(named, run.stderr)

    def test_every_command_names_the_file(self):
        path = make_folder(self.tmp / "model")
        config = break_config(path)
        commands = {
            "generate": ["--model", path, "--max-tokens", "2"],
            "chat": ["--model", path],
            "cache_prompt": ["--model", path, "--prompt", "w9 w10"]
            + ["--prompt-cache-file", self.tmp / "cache.safetensors"],
            "convert": ["--hf-path", path, "--mlx-path", self.tmp / "converted"],
            "lora": ["--model", path, "--train", "--data", self.tmp]
            + ["--adapter-path", self.tmp / "adapters"],
        }
        for command, options in commands.items():
            with self.subTest(command):
                run = self.run_command(command, *options)
                self.assertOneLine(run, config)
                self.assertIn("Unterminated string", run.stderr)
        # Nothing is written for a model that does not load.
        self.assertEqual(sorted(p.name for p in self.tmp.iterdir()), ["model"])

    def test_a_missing_shard_is_named(self):
        path = make_folder(self.tmp / "model")
        shard = drop_shard(path)
        run = self.run_command("generate", "--model", path, "--max-tokens", "2")
        self.assertOneLine(run, shard)

    def test_mlx_lm_debug_shows_the_traceback(self):
        path = make_folder(self.tmp / "model")
        config = break_config(path)
        run = self.run_command("generate", "--model", path, env={"MLX_LM_DEBUG": "1"})
        self.assertEqual(run.returncode, 1, run.stderr)
        self.assertIn("Traceback", run.stderr)
        self.assertIn(config, run.stderr.splitlines()[-1])

    def test_a_prompt_cache_of_another_model(self):
        path = make_folder(self.tmp / "model")
        other = make_folder(self.tmp / "other")
        model, _ = load(str(other))
        cache_file = str(self.tmp / "cache.safetensors")
        metadata = {"model": str(other), "tokenizer_config": "{}"}
        save_prompt_cache(cache_file, make_prompt_cache(model), metadata)
        weights = str(other / "model.safetensors")
        for cache, named in ((cache_file, str(other)), (weights, weights)):
            with self.subTest(cache=cache):
                options = ["--model", path, "--prompt-cache-file", cache]
                run = self.run_command("generate", *options, "--max-tokens", "2")
                self.assertOneLine(run, named)


class TestServerWithBadModelFolders(TemporaryFolderTestCase):
    """`mlx_lm.server --model` stops at start on a folder it cannot load."""

    def test_the_server_exits_cleanly_while_the_cpus_are_busy(self):
        # A worker thread that ran MLX code used to free its MLX state at its
        # own exit, which could fall inside the interpreter's shutdown and
        # abort the process (std::terminate, exit status -6) after the
        # message; busy CPUs widen that window.
        faults = (truncate_weights, drop_chat_tokens, mistype_config)
        folders = []
        for fault in faults:
            path = make_folder(self.tmp / fault.__name__)
            folders.append((path, fault(path)))
        spin = "while True: pass"
        busy = [
            subprocess.Popen([sys.executable, "-c", spin])
            for _ in range(os.cpu_count() or 2)
        ]
        try:
            for start in range(8):
                servers = []
                for path, named in folders:
                    cmd = [sys.executable, "-m", "mlx_lm", "server"]
                    cmd += ["--model", str(path), "--port", str(free_port())]
                    process = subprocess.Popen(
                        cmd, cwd=path.parent, stderr=subprocess.PIPE, text=True
                    )
                    servers.append((process, named))
                for process, named in servers:
                    try:
                        _, stderr = process.communicate(timeout=300)
                    finally:
                        process.kill()
                    with self.subTest(start=start, named=named):
                        self.assertEqual(process.returncode, 1, stderr)
                        self.assertIn(named, stderr)
                        self.assertNotIn("terminate called", stderr)
        finally:
            for process in busy:
                process.kill()
                process.wait()

    def test_the_server_exits_naming_the_file_token_or_field(self):
        faults = (truncate_weights, drop_chat_tokens, mistype_config)
        for fault in faults + (break_config, drop_shard):
            with self.subTest(fault=fault.__name__):
                path = make_folder(self.tmp / fault.__name__)
                named = fault(path)
                code, stderr = self.serve(path)
                self.assertEqual(code, 1, stderr)
                self.assertIn(named, stderr)
                self.assertNotIn("Traceback", stderr)


class TestOptionsThatCannotApply(TemporaryFolderTestCase):
    """A command stops at start, in one line, on an option the model cannot
    take."""

    def test_kv_bits_on_a_model_whose_cache_cannot_be_quantized(self):
        path = make_folder(self.tmp / "model", MAMBA)
        code, stderr = self.serve(path, "--kv-bits", "4")
        self.assertEqual(code, 1, stderr)
        self.assertIn("kv_bits (--kv-bits) 4", stderr)
        self.assertNotIn("Traceback", stderr)
        for command, status in (("generate", 1), ("chat", 2)):
            with self.subTest(command):
                cmd = [sys.executable, "-m", "mlx_lm", command, "--model", path]
                run = subprocess.run(
                    cmd + ["--kv-bits", "4", "--max-tokens", "2"],
                    input="Hi\nq\n",
                    capture_output=True,
                    text=True,
                    timeout=300,
                )
                self.assertEqual(run.returncode, status, run.stderr)
                self.assertIn("--kv-bits", run.stderr.splitlines()[-1])
                self.assertNotIn("Traceback", run.stderr)

    def test_chat_template_args_the_template_rejects(self):
        path = make_folder(self.tmp / "model")
        args = '{"reasoning_effort": "bogus"}'
        code, stderr = self.serve(path, "--chat-template-args", args)
        self.assertEqual(code, 1, stderr)
        self.assertIn(f"--chat-template-args {args}", stderr)
        self.assertIn("Invalid reasoning_effort 'bogus'", stderr)
        self.assertNotIn("Traceback", stderr)
        # Arguments the template takes serve.
        thread = ServerThread(
            path, "--chat-template-args", '{"reasoning_effort": "max"}'
        )
        try:
            messages = [{"role": "user", "content": "w9 w10"}]
            status, answer = thread.chat({"messages": messages, "max_tokens": 3})
            self.assertEqual(status, 200, answer)
        finally:
            thread.close()


class TestServerWithABadModelFolder(TemporaryFolderTestCase):

    def test_requests_name_the_load_error(self):
        path = make_folder(self.tmp / "model")
        weights = truncate_weights(path)
        # The server in this process (server-requests' fixture).
        thread = ServerThread(path)
        try:
            thread.generator.join()
            self.assertEqual(thread.request("GET", "/health")[0], 503)
            messages = [{"role": "user", "content": "w9 w10"}]
            body = {"messages": messages, "max_tokens": 3}
            status, answer = thread.chat(body)
            self.assertEqual(status, 500)
            self.assertIn(weights, str(answer["error"]))
        finally:
            thread.close()


if __name__ == "__main__":
    unittest.main()
