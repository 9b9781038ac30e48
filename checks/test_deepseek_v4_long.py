# Copyright © 2026 Apple Inc.

import collections
import importlib.util
import sys
import unittest
from unittest import mock

import mlx.core as mx
from dsv4_fixtures import (
    GRAPH_BOUND,
    SMALL_CONFIG,
    TINY_CONFIG,
    make_tiny_model,
    max_cache_graph,
    max_diff,
    random_weights,
)

from mlx_lm.generate import BatchGenerator, PromptProcessingBatch, generate_step
from mlx_lm.models import deepseek_v4, deepseek_v41
from mlx_lm.models.cache import (
    WindowCompressorCache,
    make_prompt_cache,
)


class TestDeepseekV4CacheGraph(unittest.TestCase):

    def test_cache_graph_stays_bounded_in_generate_step(self):
        # Decode as the library does, evaluating only the tokens.
        model = make_tiny_model(SMALL_CONFIG)
        cache = make_prompt_cache(model)
        prompt = mx.array([5, 6, 7])
        worst = []
        steps = generate_step(prompt, model, max_tokens=2000, prompt_cache=cache)
        for n, _ in enumerate(steps, 1):
            if n % 100 == 0:
                worst.append(max_cache_graph(cache))
        self.assertEqual(len(worst), 20)
        self.assertLessEqual(max(worst), GRAPH_BOUND)
        # The pools hold every entry of the 2,002 decoded tokens.
        # generate_step feeds each token back, the last one too.
        self.assertEqual(cache[0].offset, 2003)
        for c, ratio in ((cache[0].compressor, 4), (cache[1].compressor, 16)):
            self.assertEqual(c.ratio, ratio)
            self.assertGreaterEqual(c.pool.shape[1], 2002 // ratio)

    def test_cache_holds_no_more_than_it_stores_after_prefill(self):
        # A cache field that is a view of a prompt chunk keeps the whole chunk
        # alive; the prompt cache the server keeps would then hold far more
        # than its nbytes.
        model = make_tiny_model({**SMALL_CONFIG, "hidden_size": 64, "head_dim": 64})
        cache = make_prompt_cache(model)
        mx.eval(model.parameters())
        # Without the allocator's buffer cache, active memory counts exactly
        # the buffers in use.
        limit = mx.set_cache_limit(0)
        try:
            mx.synchronize()
            before = mx.get_active_memory()
            out = model(mx.arange(1, 1003)[None] % 250, cache=cache)
            mx.eval(out)
            del out
            held = mx.get_active_memory() - before
        finally:
            mx.set_cache_limit(limit)
        stored = sum(c.nbytes for c in cache)
        # The model's constants are evaluated in the first forward too.
        self.assertLessEqual(held, stored + 4 * 1024)

    def test_graph_check_catches_fields_left_out_of_the_hook(self):
        # Negative control: without the hook, the rows of an open window,
        # which the output does not read until the window closes, chain
        # lazily (103 tokens leave 7 rows in the HCA layer's open window).
        model = make_tiny_model(SMALL_CONFIG)
        cache = make_prompt_cache(model)
        prompt = mx.array([5, 6, 7])
        with mock.patch.object(WindowCompressorCache, "cache_arrays", lambda self: []):
            for _ in generate_step(prompt, model, max_tokens=100, prompt_cache=cache):
                pass
            worst = max_cache_graph(cache)
        self.assertEqual(cache[1].offset % 16, 7)
        self.assertGreater(worst, GRAPH_BOUND)


def traced_modules(*modules):
    """Fresh copies of modules whose compiled functions count their traces
    (a trace is what MLX's compile cache keeps per new input shape)."""
    traces = collections.Counter()
    real_compile = mx.compile

    def counting_compile(fun, **kwargs):
        def traced(*args, **kwargs):
            traces[fun.__name__] += 1
            return fun(*args, **kwargs)

        return real_compile(traced, **kwargs)

    fresh = []
    with mock.patch.object(mx, "compile", counting_compile), mock.patch.dict(
        sys.modules
    ):
        for module in modules:
            spec = importlib.util.spec_from_file_location(
                module.__name__, module.__file__
            )
            copy = importlib.util.module_from_spec(spec)
            # Later modules import this copy.
            sys.modules[module.__name__] = copy
            spec.loader.exec_module(copy)
            fresh.append(copy)
    return traces, fresh


class TestDeepseekV4CompileCache(unittest.TestCase):

    def test_prompts_of_new_lengths_compile_nothing_new(self):
        # A server meets a new prompt length with almost every request: a
        # helper compiled per shape would keep a trace for each (about
        # 0.44 MiB each on this tiny model), a leak that only grows.
        traces, (_, v4) = traced_modules(deepseek_v41, deepseek_v4)
        model = random_weights(v4.Model(v4.ModelArgs.from_dict(TINY_CONFIG)))

        def prompt_and_step(length):
            cache = model.make_cache()
            model(mx.arange(length)[None] % 250 + 2, cache)
            mx.eval(model(mx.array([[3]]), cache))

        # Every path once: window only, banded, pools past the top-k, a
        # decode step that closes windows (at 48).
        for length in (40, 47, 160, 290):
            prompt_and_step(length)
        seen = dict(traces)
        self.assertTrue(seen)
        for length in (41, 63, 161, 170, 291, 300):
            prompt_and_step(length)
        self.assertEqual(dict(traces), seen)


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
    and logprobs, the largest batch decoded and the largest cache graph (less
    the merge's one lazy edge on a step a request joins)."""
    generator = BatchGenerator(
        model, prefill_step_size=PREFILL_STEP, completion_batch_size=4
    )
    names, results = {}, {}
    widest = worst = before = 0
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
        # The step a request joins also carries the merge of its cache into
        # the batch's (left lazy, as upstream's merges are): one edge more,
        # gone once that step is evaluated.
        rows = len(generator._generation_batch)
        worst = max(worst, max_generator_graph(generator) - (rows > before))
        before = rows
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
