# Copyright © 2026 Apple Inc.

import contextlib
import io
import tempfile
import unittest
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.generate import generate_step, speculative_generate_step

from mlx_lm.models import deepseek_v4
from mlx_lm.models.cache import (
    DSparkCache,
    load_prompt_cache,
    make_prompt_cache,
    save_prompt_cache,
    trim_prompt_cache,
)
from mlx_lm.models.deepseek_v4_dspark import (
    DSparkDrafter,
    make_dspark_prompt_cache,
)

# 0731-shaped and tiny: four layers, the taps after the last three, one
# window-only compress_ratios entry per DSpark stage (three), and
# num_nextn_predict_layers reading 1 as on DeepSeek's checkpoint. The
# window (8) is well inside the decodes below.
CONFIG = {
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
    "sliding_window": 8,
    "moe_intermediate_size": 16,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "index_n_heads": 8,
    "index_head_dim": 16,
    "index_topk": 8,
    "compress_ratios": [0, 4, 16, 4, 0, 0, 0],
    "num_hash_layers": 1,
    "max_position_embeddings": 512,
    "num_nextn_predict_layers": 1,
    "dspark_block_size": 5,
    "dspark_noise_token_id": 299,
    "dspark_target_layer_ids": [1, 2, 3],
    "dspark_markov_rank": 8,
}
WITH_DSPARK = {**CONFIG, "mtp": True}
PROMPT = mx.array([5, 17, 33, 2, 61, 40, 7, 7, 12, 50, 3, 28, 44, 19, 8] * 2)


def make_model(config=WITH_DSPARK, seed=0):
    """A model whose every float parameter is random (norms around 1,
    matrices scaled by their fan-in; the Markov head's strong enough to
    change drafts)."""
    mx.random.seed(seed)
    model = deepseek_v4.Model(deepseek_v4.ModelArgs.from_dict(config))
    params = {}
    for name, value in tree_flatten(model.parameters()):
        if mx.issubdtype(value.dtype, mx.floating):
            noise = mx.random.normal(value.shape)
            if value.ndim >= 2:
                value = noise * value.shape[-1] ** -0.5
                if ".markov_head." in name:
                    value = 4 * value
            elif name.endswith(("norm.weight", ".scale")):
                value = 1 + 0.2 * noise
            else:
                value = 0.5 * noise
        params[name] = value
    model.update(tree_unflatten(list(params.items())))
    mx.eval(model.parameters())
    return model


# DeepSeek's released names of the drafter, from the fork's.
_RELEASE = (
    (r"^dspark\.", "mtp."),
    (r"\.hc_head\.", ".hc_head_"),
    (r"\.(attn|ffn)_hc\.", r".hc_\1_"),
    (r"\.e_score_correction_bias$", ".bias"),
    (r"\.gate_proj\.", ".w1."),
    (r"\.down_proj\.", ".w2."),
    (r"\.up_proj\.", ".w3."),
)


def release_weights(model):
    import re

    out = {}
    for name, value in tree_flatten(model.parameters()):
        if name.startswith("dspark."):
            for old, new in _RELEASE:
                name = re.sub(old, new, name)
            if ".switch_mlp." in name:
                for e in range(value.shape[0]):
                    out[name.replace(".switch_mlp.", f".experts.{e}.")] = value[e]
                continue
            if name.endswith(".wo_a.weight"):
                value = value.reshape(-1, value.shape[-1])
        out[name] = value
    return out


def loaded(config, weights):
    model = deepseek_v4.Model(deepseek_v4.ModelArgs.from_dict(config))
    with contextlib.redirect_stdout(io.StringIO()) as out:
        model.load_weights(list(model.sanitize(weights).items()))
    return model, out.getvalue()


class TestDSparkWeights(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.model = make_model()
        cls.weights = release_weights(cls.model)

    def test_released_names_load_into_the_drafter(self):
        self.assertIn("mtp.0.main_proj.weight", self.weights)
        self.assertIn("mtp.2.markov_head.markov_w1.weight", self.weights)
        self.assertIn("mtp.2.hc_head_fn", self.weights)
        self.assertIn("mtp.1.ffn.experts.3.w2.weight", self.weights)
        model, said = loaded(WITH_DSPARK, self.weights)
        self.assertEqual(said, "")
        self.assertEqual(model.mtp, [])
        self.assertEqual(len(model.dspark), 3)
        expected = dict(tree_flatten(self.model.parameters()))
        got = dict(tree_flatten(model.parameters()))
        self.assertEqual(set(got), set(expected))
        for name, value in got.items():
            self.assertTrue(mx.array_equal(value, expected[name]), name)
        # Shapes as DeepSeek's: main_proj [D, 3D], the Markov tables [V,
        # rank], the confidence head [1, D + rank] with a bias.
        D, V, r = 32, 300, 8
        self.assertEqual(got["dspark.0.main_proj.weight"].shape, (D, 3 * D))
        self.assertEqual(got["dspark.2.markov_head.markov_w1.weight"].shape, (V, r))
        self.assertEqual(got["dspark.2.markov_head.markov_w2.weight"].shape, (V, r))
        self.assertEqual(got["dspark.2.confidence_head.proj.weight"].shape, (1, D + r))
        self.assertIn("dspark.2.confidence_head.proj.bias", got)
        self.assertNotIn("dspark.0.markov_head.markov_w1.weight", got)

    def test_loaded_only_where_asked_for(self):
        model, said = loaded(CONFIG, self.weights)
        self.assertEqual((model.mtp, model.dspark, said), ([], [], ""))
        self.assertFalse(
            any("dspark" in k for k, _ in tree_flatten(model.parameters()))
        )
        # A conversion that kept the drafter (this model's names).
        own = dict(tree_flatten(self.model.parameters()))
        model, said = loaded(CONFIG, own)
        self.assertEqual((model.dspark, said), ([], ""))
        model, said = loaded(WITH_DSPARK, own)
        self.assertEqual(len(model.dspark), 3)

    def test_mtp_weights_of_another_kind_say_so_in_one_line(self):
        target = {k: v for k, v in self.weights.items() if not k.startswith("mtp.")}
        other = {**target, "mtp.0.something.weight": mx.zeros((2, 2))}
        for config in (WITH_DSPARK, {**WITH_DSPARK, "dspark_target_layer_ids": None}):
            model, said = loaded(config, other)
            self.assertEqual((model.mtp, model.dspark), ([], []))
            self.assertEqual(len(said.strip().splitlines()), 1, said)
            self.assertIn("not a DeepSeek-V4 MTP block", said)
            self.assertIn("nor a DSpark drafter", said)
        # DSpark weights, a config without dspark_*: an MTP block is looked
        # for, and the line names what the weights are.
        config = {**WITH_DSPARK, "dspark_target_layer_ids": None}
        model, said = loaded(config, self.weights)
        self.assertEqual((model.mtp, model.dspark), ([], []))
        self.assertIn("DSpark drafter", said)
        self.assertEqual(len(said.strip().splitlines()), 1, said)


class Tap:
    """A layer that keeps its output streams."""

    def __init__(self, layer, out):
        self.layer, self.out = layer, out

    def __getattr__(self, name):
        return getattr(self.layer, name)

    def __call__(self, *args, **kwargs):
        h = self.layer(*args, **kwargs)
        self.out.append(h)
        return h


def reference_taps(model, tokens):
    """The target's streams after each layer, over ``tokens`` in one
    forward: the mean over the copies, concatenated for the configured
    target layers."""
    layers, outs = model.model.layers, []
    cache = model.make_cache()
    model.model.layers = [Tap(layer, outs) for layer in layers]
    try:
        model(tokens[None], cache=cache)
    finally:
        model.model.layers = layers
    ids = model.args.dspark_target_layer_ids
    return mx.concatenate([outs[i].mean(axis=2) for i in ids], axis=-1)


def rotate(x, positions, theta, dims, inverse=False):
    """Interleaved RoPE of the last ``dims`` channels of x [..., L, D] at
    ``positions`` [L], written out."""
    rest, r = x[..., : x.shape[-1] - dims], x[..., x.shape[-1] - dims :]
    pairs = r.reshape(*r.shape[:-1], dims // 2, 2)
    angles = positions[:, None] * theta ** (-mx.arange(0, dims, 2) / dims)
    angles = -angles if inverse else angles
    cos, sin = mx.cos(angles), mx.sin(angles)
    a, b = pairs[..., 0], pairs[..., 1]
    r = mx.stack([a * cos - b * sin, a * sin + b * cos], axis=-1).reshape(r.shape)
    return mx.concatenate([rest, r], axis=-1)


def reference_attention(attn, x, main_x, context_positions, block_positions, args):
    theta, dims = args.rope_theta, args.qk_rope_head_dim
    B, L, _ = x.shape
    q = attn.wq_b(attn.q_norm(attn.wq_a(x))).reshape(B, L, attn.n_heads, -1)
    q = mx.fast.rms_norm(q, None, attn.eps).transpose(0, 2, 1, 3)
    q = rotate(q, block_positions, theta, dims)
    ctx = rotate(attn.kv_norm(attn.wkv(main_x)), context_positions, theta, dims)
    own = rotate(attn.kv_norm(attn.wkv(x)), block_positions, theta, dims)
    keys = mx.concatenate([ctx, own], axis=1)[:, None]
    scores = (q @ keys.swapaxes(-1, -2)) * attn.scale
    sinks = mx.broadcast_to(attn.attn_sink[None, :, None, None], (*scores.shape[:3], 1))
    weights = mx.softmax(mx.concatenate([scores, sinks], axis=-1), axis=-1)
    out = weights[..., :-1] @ keys
    out = rotate(out, block_positions, theta, dims, inverse=True)
    out = out.transpose(0, 2, 1, 3).reshape(B, L, attn.o_groups, -1)
    out = mx.einsum("blgd,grd->blgr", out, attn.wo_a.weight)
    return attn.wo_b(out.reshape(B, L, -1))


def reference_step_logits(model, taps, anchor, prevs):
    """The drafter's step logits, written out: the block [anchor, noise x
    (block_size - 1)] after the context ``taps`` [1, T, 3D] (its last
    ``sliding_window`` positions), non-causal, then Markov on ``prevs``."""
    args = model.args
    T, W = taps.shape[1], args.sliding_window
    first, last = model.dspark[0], model.dspark[-1]
    main_x = first.main_norm(first.main_proj(taps[:, max(T - W, 0) :]))
    context_positions = mx.arange(max(T - W, 0), T).astype(mx.float32)
    size = args.dspark_block_size
    block = mx.array([[anchor] + [args.dspark_noise_token_id] * (size - 1)])
    block_positions = mx.arange(T, T + size).astype(mx.float32)
    e = model.model.embed_tokens(block)
    h = mx.broadcast_to(e[:, :, None], (1, size, args.hc_mult, e.shape[-1]))
    for stage in model.dspark:
        x, post, comb = stage.attn_hc.collapse(h)
        x = reference_attention(
            stage.attn,
            stage.attn_norm(x),
            main_x,
            context_positions,
            block_positions,
            args,
        )
        h = stage.attn_hc.expand(x, h, post, comb)
        x, post, comb = stage.ffn_hc.collapse(h)
        h = stage.ffn_hc.expand(stage.ffn(stage.ffn_norm(x), block), h, post, comb)
    base = model.lm_head(last.norm(last.hc_head(h)))[0]
    markov = last.markov_head
    steps = [anchor] + prevs[:-1]
    return [
        base[i] + markov.markov_w2(markov.markov_w1(mx.array(p)))
        for i, p in enumerate(steps)
    ]


class Recording(DSparkDrafter):
    """The drafter, recording each round's context length, anchor, step
    logits and drafts; its drafts are the right tokens (``tokens``) but
    after every fifth position, so rounds accept all, some or none."""

    def __init__(self, model, tokens, **kwargs):
        super().__init__(model, **kwargs)
        self.tokens, self.rounds = tokens, []

    def draft(self, y, num_draft, sample):
        offset, steps = self.context.offset, []

        def oracle(logits, context):
            token, logprobs = sample(logits, context)
            pos = offset + len(steps) + 1
            right = self.tokens[pos] if pos < len(self.tokens) else 0
            token = mx.array([right if pos % 5 else (right + 1) % 300], mx.uint32)
            steps.append((logits, token.item()))
            return token, logprobs

        drafts, logprobs = super().draft(y, num_draft, oracle)
        if steps:
            self.rounds.append((offset, y.item(), steps))
        return drafts, logprobs


def plain(model, prompt, max_tokens):
    return [t for t, _ in generate_step(prompt, model, max_tokens=max_tokens)]


class TestDSparkSpeculative(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.model = make_model()
        cls.expected = plain(cls.model, PROMPT, 40)
        cls.tokens = PROMPT.tolist() + cls.expected

    def spec(self, model=None, max_tokens=40, **kwargs):
        kwargs.setdefault("prefill_step_size", 16)
        steps = speculative_generate_step(
            PROMPT, model or self.model, mtp=True, max_tokens=max_tokens, **kwargs
        )
        return list(steps)

    def test_greedy_tokens_equal_plain_decoding(self):
        for k in (1, 3, 5, 8):
            with self.subTest(num_draft_tokens=k):
                steps = self.spec(num_draft_tokens=k)
                self.assertEqual([s[0] for s in steps], self.expected)

    def test_drafts_are_the_reference_computation(self):
        # Each round's step logits against the drafter written out in this
        # test over the target's states of one forward of the whole
        # sequence: the taps, the window, the positions, no mask in the
        # block, the Markov bias of the token before, and the context
        # extended by what the target kept.
        drafter = Recording(self.model, self.tokens)
        steps = self.spec(num_draft_tokens=5, drafter=drafter)
        self.assertEqual([s[0] for s in steps], self.expected)
        accepted = sum(s[2] for s in steps)
        self.assertGreater(accepted, 15)
        taps = reference_taps(self.model, mx.array(self.tokens))
        self.assertGreater(len(drafter.rounds), 5)
        for offset, anchor, round_steps in drafter.rounds:
            prevs = [t for _, t in round_steps]
            ref = reference_step_logits(self.model, taps[:, :offset], anchor, prevs)
            for i, (logits, _) in enumerate(round_steps):
                with self.subTest(context=offset, draft=i):
                    diff = (logits[0] - ref[i]).abs().max().item()
                    self.assertLess(diff, 1e-4)

    def test_a_prompt_cache_continues_in_step(self):
        # Saved and loaded between two requests, trimmed, then continued:
        # each is what plain decoding gives after the same tokens.
        cache = make_prompt_cache(self.model) + make_dspark_prompt_cache(self.model)
        first = self.spec(max_tokens=12, num_draft_tokens=4, prompt_cache=cache)
        self.assertEqual([s[0] for s in first], self.expected[:12])
        self.assertIsInstance(cache[-1], DSparkCache)
        self.assertEqual(cache[-1].size(), cache[0].size())
        with tempfile.TemporaryDirectory() as tmp:
            path = str(Path(tmp) / "cache.safetensors")
            save_prompt_cache(path, cache)
            cache = load_prompt_cache(path)
        self.assertIsInstance(cache[-1], DSparkCache)
        nxt = mx.array(self.expected[12:13])
        steps = speculative_generate_step(
            nxt, self.model, mtp=True, max_tokens=10, prompt_cache=cache
        )
        self.assertEqual([s[0] for s in steps], self.expected[13:23])
        # Drop 6 tokens and give them again.
        size = cache[0].size()
        self.assertEqual(trim_prompt_cache(cache, 6), 6)
        self.assertEqual(cache[-1].size(), size - 6)
        again = mx.array(self.tokens[size - 6 : size + 1])
        steps = speculative_generate_step(
            again, self.model, mtp=True, max_tokens=8, prompt_cache=cache
        )
        n = size + 1 - len(PROMPT)
        self.assertEqual([s[0] for s in steps], self.expected[n : n + 8])

    def test_trims_are_exact_or_refused(self):
        c = DSparkCache(window=4, history=3)
        rows = mx.arange(12.0).reshape(1, 1, 12, 1)
        c.push(rows[:, :, :5])
        self.assertEqual(c.max_trim, 5)
        c.push(rows[:, :, 5:12])
        # 7 rows held (window 4 + history 3) of 12: 3 can go.
        self.assertEqual((c.rows, c.max_trim), (7, 3))
        self.assertEqual(c.trim(4), 0)
        self.assertEqual(c.trim(2), 2)
        self.assertEqual(c.window_keys()[0, 0, :, 0].tolist(), [6.0, 7, 8, 9])
        self.assertEqual(c.max_trim, 1)

    def test_cache_graph_stays_bounded(self):
        def edges(a):
            f = io.StringIO()
            mx.export_to_dot(f, a)
            return f.getvalue().count("->")

        cache = make_prompt_cache(self.model) + make_dspark_prompt_cache(self.model)
        counts = []
        steps = speculative_generate_step(
            PROMPT, self.model, mtp=True, max_tokens=300, prompt_cache=cache
        )
        for i, _ in enumerate(steps):
            if i % 50 == 49:
                counts.append(edges(cache[-1].kv))
        self.assertEqual(len(counts), 6)
        self.assertLessEqual(max(counts), 8, counts)
        self.assertLessEqual(cache[-1].rows, 8 + cache[-1].history)

    def test_the_confidence_head_cuts_a_round(self):
        # Threshold 1: every round stops at its second draft (one drafted);
        # 0: none stops early.
        for threshold, most in ((1.0, 2), (0.0, 5)):
            drafter = DSparkDrafter(self.model, confidence=threshold)
            steps = self.spec(num_draft_tokens=5, drafter=drafter)
            self.assertEqual([s[0] for s in steps], self.expected)
            lengths = [len(c) for c in drafter.confidences if c]
            self.assertEqual(max(lengths), most)
            confidences = [c.item() for r in drafter.confidences for c in r]
            self.assertTrue(all(0.0 < c < 1.0 for c in confidences))


if __name__ == "__main__":
    unittest.main()
