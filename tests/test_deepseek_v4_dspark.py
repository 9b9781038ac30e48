# Copyright © 2026 Apple Inc.

import contextlib
import io
import json
import re
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import mlx.core as mx
from host_syncs import HostSyncs
from mlx.utils import tree_flatten, tree_unflatten

from mlx_lm.generate import (
    BatchGenerator,
    batch_generate,
    generate_step,
    make_drafter,
    speculative_generate_step,
    stream_generate,
)
from mlx_lm.models import deepseek_v4
from mlx_lm.models.cache import (
    load_prompt_cache,
    make_prompt_cache,
    save_prompt_cache,
    trim_prompt_cache,
)
from mlx_lm.models.deepseek_v4_dspark import DSparkDrafter
from mlx_lm.models.dspark_cache import DSparkCache
from mlx_lm.utils import load

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
    """The drafter, recording each round's rows (context length, anchor,
    step logits, drafts) and acceptance; row b drafts its sequence's right
    tokens (the one of ``sequences`` that holds its anchor at its position)
    but after every fifth position, so rows accept all, some or none."""

    def __init__(self, model, sequences, **kwargs):
        super().__init__(model, **kwargs)
        self.sequences, self.rounds, self.accepted = sequences, [], []

    def _sequence(self, offset, anchor):
        found = [s for s in self.sequences if offset < len(s) and s[offset] == anchor]
        return found[0] if found else None

    def draft(self, cache, inputs, num_draft, sample):
        offsets, anchors = list(cache[0].offsets), inputs.tolist()
        rows = [self._sequence(o, y) for o, y in zip(offsets, anchors)]
        steps = []

        def oracle(logits, tokens):
            _, logprobs = sample(logits, tokens)
            right = []
            for o, seq in zip(offsets, rows):
                pos = o + len(steps) + 1
                r = seq[pos] if seq is not None and pos < len(seq) else 0
                right.append(r if pos % 5 else (r + 1) % 300)
            steps.append((logits, right))
            return mx.array(right, mx.uint32), logprobs

        drafts, logprobs = super().draft(cache, inputs, num_draft, oracle)
        self.num_draft = drafts.shape[1]
        if steps:
            self.rounds.append((offsets, anchors, rows, steps))
        return drafts, logprobs

    def trim(self, cache, counts):
        self.accepted.append([self.num_draft - c for c in counts])
        super().trim(cache, counts)


def plain(model, prompt, max_tokens):
    return [t for t, _ in generate_step(prompt, model, max_tokens=max_tokens)]


class TestDSparkSpeculative(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.model = make_model()
        cls.expected = plain(cls.model, PROMPT, 40)
        cls.tokens = PROMPT.tolist() + cls.expected
        cls.taps = {}

    def spec(self, prompt=PROMPT, max_tokens=40, **kwargs):
        kwargs.setdefault("prefill_step_size", 16)
        steps = speculative_generate_step(
            prompt, self.model, mtp=True, max_tokens=max_tokens, **kwargs
        )
        return list(steps)

    def assert_reference(self, drafter):
        """Every row's step logits of every round against the drafter
        written out in this test over the target's states of one forward of
        the row's whole sequence: the taps, the window, the positions, no
        mask in the block, the Markov bias of the token before, and the
        context extended by what the target kept. Returns the rounds."""
        checked = 0
        for offsets, anchors, rows, steps in drafter.rounds:
            for b, (offset, anchor, seq) in enumerate(zip(offsets, anchors, rows)):
                if seq is None or offset == 0:
                    continue
                key = tuple(seq)
                if key not in self.taps:
                    self.taps[key] = reference_taps(self.model, mx.array(seq))
                prevs = [right[b] for _, right in steps]
                taps = self.taps[key][:, :offset]
                ref = reference_step_logits(self.model, taps, anchor, prevs)
                for i, (logits, _) in enumerate(steps):
                    with self.subTest(row=b, context=offset, draft=i):
                        diff = (logits[b] - ref[i]).abs().max().item()
                        self.assertLess(diff, 1e-4)
                checked += 1
        return checked

    def test_greedy_tokens_equal_plain_decoding(self):
        self.assertIsInstance(make_drafter(self.model), DSparkDrafter)
        for k in (1, 3, 5, 8):
            with self.subTest(num_draft_tokens=k):
                steps = self.spec(num_draft_tokens=k)
                self.assertEqual([s[0] for s in steps], self.expected)

    def test_drafts_are_the_reference_computation(self):
        drafter = Recording(self.model, [self.tokens])
        steps = self.spec(num_draft_tokens=5, drafter=drafter)
        self.assertEqual([s[0] for s in steps], self.expected)
        self.assertGreater(sum(s[2] for s in steps), 15)
        self.assertGreater(self.assert_reference(drafter), 5)

    def test_batch_rows_accept_their_own_counts(self):
        # Rows of different lengths (one of a single token), each decoding
        # what it decodes alone; each row's drafts are the reference's of
        # its own context, which extends by its own count.
        prompts = [PROMPT.tolist()[:n] for n in (30, 7, 1, 18)]
        expected = [plain(self.model, mx.array(p), 24) for p in prompts]
        drafter = Recording(self.model, [p + e for p, e in zip(prompts, expected)])
        generator = BatchGenerator(
            self.model,
            drafter=drafter,
            num_draft_tokens=4,
            prefill_step_size=8,
            stop_tokens=set(),
        )
        uids = generator.insert(prompts, max_tokens=[24] * 4)
        got = {u: [] for u in uids}
        while responses := generator.next_generated():
            for r in responses:
                got[r.uid].append(r.token)
                if r.finish_reason is not None:
                    # A finished row's cache: its drafter entry in step.
                    self.assertEqual(
                        r.prompt_cache[-1].size(), r.prompt_cache[0].size()
                    )
        generator.close()
        self.assertEqual([got[u] for u in uids], expected)
        self.assertTrue(any(len(set(a)) > 1 for a in drafter.accepted))
        self.assertGreater(sum(map(sum, drafter.accepted)), 20)
        self.assertGreater(self.assert_reference(drafter), 20)

    def test_a_round_syncs_the_host_once(self):
        # The round's tokens and accepted counts in one fetch, one row or a
        # batch; the context's extension starts before it.
        with HostSyncs() as syncs:
            steps = speculative_generate_step(
                PROMPT, self.model, mtp=True, num_draft_tokens=4, max_tokens=30
            )
            counts = syncs.rounds(steps)
        self.assertGreater(len(counts), 5)
        self.assertEqual(counts, [1] * len(counts))
        generator = BatchGenerator(
            self.model, mtp=True, num_draft_tokens=4, stop_tokens=set()
        )
        prompts = [PROMPT.tolist()[:n] for n in (30, 7, 1)]
        generator.insert(prompts, max_tokens=[100] * 3)
        with HostSyncs() as syncs:
            counts = syncs.batch_rounds(generator, 3, 6)
        generator.close()
        self.assertEqual(counts, [1] * 6)

    def test_a_prompt_cache_continues_in_step(self):
        # Saved and loaded between two requests, trimmed, then continued:
        # each is what plain decoding gives after the same tokens. A cache
        # without the drafter's entry is refused with how to make one.
        with self.assertRaisesRegex(ValueError, "in step.* make_drafter"):
            self.spec(prompt_cache=make_prompt_cache(self.model))
        cache = make_prompt_cache(self.model) + make_drafter(self.model).make_cache()
        first = self.spec(max_tokens=12, num_draft_tokens=4, prompt_cache=cache)
        self.assertEqual([s[0] for s in first], self.expected[:12])
        self.assertIsInstance(cache[-1], DSparkCache)
        self.assertEqual(cache[-1].size(), cache[0].size())
        with tempfile.TemporaryDirectory() as tmp:
            path = str(Path(tmp) / "cache.safetensors")
            save_prompt_cache(path, cache)
            cache = load_prompt_cache(path)
        self.assertIsInstance(cache[-1], DSparkCache)
        steps = self.spec(mx.array(self.expected[12:13]), 10, prompt_cache=cache)
        self.assertEqual([s[0] for s in steps], self.expected[13:23])
        # Drop 6 tokens and give them again.
        size = cache[0].size()
        self.assertEqual(trim_prompt_cache(cache, 6), 6)
        self.assertEqual(cache[-1].size(), size - 6)
        again = mx.array(self.tokens[size - 6 : size + 1])
        steps = self.spec(again, 8, prompt_cache=cache)
        n = size + 1 - len(PROMPT)
        self.assertEqual([s[0] for s in steps], self.expected[n : n + 8])

    def test_a_batch_cache_round_trips_mid_decode(self):
        prompts = [PROMPT.tolist(), PROMPT.tolist()[:9]]
        generator = BatchGenerator(self.model, mtp=True, stop_tokens=set())
        generator.insert(prompts, max_tokens=[30, 30])
        for _ in range(4):
            generator.next_generated()
        batch = generator._generation_batch
        with tempfile.TemporaryDirectory() as tmp:
            path = str(Path(tmp) / "cache.safetensors")
            save_prompt_cache(path, batch.prompt_cache)
            loaded = load_prompt_cache(path)
        saved = batch.prompt_cache[-1]
        for field in ("offsets", "valid", "row_max_trim", "window", "history"):
            self.assertEqual(getattr(loaded[-1], field), getattr(saved, field))
        self.assertTrue(mx.array_equal(loaded[-1].kv, saved.kv))
        # Row 0 taken out of the loaded batch continues alone.
        cache = [c.extract(0) for c in loaded]
        k = cache[0].size() - len(PROMPT)
        nxt = batch._next_tokens[0].item()
        generator.close()
        self.assertEqual(nxt, self.expected[k])
        steps = self.spec(mx.array([nxt]), 8, prompt_cache=cache)
        self.assertEqual([s[0] for s in steps], self.expected[k + 1 : k + 9])

    def test_trims_are_exact_or_refused(self):
        c = DSparkCache(window=4, history=3)
        rows = mx.arange(12.0).reshape(1, 1, 12, 1)
        c.push(rows[:, :, :5])
        self.assertEqual(c.max_trim, 5)
        c.push(rows[:, :, 5:12])
        # 7 positions held (window 4 + history 3) of 12: 3 can go.
        self.assertEqual((c.rows, c.max_trim), (7, 3))
        self.assertEqual(c.trim(4), 0)
        self.assertEqual(c.trim(2), 2)
        self.assertEqual(c.window_keys()[0][0, 0, :, 0].tolist(), [6.0, 7, 8, 9])
        self.assertEqual(c.max_trim, 1)
        # Rows of their own lengths, each trimmed by its own count.
        b = DSparkCache.merge([c, DSparkCache(window=4, history=3)])
        b.push(mx.arange(6.0).reshape(1, 2, 3, 1) + 20, [1, 3])
        self.assertEqual((b.offsets, b.row_max_trim), ([11, 3], [2, 3]))
        keys, mask = b.window_keys()
        self.assertEqual(mask.tolist(), [[True] * 4, [False, True, True, True]])
        self.assertEqual(keys[0, :, 1:, 0].tolist(), [[8, 9, 20], [23, 24, 25]])
        self.assertFalse(b.trim_rows([3, 0]))
        self.assertTrue(b.trim_rows([2, 1]))
        self.assertEqual(b.extract(1).window_keys()[0][0, 0, :, 0].tolist(), [23, 24])

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


# transformers' config (the tokenizer's load reads it) knows ratios 0, 4, 128.
FOLDER_CONFIG = {**CONFIG, "compress_ratios": [0, 4, 128, 4, 0, 0, 0]}


def make_folder(path, config=FOLDER_CONFIG):
    """A tiny 0731-shaped checkpoint folder: the target in this model's
    names, the drafter in DeepSeek's (``mtp.0..2``), a byte-level BPE
    tokenizer."""
    from test_deepseek_v4 import SPECIAL_TOKENS as special_tokens
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    path.mkdir(parents=True)
    model = make_model({**config, "mtp": True})
    # Zero logits for BOS and EOS, so greedy decoding runs to the limit.
    model.lm_head.weight[:2] = 0.0
    mx.save_safetensors(str(path / "model.safetensors"), release_weights(model))
    (path / "config.json").write_text(json.dumps(config))
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config["vocab_size"] - 1,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(
        ["The quick brown fox jumps over the dog."] * 8, trainer
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=special_tokens[0],
        eos_token=special_tokens[1],
    )
    fast.save_pretrained(path)
    return path


class TestDSparkCommands(unittest.TestCase):

    def test_generate_with_mtp_drafts_with_dspark(self):
        prompt = "The quick brown fox"
        with tempfile.TemporaryDirectory() as tmp:
            path = make_folder(Path(tmp) / "0731")
            model, tokenizer = load(str(path), model_config={"mtp": True})
            self.assertEqual((len(model.dspark), model.mtp), (3, []))
            texts = [
                "".join(
                    r.text
                    for r in stream_generate(
                        model, tokenizer, prompt, max_tokens=20, mtp=mtp
                    )
                )
                for mtp in (False, True)
            ]
            self.assertEqual(texts[0], texts[1])
            prompts = [tokenizer.encode(p) for p in (prompt, "Hello", "A b c d e")]
            out = [
                batch_generate(model, tokenizer, prompts, max_tokens=12, mtp=mtp).texts
                for mtp in (False, True)
            ]
            self.assertEqual(out[0], out[1])
            cmd = [sys.executable, "-m", "mlx_lm", "generate", "--model", str(path)]
            cmd += ["--prompt", prompt, "--max-tokens", "20", "--ignore-chat-template"]
            run = subprocess.run(
                cmd + ["--mtp", "--num-draft-tokens", "3"],
                capture_output=True,
                text=True,
                timeout=300,
            )
            self.assertEqual(run.returncode, 0, run.stderr)
            self.assertIn(texts[0], run.stdout)


if __name__ == "__main__":
    unittest.main()
