# Copyright © 2026 Apple Inc.

import collections
import importlib.util
import io
import sys
import unittest
from unittest import mock

import mlx.core as mx
from mlx_lm.generate import generate_step
from test_deepseek_v4 import TINY_CONFIG, make_tiny_model, random_weights

from mlx_lm.models import deepseek_v4, deepseek_v41
from mlx_lm.models.cache import WindowCompressorCache, make_prompt_cache

GRAPH_BOUND = 8

# A CSA and an HCA layer.
SMALL_CONFIG = {
    **TINY_CONFIG,
    "num_hidden_layers": 2,
    "layer_types": TINY_CONFIG["layer_types"][1:3],
    "mlp_layer_types": ["hash_moe", "moe"],
}


def graph_edges(a):
    """Edges of the unevaluated graph behind a (0 once it is evaluated)."""
    f = io.StringIO()
    mx.export_to_dot(f, a)
    return f.getvalue().count("->")


def max_cache_graph(cache):
    """The largest graph behind any array that any layer's cache holds."""
    return max(
        (
            graph_edges(v)
            for layer_cache in cache
            for c in layer_cache.caches
            for v in vars(c).values()
            if isinstance(v, mx.array)
        ),
        default=0,
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
        self.assertEqual(
            cache[0].compressor.size() // cache[0].compressor.ratio, 2002 // 4
        )
        self.assertEqual(
            cache[1].compressor.size() // cache[1].compressor.ratio, 2002 // 16
        )

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
        def traced(*args):
            traces[fun.__name__] += 1
            return fun(*args)

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


if __name__ == "__main__":
    unittest.main()
