# Copyright © 2026 Apple Inc.
"""ArraysCache's metadata graph (arrays-cache) in every model that calls
advance, through the models' forward and BatchGenerator. The PR's own test is
tests/test_prompt_cache.py::TestArraysCache."""

import importlib
import io
import os
import re
import unittest
from unittest import mock

import mlx.core as mx

from mlx_lm.generate import BatchGenerator, generate_step
from mlx_lm.models.cache import ArraysCache, CacheList

_KDA = {"num_heads": 2, "head_dim": 16, "short_conv_kernel_size": 3}

# Every model of mlx-lm 0.32.2 whose layers call ArraysCache.advance, with a
# tiny config that has two ArraysCache layers: the second does not build the
# mask, so in decode only the fix evaluates its metadata.
ADVANCING_MODELS = {
    "bailing_hybrid": {
        "hidden_size": 32,
        "intermediate_size": 32,
        "moe_intermediate_size": 32,
        "moe_shared_expert_intermediate_size": 32,
        "num_hidden_layers": 4,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "num_shared_experts": 1,
        "n_group": 2,
        "topk_group": 1,
        "first_k_dense_replace": 1,
        "layer_group_size": 2,
        "group_norm_size": 1,
        "vocab_size": 64,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 256,
        "routed_scaling_factor": 1.0,
        "head_dim": 16,
        "q_lora_rank": 16,
        "kv_lora_rank": 16,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 8,
        "v_head_dim": 16,
    },
    "bailing_moe_v3": {
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 32,
        "moe_intermediate_size": 32,
        "moe_shared_expert_intermediate_size": 32,
        "num_hidden_layers": 3,
        "num_attention_heads": 2,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "num_shared_experts": 1,
        "n_group": 2,
        "topk_group": 1,
        "layer_group_size": 3,
        "head_dim": 16,
        "q_lora_rank": 16,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
    },
    "falcon_h1": {
        "num_hidden_layers": 2,
        "vocab_size": 64,
        "hidden_size": 32,
        "head_dim": 8,
        "intermediate_size": 32,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "mamba_d_head": 8,
        "mamba_d_ssm": 32,
        "mamba_d_state": 8,
        "mamba_n_heads": 4,
        "mamba_chunk_size": 8,
    },
    "gear": {
        "hidden_size": 32,
        "intermediate_size": 32,
        "num_hidden_layers": 3,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "vocab_size": 64,
        "layer_types": ["conv_mixer", "conv_mixer", "full_attention"],
        "sliding_window": 4,
        "conv_L_cache": 3,
        "rope_theta": 10000,
        "rope_local_base_freq": 1000,
    },
    "granitemoehybrid": {
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 32,
        "num_hidden_layers": 3,
        "max_position_embeddings": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "attention_bias": False,
        "embedding_multiplier": 1.0,
        "attention_multiplier": 1.0,
        "logits_scaling": 1.0,
        "residual_multiplier": 1.0,
        "mamba_n_heads": 4,
        "mamba_d_head": 8,
        "mamba_proj_bias": False,
        "mamba_d_state": 8,
        "mamba_d_conv": 4,
        "mamba_n_groups": 1,
        "mamba_conv_bias": False,
        "layer_types": ["mamba", "mamba", "attention"],
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
        "rope_theta": 1000.0,
    },
    "kimi_k3": {
        "text_config": {
            "vocab_size": 64,
            "hidden_size": 32,
            "num_hidden_layers": 3,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "intermediate_size": 32,
            "linear_attn_config": {**_KDA, "kda_layers": [1, 2]},
            "kv_lora_rank": 16,
            "qk_nope_head_dim": 8,
            "qk_rope_head_dim": 8,
            "v_head_dim": 16,
        }
    },
    "kimi_linear": {
        "vocab_size": 64,
        "hidden_size": 32,
        "num_hidden_layers": 3,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "intermediate_size": 32,
        "head_dim": 16,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "linear_attn_config": {**_KDA, "kda_layers": [1, 2]},
        "model_max_length": 256,
        "num_experts": 4,
        "num_experts_per_token": 2,
        "moe_intermediate_size": 32,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
    },
    "lfm2": {
        "hidden_size": 32,
        "num_hidden_layers": 3,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "norm_eps": 1e-5,
        "vocab_size": 64,
        "full_attn_idxs": [2],
        "rope_theta": 10000,
        "block_dim": 32,
        "block_ffn_dim_multiplier": 1.0,
        "block_auto_adjust_ff_dim": False,
        "block_ff_dim": 32,
        "block_multiple_of": 16,
        "max_position_embeddings": 256,
        "conv_bias": True,
        "conv_L_cache": 3,
    },
    "lfm2_moe": {
        "hidden_size": 32,
        "intermediate_size": 32,
        "num_hidden_layers": 3,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "norm_eps": 1e-5,
        "vocab_size": 64,
        "full_attn_idxs": [2],
        "rope_theta": 10000,
        "max_position_embeddings": 256,
        "conv_bias": True,
        "conv_L_cache": 3,
        "moe_intermediate_size": 16,
        "num_dense_layers": 1,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "norm_topk_prob": True,
        "use_expert_bias": True,
    },
    "mamba2": {
        "num_heads": 4,
        "head_dim": 8,
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 32,
        "state_size": 8,
        "num_hidden_layers": 2,
        "layer_norm_epsilon": 1e-4,
        "conv_kernel": 3,
        "n_groups": 2,
        "use_bias": False,
        "use_conv_bias": False,
        "tie_word_embeddings": True,
        "time_step_limit": (0.01, 10),
        "time_step_rank": "auto",
    },
    "nemotron_h": {
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 32,
        "max_position_embeddings": 256,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "attention_bias": False,
        "mamba_num_heads": 4,
        "mamba_head_dim": 8,
        "mamba_proj_bias": False,
        "ssm_state_size": 8,
        "conv_kernel": 3,
        "n_groups": 2,
        "mlp_bias": False,
        "layer_norm_epsilon": 1e-4,
        "use_bias": True,
        "use_conv_bias": True,
        "hybrid_override_pattern": ["M", "M", "*"],
        "num_hidden_layers": 3,
    },
    "olmo_hybrid": {
        "hidden_size": 32,
        "intermediate_size": 32,
        "num_hidden_layers": 3,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "rms_norm_eps": 1e-4,
        "vocab_size": 64,
        "max_position_embeddings": 256,
        "linear_num_key_heads": 1,
        "linear_num_value_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 3,
        "linear_allow_neg_eigval": False,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "rope_theta": 1000,
        "layer_types": ["linear_attention", "linear_attention", "full_attention"],
    },
    "plamo2": {
        "hidden_size": 32,
        "num_hidden_layers": 3,
        "intermediate_size": 32,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "hidden_size_per_head": 16,
        "rms_norm_eps": 1e-5,
        "vocab_size": 64,
        "mamba_d_state": 8,
        "mamba_num_heads": 4,
        "mamba_chunk_size": 8,
        "max_position_embeddings": 256,
        "attention_window_size": 256,
    },
    "qwen3_5": {
        "text_config": {
            "model_type": "qwen3_5_text",
            "hidden_size": 32,
            "intermediate_size": 32,
            "num_hidden_layers": 3,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "vocab_size": 64,
            "linear_num_value_heads": 2,
            "linear_num_key_heads": 1,
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
            "linear_conv_kernel_dim": 3,
            "full_attention_interval": 3,
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": True,
        }
    },
    "qwen3_next": {
        "hidden_size": 32,
        "num_hidden_layers": 3,
        "intermediate_size": 32,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "vocab_size": 64,
        "linear_num_value_heads": 2,
        "linear_num_key_heads": 1,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 3,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "shared_expert_intermediate_size": 32,
        "mlp_only_layers": [0],
        "moe_intermediate_size": 32,
        "rms_norm_eps": 1e-5,
        "head_dim": 16,
        "rope_theta": 1000.0,
        "partial_rotary_factor": 0.5,
        "max_position_embeddings": 256,
        "full_attention_interval": 3,
    },
}


def make_model(model_type, config=None):
    mx.random.seed(0)
    module = importlib.import_module(f"mlx_lm.models.{model_type}")
    config = dict(config or ADVANCING_MODELS[model_type], model_type=model_type)
    model = module.Model(module.ModelArgs.from_dict(config))
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model


def arrays_caches(caches):
    for c in caches:
        if isinstance(c, CacheList):
            yield from arrays_caches(c.caches)
        elif isinstance(c, ArraysCache):
            yield c


def graph_edges(a):
    """Edges of the unevaluated graph behind ``a``, 0 once it is evaluated."""
    if a is None:
        return 0
    f = io.StringIO()
    mx.export_to_dot(f, a)
    return f.getvalue().count("->")


def metadata_edges(caches):
    return max(
        (
            max(graph_edges(c.lengths), graph_edges(c.left_padding))
            for c in arrays_caches(caches)
        ),
        default=0,
    )


class TestArraysCacheGraph(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        config = dict(ADVANCING_MODELS["qwen3_5"])
        config["text_config"] = dict(
            config["text_config"],
            num_hidden_layers=4,
            full_attention_interval=4,
            vocab_size=128,
        )
        cls.qwen3_5 = make_model("qwen3_5", config)

    def test_every_model_that_advances_is_listed(self):
        folder = os.path.dirname(importlib.import_module("mlx_lm.models").__file__)
        advancing = set()
        for name in os.listdir(folder):
            if not name.endswith(".py"):
                continue
            with open(os.path.join(folder, name), "rb") as f:
                if re.search(rb"cache\.advance\(", f.read()):
                    advancing.add(name[:-3])
        self.assertEqual(advancing, set(ADVANCING_MODELS))

    def test_advance_keeps_values_and_state(self):
        cache = ArraysCache(2, left_padding=[2, 0])
        state = mx.arange(8).reshape(2, 4)
        cache[1] = state
        cache.advance(3)
        self.assertTrue(mx.array_equal(cache[1], state))
        self.assertEqual(cache.left_padding.tolist(), [-1, -3])
        self.assertIsNone(cache[0])

    def test_layers_read_the_tied_entry_before_writing_it(self):
        # advance ties the metadata to cache[0]; the next step must read that
        # array before it writes it, or the metadata is never evaluated.
        get, set_ = ArraysCache.__getitem__, ArraysCache.__setitem__
        for model_type in ADVANCING_MODELS:
            with self.subTest(model=model_type):
                model = make_model(model_type)
                caches = model.make_cache()
                model(mx.array([[1, 2, 3]]), cache=caches)
                tied = {}
                for c in arrays_caches(caches):
                    self.assertIsNotNone(c[0])
                    tied[id(c)] = 0
                first = {}

                def record(kind, cache, idx):
                    if idx == tied.get(id(cache)):
                        first.setdefault(id(cache), kind)

                def getitem(cache, idx):
                    record("read", cache, idx)
                    return get(cache, idx)

                def setitem(cache, idx, value):
                    record("write", cache, idx)
                    set_(cache, idx, value)

                with mock.patch.object(ArraysCache, "__getitem__", getitem):
                    with mock.patch.object(ArraysCache, "__setitem__", setitem):
                        mx.eval(model(mx.array([[4]]), cache=caches))
                self.assertEqual(first, {k: "read" for k in tied})

    def test_models_keep_metadata_graph_short_in_batch_generator(self):
        for model_type in ADVANCING_MODELS:
            with self.subTest(model=model_type):
                model = make_model(model_type)
                gen = BatchGenerator(model, stop_tokens=set(), max_tokens=24)
                gen.insert([[1, 2, 3, 4]])
                while gen.next_generated():
                    batch = gen._generation_batch
                    mx.eval(batch._next_tokens)
                    self.assertLessEqual(metadata_edges(batch.prompt_cache), 16)
                gen.close()

    def test_models_keep_left_padding_graph_short(self):
        # A decode loop that evaluates only the logits, with left padding in
        # every ArraysCache: the metadata is evaluated through the tied entry.
        for model_type in ADVANCING_MODELS:
            with self.subTest(model=model_type):
                model = make_model(model_type)
                caches = model.make_cache()
                for c in arrays_caches(caches):
                    c.left_padding = mx.array([0])
                mx.eval(model(mx.array([[1, 2, 3]]), cache=caches))
                for _ in range(12):
                    mx.eval(model(mx.array([[4]]), cache=caches))
                    self.assertLessEqual(metadata_edges(caches), 8)
                for c in arrays_caches(caches):
                    self.assertEqual(c.left_padding.tolist(), [-15])

    def _batch_matches_single(self, prompts, join=None):
        model = self.qwen3_5
        steps = 300
        join_step, join_prompt = join or (None, None)
        gen = BatchGenerator(model, stop_tokens=set())
        uids = gen.insert(prompts, max_tokens=[steps] * len(prompts))
        lengths = [steps] * len(prompts)
        results = {}
        step = 0
        while True:
            if step == join_step:
                uids += gen.insert([join_prompt], max_tokens=[steps - step])
                prompts = prompts + [join_prompt]
                lengths.append(steps - step)
            responses = gen.next_generated()
            if not responses:
                break
            step += 1
            for r in responses:
                results.setdefault(r.uid, []).append((r.token, r.logprobs))
            batch = gen._generation_batch
            mx.eval(batch._next_tokens)
            self.assertLessEqual(metadata_edges(batch.prompt_cache), 16)
            self.assertLessEqual(metadata_edges(gen._prompt_batch.prompt_cache), 16)
        gen.close()

        for uid, prompt, length in zip(uids, prompts, lengths):
            self.assertEqual(len(results[uid]), length)
            single = generate_step(mx.array(prompt), model, max_tokens=length)
            for (token, logprobs), (b_token, b_logprobs) in zip(single, results[uid]):
                self.assertEqual(token, b_token)
                self.assertTrue(mx.allclose(b_logprobs, logprobs, rtol=1e-4, atol=1e-4))

    def test_batch_generator_matches_single_and_keeps_graph_short(self):
        shapes = {
            "one request": ([[1, 2, 3, 4, 5]], None),
            "two of equal length": ([[1, 2, 3], [4, 5, 6]], None),
            "two of different length": ([[1, 2, 3, 4, 5, 6, 7], [8, 9]], None),
            "one joining at step 150": ([[1, 2, 3, 4]], (150, [5, 6, 7])),
        }
        for shape, (prompts, join) in shapes.items():
            with self.subTest(shape=shape):
                self._batch_matches_single(prompts, join)


if __name__ == "__main__":
    unittest.main()
