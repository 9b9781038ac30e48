# Copyright © 2026 Apple Inc.

"""The graphs behind DeepSeek-V4-Flash-0731's DSpark drafter's cache stay
bounded over 1,000 drafted tokens, one row (``speculative_generate_step``)
and a batch of rows at their own positions (``BatchGenerator(mtp=True)``);
the context keeps its window and trim history only."""

import io
import sys
import unittest
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_deepseek_v4_dspark import PROMPT, Recording, make_model, plain  # noqa: E402

from mlx_lm.generate import (  # noqa: E402
    BatchGenerator,
    make_drafter,
    speculative_generate_step,
)
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402

BOUND = 8
TOKENS = 1000


def edges(a):
    f = io.StringIO()
    mx.export_to_dot(f, a)
    return f.getvalue().count("->")


def widest(cache):
    """The largest graph behind any array of any cache entry."""
    arrays = []
    for c in cache:
        for v in vars(c).values():
            arrays += [v] if isinstance(v, mx.array) else []
        for inner in getattr(c, "caches", ()):
            arrays += [v for v in vars(inner).values() if isinstance(v, mx.array)]
    return max(map(edges, arrays), default=0)


class TestDSparkCacheGraph(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.model = make_model()

    def test_one_row(self):
        model = self.model
        expected = plain(model, PROMPT, TOKENS)
        drafter = Recording(model, [PROMPT.tolist() + expected])
        cache = make_prompt_cache(model) + make_drafter(model).make_cache()
        steps = speculative_generate_step(
            PROMPT,
            model,
            drafter=drafter,
            num_draft_tokens=5,
            max_tokens=TOKENS,
            prompt_cache=cache,
        )
        worst, tokens = [], []
        for i, (t, _, _) in enumerate(steps):
            tokens.append(t)
            if i % 100 == 99:
                worst.append(widest(cache))
        self.assertEqual(tokens, expected)
        self.assertGreater(sum(map(sum, drafter.accepted)), TOKENS // 3)
        self.assertEqual(len(worst), TOKENS // 100)
        self.assertLessEqual(max(worst), BOUND, worst)
        context = cache[-1]
        self.assertEqual(context.size(), cache[0].size())
        self.assertEqual(context.kv.shape[2], context.window + context.history + 1)

    def test_a_batch(self):
        model = self.model
        prompts = [PROMPT.tolist(), PROMPT.tolist()[:5]]
        generator = BatchGenerator(
            model, mtp=True, num_draft_tokens=3, stop_tokens=set()
        )
        generator.insert(prompts, max_tokens=[TOKENS, TOKENS // 2])
        worst, n = [], 0
        while responses := generator.next_generated():
            n += len(responses)
            batch = generator._generation_batch
            if batch.uids and n // 100 > len(worst):
                worst.append(widest(batch.prompt_cache))
        generator.close()
        self.assertEqual(n, TOKENS + TOKENS // 2)
        self.assertGreaterEqual(len(worst), 10)
        self.assertLessEqual(max(worst), BOUND, worst)


if __name__ == "__main__":
    unittest.main()
