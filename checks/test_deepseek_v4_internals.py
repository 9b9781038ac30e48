# Copyright © 2026 Apple Inc.
"""DeepSeek-V4's implementation details, moved out of tests/test_deepseek_v4.py
(which keeps what a user sees): cache storage and graphs, a compressor against
a plain reference, the quantized output-group path, gradients past the top-k
choices, full fine-tuning, and every quantized layer of each checkpoint
layout."""

import copy
import json
import tempfile
import unittest
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from dsv4_fixtures import (
    CONFIG,
    FP8_CONFIG,
    GRAPH_BOUND,
    SMALL_CONFIG,
    TINY_CONFIG,
    TOKENS,
    _community_predicate,
    _dequantized,
    _float32,
    _quantized_layers,
    _random_weights,
    _release_tensors,
    _write,
    assert_load_names_every_key,
    make_tiny_model,
    max_cache_graph,
    max_diff,
    prefilled,
)
from mlx.utils import tree_flatten

from mlx_lm.generate import generate_step
from mlx_lm.models import deepseek_v4
from mlx_lm.models.cache import (
    TRIM_HISTORY,
    BatchWindowCompressorCache,
    CompressorCache,
    SharedWindowCache,
    WindowCompressorCache,
    load_prompt_cache,
    make_prompt_cache,
    save_prompt_cache,
    trim_prompt_cache,
)
from mlx_lm.models.switch_layers import SwitchLinear
from mlx_lm.utils import load_model, quantize_model, save_config

try:
    import torch
except ImportError:
    torch = None


class TestDeepseekV4Internals(unittest.TestCase):

    def test_one_expert_a_token_takes_the_whole_routed_weight(self):
        # The top-k weights are normalized for any k, as DeepSeek's and
        # transformers' routers normalize them (V4.1's skips k = 1).
        args = deepseek_v4.ModelArgs.from_dict(
            {**TINY_CONFIG, "num_experts_per_tok": 1}
        )
        router = deepseek_v4.Router(args)
        mx.random.seed(3)
        router.weight = mx.random.normal(router.weight.shape)
        _, weights = router(mx.random.normal((1, 5, args.hidden_size)))
        scale = mx.full(weights.shape, args.routed_scaling_factor)
        self.assertTrue(mx.allclose(weights, scale))

    def test_nested_rope_parameters_are_read(self):
        config = dict(TINY_CONFIG)
        config["rope_parameters"] = {
            "main": {"rope_type": "default", "rope_theta": 5000.0},
            "compress": {**TINY_CONFIG["rope_parameters"], "rope_theta": 7000.0},
        }
        args = deepseek_v4.ModelArgs.from_dict(config)
        self.assertEqual(args.rope_theta, 5000.0)
        self.assertEqual(args.compress_rope_theta, 7000.0)
        self.assertEqual(args.rope_scaling["factor"], 4.0)

    def test_batch_rows_of_one_length_match_single_rows(self):
        model = make_tiny_model()
        mx.random.seed(1)
        inputs = mx.random.randint(0, 300, (2, 70))
        both = model(inputs)
        for i in range(2):
            row = inputs[i : i + 1]
            self.assertLessEqual(max_diff(both[i : i + 1], model(row)), 1e-5)

    def test_quantized_output_groups_match_their_dequantized_weights(self):
        # A quantized wo_a goes through gather_qmm, a plain one a matmul.
        # A prompt, then a decode step.
        model = make_tiny_model()
        inputs = mx.random.randint(0, 300, (2, 201))

        def run():
            cache = model.make_cache()
            return model(inputs[:, :-1], cache), model(inputs[:, -1:], cache)

        nn.quantize(model, 32, 8, class_predicate=lambda p, m: p.endswith("wo_a"))
        quantized = run()
        for layer in model.layers:
            wo_a = layer.attn.wo_a
            plain = SwitchLinear(1, 1, 1, bias=False)
            plain.weight = mx.dequantize(
                wo_a.weight, wo_a.scales, wo_a.biases, group_size=32, bits=8
            )
            layer.attn.wo_a = plain
        for got, want in zip(run(), quantized):
            self.assertLessEqual(max_diff(got, want), 1e-5)

    def test_pools_grow_in_place(self):
        model = make_tiny_model()
        cache = model.make_cache()
        model(mx.zeros((1, 64), dtype=mx.int32), cache)
        self.assertEqual([c.size() for c in cache], [64] * 4)
        # Storage is allocated in steps and written by slice assignment.
        csa = cache[1].compressor
        self.assertEqual(csa.pool.shape[1], CompressorCache.step)
        pool = csa.pool
        mx.eval(model(mx.zeros((1, 4), dtype=mx.int32), cache))
        self.assertEqual(csa.pool.shape, pool.shape)

    def test_caches_are_the_batchable_window_compressor_caches(self):
        model = make_tiny_model()
        cache = make_prompt_cache(model)
        # The server batches only caches that have merge.
        self.assertTrue(all(hasattr(c, "merge") for c in cache))
        self.assertIsInstance(cache[0], WindowCompressorCache)
        self.assertIsInstance(cache[0].window, SharedWindowCache)

    def test_saved_caches_keep_their_parts_and_counts(self):
        model = make_tiny_model()
        mx.random.seed(3)
        cache = model.make_cache()
        mx.eval(model(mx.random.randint(0, 300, (1, 130)), cache))
        self.assertEqual(trim_prompt_cache(cache, 20), 20)
        with tempfile.TemporaryDirectory() as tmp:
            file = str(Path(tmp) / "cache.safetensors")
            save_prompt_cache(file, cache)
            loaded = load_prompt_cache(file)
        self.assertEqual(
            [type(c).__name__ for c in loaded[2].caches],
            ["SharedWindowCache", "CompressorCache"],
        )
        self.assertEqual(
            [type(c).__name__ for c in loaded[1].caches],
            ["SharedWindowCache", "CompressorCache", "CompressorCache"],
        )
        for a, b in zip(cache, loaded):
            self.assertEqual((a.offset, a.behind), (b.offset, b.behind))

    def test_history_is_counted_in_nbytes(self):
        # From tests/test_prompt_cache.py: the buffers' rows.
        cache = prefilled(make_tiny_model(), mx.arange(40)[None])
        window = cache[0].window
        self.assertEqual(window.kv.shape[1], 32 + TRIM_HISTORY + 1)
        self.assertEqual(cache[0].nbytes, window.kv.nbytes)
        self.assertEqual(cache[1].compressor.kv.shape[1], 8 + TRIM_HISTORY + 1)

    def test_extracted_rows_hold_what_nbytes_reports(self):
        # From tests/test_prompt_cache.py: a view into a pool or window of the
        # batch would keep its whole buffer alive after the batch is gone.
        model = make_tiny_model()
        mx.random.seed(4)
        singles = [model.make_cache() for _ in range(2)]
        for cache, n in zip(singles, (40, 27)):
            mx.eval(model(mx.random.randint(0, 300, (1, n)), cache))
        batch = [BatchWindowCompressorCache.merge(c) for c in zip(*singles)]
        del singles
        for _ in range(3):
            mx.eval(model(mx.random.randint(0, 300, (2, 1)), batch))
        limit = mx.set_cache_limit(0)
        try:
            rows = [[c.extract(i) for c in batch] for i in range(2)]
            mx.eval([c.state for row in rows for c in row])
            stored = sum(c.nbytes for row in rows for c in row)
            del batch
            mx.synchronize()
            held = mx.get_active_memory()
            del rows
            mx.synchronize()
            freed = held - mx.get_active_memory()
        finally:
            mx.set_cache_limit(limit)
        self.assertEqual(freed, stored)

    def test_gradients_flow_past_the_top_k_choices(self):
        # LoRA training differentiates the whole forward; the indices the
        # gate and the indexer pick have no gradient.
        model = make_tiny_model()
        # More CSA entries than index_topk, so the indexer picks.
        inputs = mx.arange(80)[None] % 300

        def loss(model):
            return model(inputs).astype(mx.float32).mean()

        value, grads = nn.value_and_grad(model, loss)(model)
        mx.eval(value, grads)
        grad = dict(tree_flatten(grads))["model.layers.1.attn.wq_b.weight"]
        self.assertGreater(mx.abs(grad).max().item(), 0.0)

    def test_cache_graph_stays_bounded_over_decode_steps(self):
        # Decode as the library does, evaluating only the tokens: every cache
        # array is materialized with them, the pools grown in place.
        model = make_tiny_model(SMALL_CONFIG)
        cache = make_prompt_cache(model)
        steps = generate_step(mx.array([5, 6, 7]), model, prompt_cache=cache)
        for _ in zip(range(48), steps):
            self.assertLessEqual(max_cache_graph(cache), GRAPH_BOUND)
        self.assertEqual(cache[0].offset, 3 + 48)

    def test_compressors_pool_as_a_plain_reference(self):
        # Entry w: per feature, a softmax of the gates (plus ape) over window
        # w's rows and, overlapped, the first half of window w - 1's; then
        # rms-normed and rotated to position w * ratio. Fed in three calls.
        model = make_tiny_model()
        x = mx.random.normal((1, 40, 32))
        for c in (model.layers[1].attn.compressor, model.layers[2].attn.compressor):
            cache = CompressorCache(c.ratio, c.overlap)
            for start, end in ((0, 7), (7, 8), (8, 40)):
                rows = deepseek_v4.WindowRows([start], [0], [end - start], end - start)
                pool = c(x[:, start:end], cache, rows)
            r, d, n = c.ratio, c.norm.weight.shape[0], 40 // c.ratio
            kv, gate = np.array(c.wkv(x)[0]), np.array(c.wgate(x)[0])
            gate = gate + np.resize(np.array(c.ape), gate.shape)
            ref = []
            for w in range(n):
                k, g = kv[w * r : w * r + r, -d:], gate[w * r : w * r + r, -d:]
                if c.overlap and w > 0:
                    k = np.concatenate([kv[w * r - r : w * r, :d], k])
                    g = np.concatenate([gate[w * r - r : w * r, :d], g])
                p = np.exp(g - g.max(0))
                e = (p / p.sum(0) * k).sum(0)
                ref.append(e / np.sqrt((e**2).mean() + c.norm.eps))
            ref = mx.array(np.stack(ref))[None] * c.norm.weight
            ref = deepseek_v4._rope(ref, c._freqs, mx.array([0]), float(r))
            self.assertLessEqual(max_diff(pool[:, :n], ref), 1e-5)


class TestDeepseekV4Layouts(unittest.TestCase):
    """Every quantized layer of each checkpoint layout, and the layouts
    tests/test_deepseek_v4.py does not load."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.addClassCleanup(cls.tmp.cleanup)
        cls.path = Path(cls.tmp.name)
        cls.weights = _random_weights(CONFIG)

    def _write_release(self, name, expert_dtype="fp4", tag_experts=True):
        tensors = _release_tensors(self.weights, expert_dtype)
        config = dict(CONFIG, quantization_config=dict(FP8_CONFIG))
        if tag_experts:
            config["quantization_config"]["expert_dtype"] = expert_dtype
        _write(self.path / name, tensors, config)
        _write(self.path / f"{name}-dequantized", _dequantized(tensors), CONFIG)
        return self.path / name, self.path / f"{name}-dequantized"

    def _check_against_dequantized(self, path, reference, expert_mode):
        model, _ = load_model(path)
        expected, _ = load_model(reference)
        # Every other layer (embeddings, head, compressors) stays as shipped.
        modes = {}
        layers = [f"model.layers.{i}" for i in range(CONFIG["num_hidden_layers"])]
        for layer, prefix in enumerate(layers):
            names = [f"attn.{n}" for n in ("wq_a", "wq_b", "wkv", "wo_a", "wo_b")]
            names += ["attn.indexer.wq_b"] * (CONFIG["compress_ratios"][layer] == 4)
            for proj in ("gate_proj", "up_proj", "down_proj"):
                names.append(f"ffn.shared_experts.{proj}")
                modes[f"{prefix}.ffn.switch_mlp.{proj}"] = expert_mode
            modes.update({f"{prefix}.{name}": "mxfp8" for name in names})
        self.assertEqual(_quantized_layers(model), modes)
        out = _float32(model)(TOKENS)
        ref = _float32(expected)(TOKENS)
        self.assertFalse(mx.any(mx.isnan(out)).item())
        self.assertTrue(mx.allclose(out, ref, rtol=1e-4, atol=1e-4))

    @unittest.skipIf(torch is None, "needs torch, safetensors and transformers")
    def test_release_quantizes_exactly_the_fp8_and_fp4_layers(self):
        for name, tag in (("release", True), ("release-untagged", False)):
            with self.subTest(name):
                path, reference = self._write_release(name, tag_experts=tag)
                self._check_against_dequantized(path, reference, "mxfp4")

    @unittest.skipIf(torch is None, "needs torch, safetensors and transformers")
    def test_fp8_experts_load_packed(self):
        path, reference = self._write_release(
            "release-fp8", expert_dtype="fp8", tag_experts=False
        )
        self._check_against_dequantized(path, reference, "mxfp8")

    def test_weights_sanitize_packed_as_mxfp8_stay_quantized(self):
        # A release's fp8 weights leave sanitize as mxfp8 (uint8 scales).
        model = make_tiny_model()
        nn.quantize(
            model, 32, 8, mode="mxfp8", class_predicate=lambda p, _: "wq_a" in p
        )
        path = self.path / "packed"
        path.mkdir()
        weights = dict(tree_flatten(model.parameters()))
        mx.save_safetensors(str(path / "model.safetensors"), weights)
        config = dict(TINY_CONFIG, quantization_config=FP8_CONFIG)
        (path / "config.json").write_text(json.dumps(config))
        loaded, _ = load_model(path)
        modes = _quantized_layers(loaded)
        self.assertEqual(
            modes, {f"model.layers.{i}.attn.wq_a": "mxfp8" for i in range(4)}
        )
        inputs = mx.array([[2, 7, 40, 9]])
        self.assertTrue(mx.array_equal(loaded(inputs), model(inputs)))

    @unittest.skipIf(torch is None, "needs torch, safetensors and transformers")
    def test_bad_release_weights_load_nothing_into_a_model(self):
        bad = _release_tensors(self.weights)
        del bad["layers.1.ffn.experts.3.w2.weight"], bad["layers.2.attn.wkv.scale"]
        config = dict(CONFIG, quantization_config=FP8_CONFIG)
        _write(self.path / "bad", bad, config)
        model = deepseek_v4.Model(deepseek_v4.ModelArgs.from_dict(config))
        before = dict(tree_flatten(model.parameters()))
        weights = {}
        for shard in (self.path / "bad").glob("*.safetensors"):
            weights.update(mx.load(str(shard)))
        with self.assertRaises(ValueError):
            model.load_weights(list(model.sanitize(weights).items()))
        after = dict(tree_flatten(model.parameters()))
        self.assertTrue(all(after[k] is v for k, v in before.items()))


class TestDeepseekV4EarlyUploads(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.addClassCleanup(cls.tmp.cleanup)
        cls.path = Path(cls.tmp.name)
        model = deepseek_v4.Model(deepseek_v4.ModelArgs.from_dict(CONFIG))
        model.load_weights(list(_random_weights(CONFIG).items()))
        cls.model, cls.config = quantize_model(
            model, dict(CONFIG), 64, 8, quant_predicate=_community_predicate
        )
        cls.expected = cls.model(TOKENS)
        cls.weights = dict(tree_flatten(cls.model.parameters()))

    def _save(self, name, weights, config):
        path = self.path / name
        path.mkdir()
        mx.save_safetensors(str(path / "model.safetensors"), weights)
        save_config(copy.deepcopy(config), path / "config.json")
        return path

    def test_community_output_groups_are_mxfp8(self):
        path = self._save("community", self.weights, self.config)
        model, _ = load_model(path)
        self.assertEqual(_quantized_layers(model)["model.layers.0.attn.wo_a"], "mxfp8")

    def test_early_upload_names_load(self):
        def early_name(name):
            name = name.replace("model.embed_tokens", "embed")
            name = name.replace("lm_head", "head")
            name = name.replace(".attn_hc.", ".hc_attn.")
            name = name.replace(".switch_mlp.gate_proj", ".experts.w1")
            name = name.replace(".switch_mlp.down_proj", ".experts.w2")
            return name.replace(".switch_mlp.up_proj", ".experts.w3")

        weights = {}
        for name, value in self.weights.items():
            if ".attn.wo_a." in name:
                for g in range(value.shape[0]):
                    weights[name.replace(".wo_a.", f".wo_a.{g}.")] = value[g]
            else:
                weights[early_name(name)] = value
        # Their per-layer quantization entries used the same names.
        config = copy.deepcopy(self.config)
        config["quantization"] = {
            early_name(k): v for k, v in config["quantization"].items()
        }
        path = self._save("early", weights, config)
        model, _ = load_model(path)
        self.assertEqual(_quantized_layers(model), _quantized_layers(self.model))
        self.assertTrue(mx.array_equal(model(TOKENS), self.expected))

    def test_missing_output_group_parts_are_named(self):
        parts = dict(self.weights)
        wo_a_0 = "model.layers.2.attn.wo_a.0.weight"
        parts[wo_a_0] = parts.pop("model.layers.2.attn.wo_a.weight")[0]
        path = self._save("parts", parts, self.config)
        assert_load_names_every_key(self, path, [f"{wo_a_0}: parts missing [1]"])


if __name__ == "__main__":
    unittest.main()
