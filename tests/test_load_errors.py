# Copyright © 2026 Apple Inc.

import json
import os
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request
from pathlib import Path

from test_deepseek_v4 import make_tiny_model_folder, make_tiny_tokenizer
from test_server_requests import ServerThread, user

from mlx_lm import load
from mlx_lm.chat_templates.deepseek_v4 import bos_token, eos_token

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from long_decode import make_model_folder  # noqa: E402
from server_soak import free_port  # noqa: E402


# Faults of a model folder; each returns what the error must name.
def truncate_weights(path):
    weights = path / "model.safetensors"
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size // 2)
    return str(weights)


def drop_chat_tokens(path):
    make_tiny_tokenizer(path, 300, special_tokens=[bos_token, eos_token])
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
        path = make_tiny_model_folder(self.tmp / "model")
        truncate_weights(path)
        with self.assertRaisesRegex(ValueError, "model.safetensors"):
            load(str(path))

    def test_tokenizer_without_the_chat_tokens_names_them(self):
        path = make_tiny_model_folder(self.tmp / "model")
        drop_chat_tokens(path)
        with self.assertRaisesRegex(ValueError, "<｜User｜>.*deepseek_v4"):
            load(str(path))

    def test_a_missing_folder_is_named(self):
        # Paths that cannot be Hugging Face repo ids are not looked up there.
        for path in (self.tmp / "missing", "./missing", "../missing/model"):
            with self.subTest(path=path):
                with self.assertRaisesRegex(FileNotFoundError, f"{path} "):
                    load(str(path))

    def test_mistyped_config_values_name_the_field(self):
        for model_type, key in (
            ("deepseek_v4", "num_attention_heads"),
            ("qwen3_5", "hidden_size"),
        ):
            with self.subTest(model_type=model_type):
                path = make_model_folder(self.tmp / model_type, model_type)
                named = mistype_config(path, key)
                with self.assertRaisesRegex(ValueError, named):
                    load(str(path))


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
            path = make_tiny_model_folder(self.tmp / fault.__name__)
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
        for fault in (truncate_weights, drop_chat_tokens, mistype_config):
            with self.subTest(fault=fault.__name__):
                path = make_tiny_model_folder(self.tmp / fault.__name__)
                named = fault(path)
                code, stderr = self.serve(path)
                self.assertEqual(code, 1, stderr)
                self.assertIn(named, stderr)
                self.assertNotIn("Traceback", stderr)


class TestOptionsThatCannotApply(TemporaryFolderTestCase):
    """A command stops at start, in one line, on an option the model cannot
    take."""

    def test_kv_bits_on_a_model_whose_cache_cannot_be_quantized(self):
        path = make_tiny_model_folder(self.tmp / "model")
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


class TestServerWithABadModelFolder(unittest.TestCase):

    def test_requests_name_the_load_error(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = make_tiny_model_folder(Path(tmp) / "model")
            weights = path / "model.safetensors"
            with open(weights, "r+b") as f:
                f.truncate(weights.stat().st_size // 2)
            server = ServerThread(path)
            try:
                server.generator.join()
                status, answer = server.request("GET", "/health")
                self.assertEqual(status, 503)
                status, answer = server.chat({"messages": user(), "max_tokens": 3})
                self.assertEqual(status, 500)
                self.assertIn(str(weights), str(answer["error"]))
            finally:
                server.close()


if __name__ == "__main__":
    unittest.main()
