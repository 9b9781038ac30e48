# Copyright © 2026 Apple Inc.

import tempfile
import unittest
from pathlib import Path

import mlx.core as mx
from server_fixture import make_model_provider, make_tiny_model_folder

from mlx_lm.generate import speculative_generate_step
from mlx_lm.utils import load

MESSAGE = "these caches of the qwen3_5 model cannot take back rejected drafts"


class TestDraftModelUntrimmable(unittest.TestCase):
    """A draft model for a model whose caches cannot be trimmed (Qwen3.5's
    linear attention) is refused naming the model: by the loop, and by
    mlx_lm.server at start rather than at each request."""

    @classmethod
    def setUpClass(cls):
        tmp = tempfile.TemporaryDirectory()
        cls.addClassCleanup(tmp.cleanup)
        cls.target = make_tiny_model_folder(Path(tmp.name) / "qwen3_5", "qwen3_5")
        cls.draft = make_tiny_model_folder(Path(tmp.name) / "llama", "llama")

    def test_the_loop_names_the_model(self):
        model, _ = load(str(self.target))
        draft, _ = load(str(self.draft))
        with self.assertRaisesRegex(ValueError, MESSAGE):
            list(speculative_generate_step(mx.array([1, 2, 3]), model, draft))

    def test_the_server_stops_at_start(self):
        provider = make_model_provider(self.target, "--draft-model", str(self.draft))
        with self.assertRaisesRegex(ValueError, MESSAGE):
            provider.load_default()
        # A target whose caches can be trimmed starts.
        provider = make_model_provider(self.draft, "--draft-model", str(self.draft))
        provider.load_default()
        self.assertIsNotNone(provider.draft_model)


if __name__ == "__main__":
    unittest.main()
