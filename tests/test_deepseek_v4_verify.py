# Copyright © 2026 Apple Inc.

import copy
import unittest

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from mlx_lm.models import deepseek_v4
from mlx_lm.models.cache import BatchWindowCompressorCache, trim_prompt_cache

CSA, HCA = "compressed_sparse_attention", "heavily_compressed_attention"
# A window of 8 rows, CSA windows of 4 rows and HCA windows of 8: prompts of
# 30-40 tokens wrap the window, pick top-4 of 8-10 CSA entries, and a verify
# forward of up to 8 tokens after them crosses compression boundaries.
CONFIG = {
    "model_type": "deepseek_v4",
    "vocab_size": 128,
    "hidden_size": 32,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "head_dim": 16,
    "qk_rope_head_dim": 8,
    "q_lora_rank": 16,
    "o_groups": 2,
    "o_lora_rank": 8,
    "sliding_window": 8,
    "moe_intermediate_size": 16,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "index_n_heads": 2,
    "index_head_dim": 8,
    "index_topk": 4,
    "hc_sinkhorn_iters": 4,
    "layer_types": ["sliding_attention", CSA, HCA, CSA],
    "compress_rates": {CSA: 4, HCA: 8},
    "mlp_layer_types": ["hash_moe", "moe", "moe", "moe"],
}


def make_model(dtype=mx.float32):
    model = deepseek_v4.Model(deepseek_v4.ModelArgs.from_dict(CONFIG))
    mx.random.seed(0)

    def init(path, p):
        if path.endswith("tid2eid"):
            return mx.random.randint(0, CONFIG["n_routed_experts"], p.shape)
        value = 0.3 * mx.random.normal(p.shape)
        value = value + 1.0 if path.endswith("norm.weight") else value
        # The parameters DeepSeek keeps in float32 stay float32.
        return value.astype(dtype if model.cast_predicate(path) else p.dtype)

    params = [(k, init(k, v)) for k, v in tree_flatten(model.parameters())]
    model.update(tree_unflatten(params))
    mx.eval(model.parameters())
    return model


def steps(model, cache, tokens):
    """The logits of ``tokens`` [B, L] fed one at a time [B, L, V]."""
    out = [model(tokens[:, i : i + 1], cache=cache) for i in range(tokens.shape[1])]
    return mx.concatenate(out, axis=1)


class TestDeepseekV4Verify(unittest.TestCase):
    """A forward of a few tokens after a prompt (a speculative verify) is the
    decode step widened to its rows: the logits and caches of one-token
    steps."""

    @classmethod
    def setUpClass(cls):
        cls.model = make_model()
        mx.random.seed(1)
        cls.tokens = mx.random.randint(2, 128, (2, 64))
        cls.prompts = {}

    def prefilled(self, length, row=0):
        """A cache holding the first ``length`` tokens of a row (a copy)."""
        if (length, row) not in self.prompts:
            cache = self.model.make_cache()
            prompt = self.tokens[row : row + 1, :length]
            mx.eval(self.model(prompt, cache=cache))
            self.prompts[length, row] = cache
        return copy.deepcopy(self.prompts[length, row])

    def assertClose(self, a, b):
        self.assertLess(mx.abs(a - b).max().item(), 1e-4)

    def test_logits_of_one_token_steps(self):
        # Rows that close no window, one, or two, of either ratio.
        for prompt, length in [(33, 2), (35, 4), (36, 5), (37, 3), (38, 8), (39, 6)]:
            with self.subTest(prompt=prompt, length=length):
                tokens = self.tokens[:1, prompt : prompt + length]
                cache = self.prefilled(prompt)
                verify = self.model(tokens, cache=cache)
                self.assertClose(
                    verify, steps(self.model, self.prefilled(prompt), tokens)
                )
                # The next token sees the verified rows as it sees steps'.
                after = self.tokens[:1, prompt + length][None]
                reference = self.prefilled(prompt)
                steps(self.model, reference, tokens)
                self.assertClose(
                    self.model(after, cache=cache), self.model(after, cache=reference)
                )

    def test_batch_rows_at_their_own_positions(self):
        def batch(lengths):
            caches = [self.prefilled(n, row) for row, n in enumerate(lengths)]
            return [BatchWindowCompressorCache.merge(c) for c in zip(*caches)]

        lengths = (37, 30)
        tokens = mx.stack([self.tokens[r, n : n + 6] for r, n in enumerate(lengths)])
        verify = self.model(tokens, cache=batch(lengths))
        self.assertClose(verify, steps(self.model, batch(lengths), tokens))

    def test_trims_after_a_verify_are_exact(self):
        # A verify of y and 7 drafts, the first ``accepted`` drafts kept: the
        # trims undo closed CSA and HCA windows (the rows cross 36 and 40).
        prompt, length, after = 33, 8, 8
        for accepted in (0, 2, 3, 6, 7):
            with self.subTest(accepted=accepted):
                kept = prompt + 1 + accepted
                cache = self.prefilled(prompt)
                self.model(self.tokens[:1, prompt : prompt + length], cache=cache)
                self.assertEqual(
                    trim_prompt_cache(cache, length - 1 - accepted),
                    length - 1 - accepted,
                )
                tokens = self.tokens[:1, kept : kept + after]
                self.assertClose(
                    steps(self.model, cache, tokens),
                    steps(self.model, self.prefilled(kept), tokens),
                )


if __name__ == "__main__":
    unittest.main()
