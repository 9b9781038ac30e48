# Copyright © 2026 Apple Inc.

import copy
import tempfile
import unittest

import mlx.core as mx
from test_deepseek_v4_trim import make_tiny_model_folder

from mlx_lm.generate import generate_step, speculative_generate_step
from mlx_lm.models.cache import TRIM_HISTORY, make_prompt_cache, trim_prompt_cache
from mlx_lm.utils import load


class TestSpeculativeTrimmedCache(unittest.TestCase):

    def test_a_cache_trimmed_by_its_whole_history_drafts_again(self):
        # Trimmed by its whole history, a DeepSeek-V4 cache takes back
        # nothing more until it decodes again: a round writes its drafts
        # before it takes them back.
        with tempfile.TemporaryDirectory() as tmp:
            model, _ = load(make_tiny_model_folder(tmp))
            draft, _ = load(tmp)
        mx.random.seed(12)
        head = draft.lm_head
        head.weight = head.weight + 0.1 * mx.random.normal(head.weight.shape)
        prompt = mx.random.randint(2, 300, (37,))
        cache = make_prompt_cache(model) + make_prompt_cache(draft)
        steps = speculative_generate_step(
            prompt, model, draft, max_tokens=40, prompt_cache=cache
        )
        list(steps)
        self.assertEqual(trim_prompt_cache(cache, TRIM_HISTORY), TRIM_HISTORY)
        self.assertFalse(any(c.is_trimmable() for c in cache))
        rest = mx.array([7, 8, 9])
        plain = generate_step(
            rest, model, max_tokens=12, prompt_cache=copy.deepcopy(cache)
        )
        steps = speculative_generate_step(
            rest, model, draft, num_draft_tokens=3, max_tokens=12, prompt_cache=cache
        )
        steps = list(steps)
        self.assertTrue(any(from_draft for *_, from_draft in steps))
        self.assertEqual([t for t, *_ in steps], [t for t, _ in plain])


if __name__ == "__main__":
    unittest.main()
