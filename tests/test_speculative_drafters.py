# Copyright © 2026 Apple Inc.

import unittest

import mlx.core as mx
from host_syncs import HostSyncs

from mlx_lm.generate import generate_step, speculative_generate_step
from mlx_lm.models import llama
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.models.drafters import Drafter, DraftModelDrafter


def tiny_llama(seed, layers=2):
    mx.random.seed(seed)
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=64,
        num_hidden_layers=layers,
        intermediate_size=128,
        num_attention_heads=4,
        rms_norm_eps=1e-5,
        vocab_size=50,
        num_key_value_heads=2,
    )
    model = llama.Model(args)
    mx.eval(model.parameters())
    return model


class LookupDrafter(Drafter):
    """Drafts the known continuation of ``tokens``, wrongly at every third
    position; keeps no cache of its own, and logs what the loop tells it."""

    def __init__(self, tokens):
        self.tokens, self.seen, self.log = tokens, 0, []

    def make_cache(self):
        return []

    def prefill(self, cache, tokens, hidden, lengths):
        self.seen += lengths[0]
        self.log.append(("prefill", tokens.shape))

    def draft(self, cache, inputs, num_draft, sample):
        pos = self.seen + 1
        drafts = self.tokens[pos : pos + num_draft]
        drafts = [t if (pos + i) % 3 else (t + 1) % 50 for i, t in enumerate(drafts)]
        self.num_draft = len(drafts)
        return mx.array([drafts], mx.uint32), None

    def accept(self, cache, accepted, hidden, tokens):
        # Before the host has the round: every position, then the trim.
        self.seen += self.num_draft + 1
        self.log.append(("accept", tokens.shape))

    def trim(self, cache, counts):
        self.seen -= counts[0]
        self.log.append(("trim", self.num_draft - counts[0], self.num_draft))

    def finish(self, cache):
        self.log.append(("finish",))


class TestDrafters(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.model, cls.draft = tiny_llama(0), tiny_llama(1, layers=1)
        cls.prompt = mx.array([3, 7, 11, 2, 9, 30, 4, 4, 12])
        steps = generate_step(cls.prompt, cls.model, max_tokens=30)
        cls.expected = [t for t, _ in steps]

    def test_any_drafter_gives_the_greedy_tokens(self):
        tokens = [*self.prompt.tolist(), *self.expected]
        drafter = LookupDrafter(tokens)
        cache = make_prompt_cache(self.model)
        steps = speculative_generate_step(
            self.prompt,
            self.model,
            drafter=drafter,
            num_draft_tokens=3,
            max_tokens=30,
            prompt_cache=cache,
            prefill_step_size=4,
        )
        steps = list(steps)
        self.assertEqual([t for t, *_ in steps], self.expected)
        drafted = sum(d for *_, d in steps)
        self.assertGreater(drafted, 10)
        self.assertLess(drafted, 25)
        # The prompt in chunks, a round's accepted counts, the end.
        self.assertEqual(drafter.log[:2], [("prefill", (1, 4)), ("prefill", (1, 4))])
        accepts = [e for e in drafter.log if e[0] == "accept"]
        rounds = [e for e in drafter.log if e[0] == "trim"]
        self.assertEqual(len(accepts), len(rounds))
        self.assertEqual([a[1] for a in accepts], [(1, n + 1) for *_, n in rounds])
        self.assertTrue(any(a < n for _, a, n in rounds))
        self.assertTrue(any(a == n for _, a, n in rounds))
        self.assertEqual(drafter.log[-1], ("finish",))
        # Every token given is in the cache, as after plain decoding.
        self.assertEqual(cache[0].offset, self.prompt.size + 30)

    def test_the_draft_model_is_a_drafter(self):
        def run(**kwargs):
            steps = speculative_generate_step(
                self.prompt, self.model, num_draft_tokens=3, max_tokens=30, **kwargs
            )
            return [(t, d) for t, _, d in steps]

        expected = run(draft_model=self.draft)
        self.assertEqual([t for t, _ in expected], self.expected)
        self.assertGreater(sum(d for _, d in expected), 0)
        drafter = DraftModelDrafter(self.draft)
        cache = make_prompt_cache(self.model) + drafter.make_cache()
        self.assertEqual(run(drafter=drafter, prompt_cache=cache), expected)
        self.assertEqual(cache[-1].offset, self.prompt.size + 30)
        # The target drafting for itself: every draft stays.
        flags = [d for _, d in run(draft_model=self.model)]
        self.assertEqual(flags, ([True] * 3 + [False]) * 7 + [True] * 2)
        with self.assertRaisesRegex(ValueError, "needs a draft model"):
            run()
        # A prompt cache of the target alone names what it lacks.
        with self.assertRaisesRegex(ValueError, r"make_prompt_cache\(draft_model\)"):
            run(draft_model=self.draft, prompt_cache=make_prompt_cache(self.model))

    def test_a_round_syncs_the_host_once(self):
        # The round's tokens and accepted count come back in one fetch; the
        # next input and the drafter's work start before it.
        tokens = [*self.prompt.tolist(), *self.expected]
        for drafter in (LookupDrafter(tokens), DraftModelDrafter(self.draft)):
            with self.subTest(drafter=type(drafter).__name__):
                with HostSyncs() as syncs:
                    steps = speculative_generate_step(
                        self.prompt,
                        self.model,
                        drafter=drafter,
                        num_draft_tokens=3,
                        max_tokens=30,
                    )
                    counts = syncs.rounds(steps)
                self.assertGreater(len(counts), 5)
                self.assertEqual(counts, [1] * len(counts))


if __name__ == "__main__":
    unittest.main()
