# Copyright © 2026 Apple Inc.
"""speculative-trim's deeper checks, beside tests/test_deepseek_v4_trim.py:
the caches' graphs stay bounded over 200 speculatively decoded tokens, and
mlx_lm.cache_prompt then mlx_lm.generate (subprocesses) continue the prompt
through its file."""

import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import mlx.core as mx
from mtp_fixtures import GRAPH_BOUND, make_tiny_model_folder, max_cache_graph

from mlx_lm.generate import speculative_generate_step, stream_generate
from mlx_lm.models.cache import load_prompt_cache, make_prompt_cache
from mlx_lm.utils import load


class TestDeepseekV4SpeculativeDeep(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        cls.model, cls.tokenizer = load(make_tiny_model_folder(cls.dir.name))
        # The model with noise in its head drafts, so some drafts are rejected.
        cls.draft, _ = load(cls.dir.name)
        mx.random.seed(12)
        head = cls.draft.lm_head
        head.weight = head.weight + 0.1 * mx.random.normal(head.weight.shape)
        cls.prompt = mx.random.randint(2, 300, (37,)).tolist()

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def test_cache_graph_stays_bounded_in_speculative_decoding(self):
        cache = make_prompt_cache(self.model) + make_prompt_cache(self.draft)
        steps = speculative_generate_step(
            mx.array(self.prompt),
            self.model,
            self.draft,
            num_draft_tokens=5,
            max_tokens=200,
            prompt_cache=cache,
        )
        worst = []
        for n, _ in enumerate(steps, 1):
            if n % 10 == 0:
                worst.append(max_cache_graph(cache))
        self.assertEqual(len(worst), 20)
        self.assertLessEqual(max(worst), GRAPH_BOUND)

    def test_cache_prompt_then_generate_continues_the_prompt(self):
        # mlx_lm.cache_prompt leaves the user's turn open; generate then
        # adds the rest of that turn and the assistant's prompt.
        path, out = Path(self.dir.name), Path(self.dir.name) / "prompt.safetensors"
        start, rest = "The quick brown fox", " jumps over the lazy dog"
        cmd = [sys.executable, "-m", "mlx_lm", "cache_prompt", "--model", path]
        run = subprocess.run(
            cmd + ["--prompt", start, "--prompt-cache-file", out],
            capture_output=True,
            text=True,
            timeout=300,
        )
        self.assertEqual(run.returncode, 0, run.stderr)
        cached = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": start}], continue_final_message=True
        )
        cache = load_prompt_cache(str(out))
        self.assertEqual(cache[0].size(), len(cached))

        cmd = [sys.executable, "-m", "mlx_lm", "generate", "--prompt-cache-file"]
        run = subprocess.run(
            cmd + [out, "--prompt", rest, "--max-tokens", "12", "--verbose", "T"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        self.assertEqual(run.returncode, 0, run.stderr)
        # The cache holds the start of the whole conversation's tokens.
        full = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": start + rest}], add_generation_prompt=True
        )
        self.assertEqual(full[: len(cached)], cached)
        steps = stream_generate(self.model, self.tokenizer, full, max_tokens=12)
        expected = "".join(r.text for r in steps)
        self.assertIn(f"==========\n{expected}\n==========", run.stdout)


if __name__ == "__main__":
    unittest.main()
