# Copyright © 2026 Apple Inc.

"""Sampled tokens drafted by DeepSeek-V4-Flash-0731's DSpark drafter follow
the target's distribution: speculative sampling on the Markov-biased draft
distribution (``speculative_sample``), checked by a chi-square of the second
token of 600 two-token generations against its exact marginal."""

import unittest

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from mlx_lm.generate import speculative_generate_step
from mlx_lm.models import deepseek_v4
from mlx_lm.sample_utils import make_sampler

# Two layers (both tapped), a vocabulary of 8, three window-only stages.
CONFIG = {
    "model_type": "deepseek_v4",
    "vocab_size": 8,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "head_dim": 32,
    "qk_rope_head_dim": 8,
    "q_lora_rank": 24,
    "o_groups": 2,
    "o_lora_rank": 16,
    "sliding_window": 8,
    "moe_intermediate_size": 16,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "index_n_heads": 8,
    "index_head_dim": 16,
    "index_topk": 8,
    "compress_ratios": [0, 0, 0, 0, 0],
    "num_hash_layers": 0,
    "max_position_embeddings": 256,
    "num_nextn_predict_layers": 1,
    "dspark_block_size": 5,
    "dspark_noise_token_id": 7,
    "dspark_target_layer_ids": [0, 1],
    "dspark_markov_rank": 4,
    "mtp": True,
}


def make_model(seed=3):
    mx.random.seed(seed)
    model = deepseek_v4.Model(deepseek_v4.ModelArgs.from_dict(CONFIG))
    params = {}
    for name, value in tree_flatten(model.parameters()):
        if mx.issubdtype(value.dtype, mx.floating):
            noise = mx.random.normal(value.shape)
            if value.ndim >= 2:
                value = noise * value.shape[-1] ** -0.5
            elif name.endswith(("norm.weight", ".scale")):
                value = 1 + 0.2 * noise
            else:
                value = 0.5 * noise
        params[name] = value
    model.update(tree_unflatten(list(params.items())))
    mx.eval(model.parameters())
    return model


class TestDSparkSampling(unittest.TestCase):
    def test_sampled_tokens_follow_the_target_distribution(self):
        model = make_model()
        prompt = mx.array([5, 1, 3, 2, 6])
        first = mx.softmax(model(prompt[None])[0, -1])
        rows = mx.concatenate([mx.tile(prompt, (8, 1)), mx.arange(8)[:, None]], 1)
        expected = first @ mx.softmax(model(rows)[:, -1], axis=-1)
        sampler = make_sampler(temp=1.0)
        mx.random.seed(5)
        runs, counts, drafted = 600, [0] * 8, 0
        for _ in range(runs):
            steps = list(
                speculative_generate_step(
                    prompt,
                    model,
                    mtp=True,
                    num_draft_tokens=2,
                    max_tokens=2,
                    sampler=sampler,
                )
            )
            counts[steps[1][0]] += 1
            drafted += steps[1][2]
        expected = (expected * runs).tolist()
        chi2 = sum((c - e) ** 2 / e for c, e in zip(counts, expected))
        # The 0.999 quantile of chi-square with 7 degrees of freedom.
        self.assertLess(chi2, 24.32, (counts, expected))
        # Kept with probability min(1, p/q): drafts were kept, not only the
        # target's own samples.
        self.assertGreater(drafted, runs // 10)


if __name__ == "__main__":
    unittest.main()
