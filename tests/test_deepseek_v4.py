# Copyright © 2026 Apple Inc.

import copy
import importlib.util
import json
import tempfile
import unittest
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map, tree_unflatten

from mlx_lm.models import deepseek_v4
from mlx_lm.models.cache import (
    CompressorCache,
    SharedWindowCache,
    WindowCompressorCache,
    load_prompt_cache,
    make_prompt_cache,
    save_prompt_cache,
)

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


def make_tiny_model(config=None, seed=0):
    args = deepseek_v4.ModelArgs.from_dict(config or TINY_CONFIG)
    return random_weights(deepseek_v4.Model(args), seed)


def make_tiny_tokenizer(path, vocab_size):
    """A byte-level BPE tokenizer of vocab_size tokens saved in path."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"],
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


class TestDeepseekV4(unittest.TestCase):

    def test_model_runner_checks(self):
        # The checks of the upstream model_test_runner.
        model = make_tiny_model()
        args = model.args
        self.assertEqual(len(model.layers), args.num_hidden_layers)
        self.assertEqual(model.model_type, "deepseek_v4")
        for t in [mx.float32, mx.float16]:
            model.update(
                tree_map(
                    lambda p: p.astype(t) if mx.issubdtype(p.dtype, mx.floating) else p,
                    model.parameters(),
                )
            )
            inputs = mx.array([[0, 1]])
            outputs = model(inputs)
            self.assertEqual(outputs.shape, (1, 2, args.vocab_size))
            self.assertEqual(outputs.dtype, t)

            cache = make_prompt_cache(model)
            outputs = model(inputs, cache=cache)
            self.assertEqual(outputs.shape, (1, 2, args.vocab_size))
            self.assertEqual(outputs.dtype, t)

            outputs = model(mx.argmax(outputs[0, -1:, :], keepdims=True), cache=cache)
            self.assertEqual(outputs.shape, (1, 1, args.vocab_size))
            self.assertEqual(outputs.dtype, t)

        inputs = mx.array([[0, 1], [2, 3]])
        outputs = model(inputs)
        self.assertEqual(outputs.shape, (2, 2, args.vocab_size))
        copy.deepcopy(model)

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

    def test_pools_grow_in_place(self):
        model = make_tiny_model()
        cache = model.make_cache()
        model(mx.zeros((1, 64), dtype=mx.int32), cache)
        csa, hca = cache[1].compressor, cache[2].compressor
        self.assertEqual((csa.entries, hca.entries), (16, 4))
        # Storage is allocated in steps and written by slice assignment.
        self.assertEqual(csa.pool.shape[1], CompressorCache.step)
        pool = csa.pool
        mx.eval(model(mx.zeros((1, 4), dtype=mx.int32), cache))
        self.assertEqual(csa.entries, 17)
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
        import mlx.nn as nn

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
