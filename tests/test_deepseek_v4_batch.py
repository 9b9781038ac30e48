# Copyright © 2026 Apple Inc.

import unittest
from unittest import mock

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, PromptProcessingBatch, generate_step
from test_deepseek_v4 import make_tiny_model, max_diff
from test_deepseek_v4_cache_graph import max_cache_graph

from mlx_lm.models import deepseek_v4
from mlx_lm.models.cache import WindowCompressorCache, make_prompt_cache

GRAPH_BOUND = 8

# Small prefill steps, so prompts of different lengths are prefilled in
# several right-padded chunks.
PREFILL_STEP = 16

# 120 decode steps wrap the window (32) and close 7 HCA (16) and 30 CSA (4)
# windows per request.
MAX_TOKENS = 120


def max_generator_graph(generator):
    """The largest graph behind any array that the generator's caches hold."""
    caches = generator._prompt_batch.prompt_cache
    return max_cache_graph(caches + generator._generation_batch.prompt_cache)


def decode_alone(model, prompt, max_tokens):
    """Tokens and logprobs of generate_step on prompt alone."""
    steps = generate_step(
        mx.array(prompt),
        model,
        max_tokens=max_tokens,
        prompt_cache=make_prompt_cache(model),
        prefill_step_size=PREFILL_STEP,
    )
    tokens, logprobs = zip(*((int(t), lp) for t, lp in steps))
    return list(tokens), mx.stack(logprobs)


def decode_batched(model, prompts, inserts):
    """Run a BatchGenerator that gets each request of inserts[n] (pairs of a
    prompt name and max_tokens) before its step n. Return each name's tokens
    and logprobs, the largest batch decoded and the largest cache graph."""
    generator = BatchGenerator(
        model, prefill_step_size=PREFILL_STEP, completion_batch_size=4
    )
    names, results = {}, {}
    widest = worst = 0
    step = 0
    while True:
        for name, max_tokens in inserts.get(step, []):
            (uid,) = generator.insert([prompts[name]], max_tokens=[max_tokens])
            names[uid] = name
            results[name] = ([], [])
        responses = generator.next_generated()
        if not responses and step > max(inserts):
            break
        for r in responses:
            results[names[r.uid]][0].append(r.token)
            results[names[r.uid]][1].append(r.logprobs)
        widest = max(widest, len(responses))
        worst = max(worst, max_generator_graph(generator))
        step += 1
    generator.close()
    results = {k: (t, mx.stack(lp)) for k, (t, lp) in results.items()}
    return results, widest, worst


class TestDeepseekV4Batch(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.model = make_tiny_model()
        mx.random.seed(4)
        lengths = {"a": 37, "b": 37, "c": 21}
        cls.prompts = {
            k: mx.random.randint(2, 300, (n,)).tolist() for k, n in lengths.items()
        }
        cls.expected = {
            k: decode_alone(cls.model, p, MAX_TOKENS) for k, p in cls.prompts.items()
        }
        # Long enough for the top-k and several query blocks.
        cls.long_prompts = [
            mx.random.randint(2, 300, (n,)).tolist() for n in (300, 170, 229)
        ]

    def assertMatchesAlone(self, results, max_tokens):
        for name, (tokens, logprobs) in results.items():
            with self.subTest(request=name):
                self.assertEqual(len(tokens), max_tokens[name])
                expected_tokens, expected_logprobs = self.expected[name]
                self.assertEqual(tokens, expected_tokens[: len(tokens)])
                self.assertLessEqual(
                    max_diff(logprobs, expected_logprobs[: len(tokens)]), 1e-4
                )

    def test_equal_lengths_match_single_requests(self):
        results, widest, worst = decode_batched(
            self.model, self.prompts, {0: [("a", MAX_TOKENS), ("b", MAX_TOKENS)]}
        )
        self.assertEqual(widest, 2)
        self.assertMatchesAlone(results, {"a": MAX_TOKENS, "b": MAX_TOKENS})
        self.assertLessEqual(worst, GRAPH_BOUND)

    def test_different_lengths_match_single_requests(self):
        results, widest, worst = decode_batched(
            self.model, self.prompts, {0: [("a", MAX_TOKENS), ("c", MAX_TOKENS)]}
        )
        self.assertEqual(widest, 2)
        self.assertMatchesAlone(results, {"a": MAX_TOKENS, "c": MAX_TOKENS})
        self.assertLessEqual(worst, GRAPH_BOUND)

    def test_request_joining_mid_decode_matches_single_requests(self):
        results, widest, worst = decode_batched(
            self.model, self.prompts, {0: [("a", MAX_TOKENS)], 30: [("c", 80)]}
        )
        self.assertEqual(widest, 2)
        self.assertMatchesAlone(results, {"a": MAX_TOKENS, "c": 80})
        self.assertLessEqual(worst, GRAPH_BOUND)

    def test_request_finishing_early_leaves_the_others_exact(self):
        # The middle row finishes first and is filtered out of the batch.
        inserts = {0: [("a", MAX_TOKENS), ("c", 40), ("b", MAX_TOKENS)]}
        results, widest, worst = decode_batched(self.model, self.prompts, inserts)
        self.assertEqual(widest, 3)
        self.assertMatchesAlone(results, {"a": MAX_TOKENS, "c": 40, "b": MAX_TOKENS})
        self.assertLessEqual(worst, GRAPH_BOUND)

    def test_graph_check_catches_fields_left_out_of_the_hook(self):
        # Negative control: without the hook, the open windows' rows chain.
        with mock.patch.object(WindowCompressorCache, "cache_arrays", lambda self: []):
            _, _, worst = decode_batched(
                self.model, self.prompts, {0: [("a", 40), ("c", 40)]}
            )
        self.assertGreater(worst, GRAPH_BOUND)

    def check_right_padding(self, prompts, step):
        model = self.model
        caches = [make_prompt_cache(model) for _ in prompts]
        batch = PromptProcessingBatch(
            model, list(range(len(prompts))), caches, prefill_step_size=step
        )
        batch.prompt(prompts)
        self.assertEqual(batch.prompt_cache[0].offsets, [len(p) for p in prompts])
        tokens = mx.array([[7], [8], [9]])[: len(prompts)]
        out = model(tokens, batch.prompt_cache)
        for i, prompt in enumerate(prompts):
            cache = make_prompt_cache(model)
            for j in range(0, len(prompt), step):
                model(mx.array([prompt[j : j + step]]), cache)
            expected = model(tokens[i : i + 1], cache)
            self.assertLessEqual(max_diff(out[i : i + 1], expected), 1e-4)

    def test_right_padding_over_several_forwards(self):
        # One prompt call in several forwards: a row's padding may fill them.
        prompts = [self.prompts[k][:n] for k, n in (("a", 37), ("c", 9), ("b", 25))]
        self.check_right_padding(prompts, 8)

    def test_long_right_padded_prompts_match_single_rows(self):
        # Forwards longer than a query block attend in blocks.
        self.assertGreater(len(self.long_prompts[0]), 2 * deepseek_v4._QUERY_BLOCK)
        self.check_right_padding(self.long_prompts, 256)

    def check_left_padding(self, prompts):
        model = self.model
        width = max(len(p) for p in prompts)
        padding = [width - len(p) for p in prompts]
        padded = mx.array([[0] * n + p for n, p in zip(padding, prompts)])
        rows = [make_prompt_cache(model) for _ in prompts]
        batch = [c[0].merge(list(c)) for c in zip(*rows)]
        for c in batch:
            c.prepare(left_padding=padding)
        out = [model(padded, batch)[:, -1:]]
        for c in batch:
            c.finalize()
        tokens = mx.array([[7], [8], [9]])[: len(prompts)]
        out.append(model(tokens, batch))
        for i, prompt in enumerate(prompts):
            cache = make_prompt_cache(model)
            expected = [model(mx.array([prompt]), cache)[:, -1:]]
            expected.append(model(tokens[i : i + 1], cache))
            for got, want in zip(out, expected):
                self.assertLessEqual(max_diff(got[i : i + 1], want), 1e-4)

    def test_left_padded_prompts_match_single_rows(self):
        self.check_left_padding([self.prompts["a"], self.prompts["c"]])

    def test_long_left_padded_prompts_match_single_rows(self):
        self.check_left_padding(self.long_prompts)


if __name__ == "__main__":
    unittest.main()
