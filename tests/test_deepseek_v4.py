# Copyright © 2026 Apple Inc.

import dataclasses
import importlib.util
import json
import math
import tempfile
import unittest
import warnings
import zlib
from pathlib import Path
from typing import Optional

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as opt
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from mlx_lm import tuner
from mlx_lm.models import deepseek_v4
from mlx_lm.models.cache import (
    TRIM_HISTORY,
    CompressorCache,
    SharedWindowCache,
    WindowCompressorCache,
    load_prompt_cache,
    make_prompt_cache,
    save_prompt_cache,
)
from mlx_lm.models.switch_layers import SwitchLinear

HAS_TORCH = all(importlib.util.find_spec(m) for m in ("torch", "transformers"))

# Every layer type and two hash layers; small rates and window so a prompt of
# a few hundred tokens wraps the window and fills both pools.
TINY_CONFIG = {
    "model_type": "deepseek_v4",
    "vocab_size": 300,
    "hidden_size": 32,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "head_dim": 32,
    "qk_rope_head_dim": 8,
    "q_lora_rank": 24,
    "o_groups": 2,
    "o_lora_rank": 16,
    "sliding_window": 32,
    "moe_intermediate_size": 16,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "index_n_heads": 8,
    "index_head_dim": 16,
    "index_topk": 8,
    "layer_types": [
        "sliding_attention",
        "compressed_sparse_attention",
        "heavily_compressed_attention",
        "compressed_sparse_attention",
    ],
    "compress_rates": {
        "compressed_sparse_attention": 4,
        "heavily_compressed_attention": 16,
    },
    "mlp_layer_types": ["hash_moe", "hash_moe", "moe", "moe"],
    "rope_parameters": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "beta_fast": 32,
        "beta_slow": 1,
    },
    "max_position_embeddings": 256,
    "bos_token_id": 0,
    "eos_token_id": 1,
}


def random_weights(model, seed=0):
    """Give every parameter random values (the defaults are mostly zeros)."""
    mx.random.seed(seed)
    args = model.args

    def init(path, p):
        if path.endswith("tid2eid"):
            return mx.random.randint(0, args.n_routed_experts, p.shape).astype(p.dtype)
        if path.endswith("norm.weight"):
            return 1.0 + 0.1 * mx.random.normal(p.shape)
        return 0.2 * mx.random.normal(p.shape)

    flat = [(k, init(k, v)) for k, v in tree_flatten(model.parameters())]
    model.update(tree_unflatten(flat))
    mx.eval(model.parameters())
    return model


# The tokens of DeepSeek-V4's chat format (BOS and EOS first), as
# mlx_lm/chat_templates/deepseek_v4.py checks them at load.
special_tokens = (
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<think>",
    "</think>",
)


def make_tiny_model(config=None, seed=0):
    args = deepseek_v4.ModelArgs.from_dict(config or TINY_CONFIG)
    return random_weights(deepseek_v4.Model(args), seed)


def make_tiny_tokenizer(path, vocab_size, special_tokens=special_tokens):
    """A byte-level BPE tokenizer of vocab_size tokens saved in path, with the
    chat format's special tokens (BOS and EOS first)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    text = ["The quick brown fox jumps over the lazy dog. " * 4] * 8
    tokenizer.train_from_iterator(text, trainer)
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<｜begin▁of▁sentence｜>",
        eos_token="<｜end▁of▁sentence｜>",
    ).save_pretrained(path)


def make_tiny_model_folder(path, config=None, seed=0):
    """Write a random tiny DeepSeek-V4 (config, weights, tokenizer) to path."""
    config = config or TINY_CONFIG
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model = make_tiny_model(config, seed)
    # Zero logits for BOS and EOS, so greedy decoding runs to the token limit.
    model.lm_head.weight[:2] = 0.0
    mx.save_safetensors(
        str(path / "model.safetensors"), dict(tree_flatten(model.parameters()))
    )
    with open(path / "config.json", "w") as f:
        json.dump(config, f, indent=2)
    make_tiny_tokenizer(path, config["vocab_size"])
    return path


def max_diff(a, b):
    return mx.abs(a.astype(mx.float32) - b.astype(mx.float32)).max().item()


# Recorded from transformers' DeepseekV4ForCausalLM (CPU torch, float32) on
# the weights of seeded_model() and the tokens of seeded_tokens(); see
# transformers_logits and TestDeepseekV4Transformers, which recomputes them.
# (Seed 0 puts a top-k pick on a near tie that float rounding decides.)
RECORDED_SEED = 1
RECORDED_POSITIONS = (0, 31, 32, 100, 200, 319)
RECORDED_LOGITS = (
    (-0.28736222, 0.028773338, -0.018358096, -0.711353, 2.5768335, 0.50235087),
    (2.0119197, 1.4937081, 0.36236233, -1.2104663, 3.3493612, 0.30717605),
    (2.3435755, 1.602152, 1.6708801, -2.2809861, 1.2720251, -0.036039472),
    (1.9435325, 1.5208817, 1.170927, -1.0333233, 1.8676848, -0.85795557),
    (0.71896315, 1.7371917, -0.89628816, 0.13029316, 0.41813365, 0.19270416),
    (-1.4696004, 0.94257987, 0.93110353, -0.13839662, 1.7942266, -1.1963558),
)
RECORDED_SUMMARY = (-1530.14908303, 131955.265269, 55.1366312333)


def seeded_model(config=None, seed=RECORDED_SEED):
    """A tiny model whose weights depend only on the seed and each weight's
    checkpoint name, not on the order of the parameters."""
    model = deepseek_v4.Model(deepseek_v4.ModelArgs.from_dict(config or TINY_CONFIG))
    args = model.args

    def init(path, p):
        key = mx.random.key(zlib.crc32(f"{seed}:{path}".encode()))
        if path.endswith("tid2eid"):
            return mx.random.randint(0, args.n_routed_experts, p.shape, key=key)
        scale = 0.1 if "norm" in path else 0.2
        offset = 1.0 if "norm" in path else 0.0
        return offset + scale * mx.random.normal(p.shape, key=key)

    flat = [
        (k, init(k, v).astype(v.dtype)) for k, v in tree_flatten(model.parameters())
    ]
    model.update(tree_unflatten(flat))
    mx.eval(model.parameters())
    return model


def seeded_tokens(n=320, seed=1):
    return mx.random.randint(
        0, TINY_CONFIG["vocab_size"], (1, n), key=mx.random.key(seed)
    )


def logits_summary(logits):
    """The recorded logits, and sums over all of them that a change anywhere
    moves: the total, the squares and a cosine-weighted sum (in float64)."""
    x = np.array(logits[0].astype(mx.float32), dtype=np.float64)
    sample = x[list(RECORDED_POSITIONS), :6]
    n, v = x.shape
    phase = np.arange(n)[:, None] * 0.11 + np.arange(v)[None] * 0.37
    return sample, np.array([x.sum(), (x * x).sum(), (x * np.cos(phase)).sum()])


def transformers_logits(model, tokens, config=None):
    """Logits of transformers' DeepseekV4ForCausalLM with the weights of the
    MLX model: each element of the reference's checkpoint is tagged with its
    index, the tags go through the MLX loader, and the MLX values are put
    back where the tags show they come from."""
    import torch
    from mlx_lm.utils import load_model
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    config = {k: v for k, v in (config or TINY_CONFIG).items() if k != "model_type"}
    reference = DeepseekV4ForCausalLM(DeepseekV4Config(**config)).float().eval()
    state = reference.state_dict()
    starts, total = {}, 1
    with torch.no_grad():
        for name, t in state.items():
            starts[name] = total
            tags = torch.arange(total, total + t.numel()).reshape(t.shape)
            t.copy_(tags.to(t.dtype))
            total += t.numel()
        with tempfile.TemporaryDirectory() as tmp:
            reference.save_pretrained(tmp)
            tagged, _ = load_model(Path(tmp))
        values = np.zeros(total, dtype=np.float64)
        covered = np.zeros(total, dtype=bool)
        mlx_weights = dict(tree_flatten(model.parameters()))
        for name, tags in tree_flatten(tagged.parameters()):
            ids = np.array(tags.astype(mx.int64)).ravel()
            values[ids] = np.array(mlx_weights[name].astype(mx.float32)).ravel()
            covered[ids] = True
        for name, t in state.items():
            start = starts[name]
            if not covered[start : start + t.numel()].all():
                raise AssertionError(f"{name} is not loaded by the MLX model")
            v = values[start : start + t.numel()].reshape(tuple(t.shape))
            t.copy_(torch.from_numpy(v).to(t.dtype))
        inputs = torch.from_numpy(np.array(tokens).astype(np.int64))
        logits = reference(inputs, use_cache=False).logits
    return mx.array(logits.numpy())


class TestDeepseekV4Config(unittest.TestCase):

    def test_both_config_schemas_give_the_same_layers(self):
        legacy = {
            k: v
            for k, v in TINY_CONFIG.items()
            if k not in ("layer_types", "compress_rates", "mlp_layer_types")
        }
        # DeepSeek's list has one more entry, for the MTP block.
        legacy.update(compress_ratios=[0, 4, 16, 4, 0], num_hash_layers=2)
        a = deepseek_v4.ModelArgs.from_dict(TINY_CONFIG)
        b = deepseek_v4.ModelArgs.from_dict(legacy)
        self.assertEqual(a.layer_types, b.layer_types)
        self.assertEqual(a.compress_rates, b.compress_rates)
        self.assertEqual(a.mlp_layer_types, b.mlp_layer_types)

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

    def test_invalid_config_names_the_field(self):
        bad = {
            "layer_types": ["sliding_attention"] * 3,
            "mlp_layer_types": ["hash_moe", "moe", "moe", "dense"],
            "compress_rates": {"compressed_sparse_attention": 0},
            "scoring_func": "softmax",
            "num_key_value_heads": 2,
        }
        for field, value in bad.items():
            with self.subTest(field=field):
                with self.assertRaisesRegex(ValueError, field):
                    deepseek_v4.ModelArgs.from_dict({**TINY_CONFIG, field: value})
        config = {k: v for k, v in TINY_CONFIG.items() if k != "layer_types"}
        with self.assertRaisesRegex(ValueError, "compress_ratios"):
            deepseek_v4.ModelArgs.from_dict(config)

    def test_number_fields_of_the_wrong_type_are_named(self):
        kinds = (int, Optional[int], float, Optional[float])
        for field in dataclasses.fields(deepseek_v4.ModelArgs):
            for value in ("abc", True) if field.type in kinds else ():
                with self.subTest(field=field.name, value=value):
                    config = {**TINY_CONFIG, field.name: value}
                    with self.assertRaises(ValueError) as e:
                        deepseek_v4.ModelArgs.from_dict(config)
                    problems = [p.strip() for p in str(e.exception).splitlines()[1:]]
                    self.assertEqual(len(problems), 1)
                    self.assertTrue(problems[0].startswith(f"`{field.name}` "))

    def test_fields_that_do_not_fit_together_are_named(self):
        for overrides, message in (
            ({"qk_rope_head_dim": 34}, "`qk_rope_head_dim` 34 is odd or above"),
            ({"qk_rope_head_dim": 7}, "`qk_rope_head_dim` 7 is odd or above"),
            ({"num_experts_per_tok": 9}, "`num_experts_per_tok` is more than"),
            ({"o_groups": 3}, "`o_groups` 3 does not divide"),
        ):
            with self.subTest(**overrides):
                with self.assertRaisesRegex(ValueError, message):
                    deepseek_v4.ModelArgs.from_dict({**TINY_CONFIG, **overrides})

    def test_compress_ratios_and_layer_types_must_agree(self):
        # DeepSeek's list may carry one more entry, for the MTP block.
        agreeing = {**TINY_CONFIG, "compress_ratios": [0, 4, 16, 4, 0]}
        args = deepseek_v4.ModelArgs.from_dict(agreeing)
        self.assertEqual(args.layer_types, TINY_CONFIG["layer_types"])
        for ratios, layer in (([0, 4, 4, 4], 2), ([0, 4, 128, 4], 2), ([4] * 4, 0)):
            with self.subTest(ratios=ratios):
                config = {**TINY_CONFIG, "compress_ratios": ratios}
                with self.assertRaisesRegex(
                    ValueError,
                    f"`compress_ratios` and `layer_types` disagree on layer {layer}",
                ):
                    deepseek_v4.ModelArgs.from_dict(config)


class TestDeepseekV4(unittest.TestCase):

    def test_batch_rows_match_single_rows(self):
        model = make_tiny_model()
        mx.random.seed(1)
        inputs = mx.random.randint(0, 300, (2, 70))
        both = model(inputs)
        for i in range(2):
            self.assertLessEqual(
                max_diff(both[i : i + 1], model(inputs[i : i + 1])), 1e-5
            )

    def test_decode_and_chunked_prefill_equal_one_forward(self):
        # One layer of each type, to keep the 600 decode steps quick.
        config = {
            **TINY_CONFIG,
            "num_hidden_layers": 3,
            "layer_types": [
                "compressed_sparse_attention",
                "heavily_compressed_attention",
                "sliding_attention",
            ],
            "mlp_layer_types": ["hash_moe", "moe", "moe"],
        }
        model = make_tiny_model(config)
        mx.random.seed(2)
        n = 600
        inputs = mx.random.randint(0, 300, (1, n))
        full = model(inputs)
        mx.eval(full)
        # Split points with different phases of every window and rate.
        for split in (1, 530, 571):
            with self.subTest(split=split):
                cache = model.make_cache()
                outs = [model(inputs[:, :split], cache)]
                for i in range(split, n):
                    outs.append(model(inputs[:, i : i + 1], cache))
                    mx.async_eval(outs[-1])
                out = mx.concatenate(outs, axis=1)
                self.assertLessEqual(max_diff(out, full), 1e-4)
        for step in (7, 64, 250):
            with self.subTest(step=step):
                cache = model.make_cache()
                outs = [
                    model(inputs[:, i : i + step], cache) for i in range(0, n, step)
                ]
                out = mx.concatenate(outs, axis=1)
                self.assertLessEqual(max_diff(out, full), 1e-4)

    def test_quantized_output_groups_match_their_dequantized_weights(self):
        # A quantized wo_a goes through gather_qmm, a plain one a matmul.
        model = make_tiny_model()
        inputs = mx.random.randint(0, 300, (2, 200))
        nn.quantize(model, 32, 8, class_predicate=lambda p, m: p.endswith("wo_a"))
        quantized = model(inputs)
        for layer in model.layers:
            wo_a = layer.attn.wo_a
            plain = SwitchLinear(1, 1, 1, bias=False)
            plain.weight = mx.dequantize(
                wo_a.weight, wo_a.scales, wo_a.biases, group_size=32, bits=8
            )
            layer.attn.wo_a = plain
        self.assertLessEqual(max_diff(model(inputs), quantized), 1e-5)

    def test_pools_grow_in_place(self):
        model = make_tiny_model()
        cache = model.make_cache()
        model(mx.zeros((1, 64), dtype=mx.int32), cache)
        csa, hca = cache[1].compressor, cache[2].compressor
        self.assertEqual((csa.size() // csa.ratio, hca.size() // hca.ratio), (16, 4))
        # Storage is allocated in steps and written by slice assignment.
        self.assertEqual(csa.pool.shape[1], CompressorCache.step)
        pool = csa.pool
        mx.eval(model(mx.zeros((1, 4), dtype=mx.int32), cache))
        self.assertEqual(csa.size() // csa.ratio, 17)
        self.assertEqual(csa.pool.shape, pool.shape)

    def test_every_cache_size_is_the_tokens_seen(self):
        model = make_tiny_model()
        cache = model.make_cache()
        model(mx.zeros((1, 70), dtype=mx.int32), cache)
        for layer_cache in cache:
            sizes = [c.size() for c in [layer_cache, *layer_cache.caches]]
            self.assertEqual(sizes, [70] * len(sizes))

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

    def test_caches_merge_into_batches(self):
        # The server batches only caches that have merge.
        model = make_tiny_model()
        self.assertTrue(all(hasattr(c, "merge") for c in make_prompt_cache(model)))

    def test_prompt_cache_save_load_round_trip(self):
        model = make_tiny_model()
        mx.random.seed(3)
        inputs = mx.random.randint(0, 300, (1, 150))
        cache = model.make_cache()
        mx.eval(model(inputs[:, :130], cache))
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
            self.assertEqual(a.offset, b.offset)
            self.assertEqual([c.size() for c in a.caches], [c.size() for c in b.caches])
        for i in range(130, 150):
            token = inputs[:, i : i + 1]
            self.assertEqual(max_diff(model(token, cache), model(token, loaded)), 0.0)

    def test_tiny_folder_loads_and_generates(self):
        from mlx_lm import load, stream_generate

        with tempfile.TemporaryDirectory() as tmp:
            make_tiny_model_folder(tmp)
            model, tokenizer = load(tmp)
            prompt = "The quick brown fox"
            *_, last = stream_generate(model, tokenizer, prompt, max_tokens=60)
        # Greedy decoding never meets EOS here, so it runs to the limit.
        self.assertEqual(last.generation_tokens, 60)
        self.assertEqual(last.finish_reason, "length")
        cache = model.make_cache()
        self.assertIsInstance(cache[0], WindowCompressorCache)
        self.assertIsInstance(cache[0].window, SharedWindowCache)


class TestDeepseekV4Numerics(unittest.TestCase):

    def assertMatchesRecord(self, logits):
        sample, summary = logits_summary(logits)
        np.testing.assert_allclose(sample, RECORDED_LOGITS, rtol=0, atol=1e-4)
        np.testing.assert_allclose(summary, RECORDED_SUMMARY, rtol=0, atol=0.05)

    def test_logits_match_the_recorded_transformers_logits(self):
        model = seeded_model()
        tokens = seeded_tokens()
        self.assertMatchesRecord(model(tokens))
        # The same through the cache, one token at a time after a prefill.
        cache = model.make_cache()
        outs = [model(tokens[:, :250], cache)]
        for i in range(250, tokens.shape[1]):
            outs.append(model(tokens[:, i : i + 1], cache))
        self.assertMatchesRecord(mx.concatenate(outs, axis=1))

    def test_sliding_window_is_a_fixed_buffer(self):
        # A ring of the window's rows and the rows a trim may take back,
        # plus the slot that takes rows not kept.
        model = make_tiny_model()
        args = model.args
        self.assertEqual(args.layer_types[0], "sliding_attention")
        rows = args.sliding_window + TRIM_HISTORY + 1
        size = rows * args.head_dim * mx.float32.size
        cache = model.make_cache()
        for length in (10, 100, 1, 1, 1):
            mx.eval(model(mx.zeros((1, length), dtype=mx.int32), cache))
            self.assertEqual(cache[0].nbytes, size)


class TestDeepseekV4GenerationOptions(unittest.TestCase):

    def test_max_kv_size_warns_that_it_does_not_apply(self):
        model = make_tiny_model()
        with self.assertWarnsRegex(
            UserWarning, "max_kv_size 64 does not apply to deepseek_v4"
        ):
            cache = make_prompt_cache(model, max_kv_size=64)
        self.assertIsInstance(cache[0], WindowCompressorCache)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            make_prompt_cache(model)

    def test_kv_bits_is_an_error_naming_the_option(self):
        from mlx_lm.generate import generate_step

        model = make_tiny_model()
        steps = generate_step(mx.array([3, 1, 4]), model, kv_bits=4)
        with self.assertRaisesRegex(ValueError, r"kv_bits \(--kv-bits\) 4"):
            next(steps)

    def test_kv_bits_still_quantizes_a_kv_cache(self):
        from mlx_lm.generate import generate_step

        from mlx_lm.models import llama
        from mlx_lm.models.cache import QuantizedKVCache

        args = llama.ModelArgs(
            model_type="llama",
            hidden_size=64,
            num_hidden_layers=2,
            intermediate_size=64,
            num_attention_heads=2,
            rms_norm_eps=1e-5,
            vocab_size=100,
            num_key_value_heads=2,
        )
        model = llama.Model(args)
        cache = make_prompt_cache(model)
        steps = generate_step(
            mx.array([3, 1, 4]),
            model,
            prompt_cache=cache,
            kv_bits=4,
            kv_group_size=32,
            quantized_kv_start=0,
            max_tokens=3,
        )
        self.assertEqual(len(list(steps)), 3)
        self.assertIsInstance(cache[0], QuantizedKVCache)


class TestDeepseekV4Training(unittest.TestCase):

    def train(self, model, steps=2):
        """Train model for steps through mlx_lm's trainer; return the losses."""

        class Losses(tuner.callbacks.TrainingCallback):
            def __init__(self):
                self.losses = []

            def on_train_loss_report(self, info):
                self.losses.append(info["train_loss"])

        mx.random.seed(4)
        data = [(mx.random.randint(2, 300, (40,)).tolist(), 0) for _ in range(2)]
        callback = Losses()
        with tempfile.TemporaryDirectory() as tmp:
            tuner.trainer.train(
                model,
                opt.Adam(learning_rate=1e-2),
                data,
                args=tuner.trainer.TrainingArgs(
                    batch_size=2,
                    iters=steps,
                    steps_per_report=1,
                    adapter_file=str(Path(tmp) / "adapters.safetensors"),
                ),
                training_callback=callback,
            )
        return callback.losses

    def assertTrains(self, model):
        before = dict(tree_flatten(model.trainable_parameters()))
        self.assertTrue(before)
        losses = self.train(model)
        self.assertEqual(len(losses), 2)
        self.assertTrue(all(math.isfinite(loss) for loss in losses))
        after = dict(tree_flatten(model.trainable_parameters()))
        self.assertEqual(after.keys(), before.keys())
        self.assertTrue(any(not mx.array_equal(after[k], before[k]) for k in after))

    def test_lora_trains(self):
        model = make_tiny_model()
        model.freeze()
        tuner.utils.linear_to_lora_layers(
            model, len(model.layers), {"rank": 4, "scale": 10.0, "dropout": 0.0}
        )
        self.assertTrains(model)

    def test_full_fine_tuning_trains(self):
        # As mlx_lm.lora does it. The hash layers' expert tables stay integers.
        model = make_tiny_model()
        model.freeze()
        for layer in model.layers:
            layer.unfreeze()
        self.assertTrains(model)
        gate = model.layers[0].ffn.gate
        self.assertEqual(gate.tid2eid.dtype, mx.int32)


def transformers_model(config, seed):
    """A random transformers DeepseekV4ForCausalLM for config."""
    import torch
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    config = {k: v for k, v in config.items() if k != "model_type"}
    torch.manual_seed(seed)
    model = DeepseekV4ForCausalLM(DeepseekV4Config(**config, initializer_range=0.1))
    model = model.float().eval()
    with torch.no_grad():
        # These start at zeros or ones.
        for name, p in model.named_parameters():
            if name.endswith(("sinks", "position_bias", "base", "scale")):
                p.copy_(torch.randn_like(p))
            elif "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
        for name, b in model.named_buffers():
            if name.endswith("tid2eid"):
                b.copy_(torch.randint(0, config["n_routed_experts"], b.shape))
            elif name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn_like(b))
    return model


@unittest.skipUnless(HAS_TORCH, "torch and transformers are needed")
class TestDeepseekV4Transformers(unittest.TestCase):

    def test_recorded_logits_are_transformers_logits(self):
        model = seeded_model()
        logits = transformers_logits(model, seeded_tokens())
        sample, summary = logits_summary(logits)
        np.testing.assert_allclose(sample, RECORDED_LOGITS, rtol=0, atol=1e-5)
        np.testing.assert_allclose(summary, RECORDED_SUMMARY, rtol=0, atol=0.01)

    def test_logits_match_transformers(self):
        import torch
        from mlx_lm.utils import load_model

        reference = transformers_model(TINY_CONFIG, seed=0)
        n = 320
        torch.manual_seed(1)
        inputs = torch.randint(0, TINY_CONFIG["vocab_size"], (1, n))
        with torch.no_grad():
            expected = reference(inputs, use_cache=False).logits
        with tempfile.TemporaryDirectory() as tmp:
            reference.save_pretrained(tmp)
            model, _ = load_model(Path(tmp))
        # The prompt wraps the window and fills both pools.
        args = model.args
        self.assertGreater(n, 4 * args.sliding_window)
        self.assertGreater(n // 4, 4 * args.index_topk)
        self.assertGreaterEqual(n // 16, 3)

        out = model(mx.array(inputs.numpy()))
        self.assertGreater(expected.abs().max().item(), 1.0)
        self.assertLessEqual(max_diff(out, mx.array(expected.numpy())), 1e-4)

        # The same through the cache, one token at a time after a prefill.
        cache = model.make_cache()
        outs = [model(mx.array(inputs[:, :250].numpy()), cache)]
        for i in range(250, n):
            outs.append(model(mx.array(inputs[:, i : i + 1].numpy()), cache))
        out = mx.concatenate(outs, axis=1)
        self.assertLessEqual(max_diff(out, mx.array(expected.numpy())), 1e-4)


if __name__ == "__main__":
    unittest.main()
