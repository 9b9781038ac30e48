# Copyright © 2026 Apple Inc.

"""DeepSeek-V4's MTP block against an independent implementation: mlx-vlm
0.7.10's ``deepseek_v4_mtp`` drafter, on the same random weights loaded from
DeepSeek's released names and from MLX's converted ones.

The drafter is imported from the unpacked wheel (``MLX_VLM_SRC``, else
``build/mlx-vlm``); without it the check skips. ``tools/fork.py test``
unpacks it there (``fetch_mlx_vlm``, sha256-pinned); by hand:

    pip download --no-deps mlx-vlm==0.7.10 -d build
    python -m zipfile -e build/mlx_vlm-0.7.10-py3-none-any.whl build/mlx-vlm

``python checks/test_mtp_mlx_vlm.py --break NAME`` runs the check with the
block broken on purpose (NAME: one of ``BREAKS``); it must fail.
"""

import argparse
import contextlib
import importlib
import os
import re
import sys
import types
import unittest
from functools import partial
from pathlib import Path
from unittest import mock

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from mlx_lm.models import deepseek_v4

ROOT = Path(__file__).resolve().parent.parent
MLX_VLM = Path(os.environ.get("MLX_VLM_SRC", ROOT / "build" / "mlx-vlm"))

# Tiny, in DeepSeek's schema: two layers, then the block's entry (0: window
# only, as in Flash). The window is 8, so the steps go well past it.
CONFIG = {
    "model_type": "deepseek_v4",
    "vocab_size": 300,
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
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "index_n_heads": 8,
    "index_head_dim": 16,
    "index_topk": 8,
    "compress_ratios": [0, 4, 0],
    "num_hash_layers": 1,
    "rope_theta": 10000.0,
    "compress_rope_theta": 160000.0,
    "rope_scaling": {
        "type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "beta_fast": 32,
        "beta_slow": 1,
    },
    "max_position_embeddings": 256,
    "num_nextn_predict_layers": 1,
    "mtp": True,
}
# Positions the block reads per call: a prompt, single steps, a verify-sized
# chunk and a chunk longer than the window; 34 positions in all.
CHUNKS = (12, 1, 1, 1, 1, 3, 1, 1, 9, 1, 1, 1, 1)
TOLERANCE = 1e-4


def import_drafter():
    """mlx-vlm's drafter module from the unpacked wheel, or None. Only the
    packages on its import path are loaded (their ``__init__`` files pull
    in the whole of mlx-vlm); PIL, used by its image helpers only, is
    stubbed where it is not installed."""
    root = MLX_VLM / "mlx_vlm"
    if not (root / "speculative" / "drafters" / "deepseek_v4_mtp").is_dir():
        return None
    try:
        import PIL.Image  # noqa: F401
    except ImportError:
        pil = types.ModuleType("PIL")
        pil.Image = types.ModuleType("PIL.Image")
        sys.modules.update({"PIL": pil, "PIL.Image": pil.Image})
    for name in (
        "mlx_vlm",
        "mlx_vlm.models.deepseek_v4",
        "mlx_vlm.speculative",
        "mlx_vlm.speculative.drafters",
    ):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
            sys.modules[name] = package
    return importlib.import_module("mlx_vlm.speculative.drafters.deepseek_v4_mtp")


DRAFTER = import_drafter()


def random_model(seed=0):
    """A fork model whose every float parameter is random: norms around 1,
    matrices scaled by their fan-in, the rest (sinks, biases, hyper-connection
    bases and scales) around 0 or 1."""
    mx.random.seed(seed)
    model = deepseek_v4.Model(deepseek_v4.ModelArgs.from_dict(CONFIG))
    params = {}
    for name, value in tree_flatten(model.parameters()):
        if not mx.issubdtype(value.dtype, mx.floating):
            params[name] = value
            continue
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


# DeepSeek's released names of the block, from the fork's.
_RELEASE = (
    (r"\.hc_head\.", ".hc_head_"),
    (r"\.(attn|ffn)_hc\.", r".hc_\1_"),
    (r"\.e_score_correction_bias$", ".bias"),
    (r"\.gate_proj\.", ".w1."),
    (r"\.down_proj\.", ".w2."),
    (r"\.up_proj\.", ".w3."),
)


def release_layout(model):
    """The block as DeepSeek's checkpoint names it: one tensor per expert,
    ``wo_a`` one 2-D weight."""
    out = {}
    for name, value in tree_flatten(model.parameters()):
        if not name.startswith("mtp."):
            continue
        for old, new in _RELEASE:
            name = re.sub(old, new, name)
        if ".switch_mlp." in name:
            for e in range(value.shape[0]):
                out[name.replace(".switch_mlp.", f".experts.{e}.")] = value[e]
        elif name.endswith(".wo_a.weight"):
            out[name] = value.reshape(-1, value.shape[-1])
        else:
            out[name] = value
    return out


def mlx_layout(model):
    """The block as MLX conversions save it: the fork's module names."""
    return {k: v for k, v in tree_flatten(model.parameters()) if k.startswith("mtp.")}


def target_weights(model):
    return {k: v for k, v in tree_flatten(model.parameters()) if "mtp." not in k}


def fork_block(model, weights):
    """A fresh fork model loaded from the target's weights and ``weights``
    through the fork's own ``sanitize``."""
    fresh = deepseek_v4.Model(deepseek_v4.ModelArgs.from_dict(CONFIG))
    loaded = fresh.sanitize({**target_weights(model), **weights})
    fresh.load_weights(list(loaded.items()), strict=True)
    return fresh


_HC = ("attn_hc", "ffn_hc")


def mlx_vlm_names(weights):
    """The fork's names of the block mapped by hand onto mlx-vlm's module
    (``decoder.*`` holds the layer; inside it the names are the same)."""
    out = {}
    for name, value in weights.items():
        name = name.removeprefix("mtp.0.")
        if name.split(".")[0] in ("attn", "ffn", "attn_norm", "ffn_norm", *_HC):
            name = f"decoder.{name}"
        out[name] = value
    return out


def mlx_vlm_drafter(target, weights, own_sanitize):
    """mlx-vlm's drafter bound to ``target`` (embedding and head), loaded
    from ``weights`` through its own sanitize or by the fork-names map."""
    config = DRAFTER.ModelConfig.from_dict({"text_config": CONFIG})
    drafter = DRAFTER.Model(config)
    weights = drafter.sanitize(weights) if own_sanitize else mlx_vlm_names(weights)
    drafter.load_weights(list(weights.items()), strict=True)
    drafter.reset(target)
    return drafter


def compare(layout):
    """The largest differences of the block's logits and streams between the
    fork and mlx-vlm over every call of ``CHUNKS``, both loaded from
    ``layout`` ('release' or 'mlx')."""
    ref = random_model()
    tokens = mx.random.randint(0, CONFIG["vocab_size"], (1, sum(CHUNKS) + 1))
    _, hidden = ref(tokens[:, :-1], return_hidden=True)
    weights = release_layout(ref) if layout == "release" else mlx_layout(ref)
    fork = fork_block(ref, weights)
    drafter = mlx_vlm_drafter(fork, weights, own_sanitize=layout == "release")
    cache = fork.make_mtp_cache()
    logit_diff = stream_diff = 0.0
    start = 0
    for n in CHUNKS:
        h, nxt = hidden[:, start : start + n], tokens[:, start + 1 : start + n + 1]
        logits, streams = fork.mtp_draft(h, nxt, cache)
        out, ref_streams = drafter._forward_tokens(nxt, h, mx.int32)
        ref_logits = drafter._lm_head_fn(out)
        logit_diff = max(logit_diff, (logits - ref_logits).abs().max().item())
        stream_diff = max(stream_diff, (streams - ref_streams).abs().max().item())
        start += n
    return logit_diff, stream_diff


def kept_round(reread):
    """The largest difference between the logits mlx-vlm's drafter gives
    after a round whose 3 drafts are all kept and the fork's block over the
    whole sequence at once (every position from the target's streams, as
    DeepSeek trains it). mlx-vlm keeps the cache entries its block wrote
    from its own streams for kept drafts; with ``reread`` they are trimmed
    first and read again from the target's, as the fork's loop does."""
    ref = random_model()
    weights = mlx_layout(ref)
    fork = fork_block(ref, weights)
    drafter = mlx_vlm_drafter(fork, weights, own_sanitize=False)
    seen, seed = {}, drafter._set_seed_from_hidden

    def capture(hidden, sampler, greedy):
        seen["logits"] = drafter._lm_head_fn(hidden)
        return seed(hidden, sampler, greedy)

    drafter._set_seed_from_hidden = capture
    prompt, k, bonus = 12, 3, 7
    tokens = mx.random.randint(0, CONFIG["vocab_size"], (1, prompt + 1))
    _, hidden = fork(tokens[:, :-1], return_hidden=True)
    last = tokens[0, prompt].item()
    greedy = partial(mx.argmax, axis=-1)
    drafter.prefill_from_target_hidden(
        tokens[:, :-1], hidden, last, greedy, greedy=True
    )
    drafts = drafter.draft_block(last, None, None, k + 1, greedy, greedy=True)
    drafts = drafts.reshape(1, -1).astype(tokens.dtype)
    tokens = mx.concatenate([tokens, drafts, mx.array([[bonus]])], axis=1)
    _, hidden = fork(tokens[:, :-1], return_hidden=True)
    if reread:
        for c in drafter._cache:
            c.trim(drafter._round_appended)
        drafter._next_position -= drafter._round_appended
        drafter._round_appended = 0
    verify = hidden[:, prompt : prompt + k + 1]
    drafter.accept_verified_tokens(verify, drafts, k, [bonus], greedy, greedy=True)
    logits, _ = fork.mtp_draft(hidden, tokens[:, 1:], fork.make_mtp_cache())
    return (seen["logits"][0, -1] - logits[0, -1]).abs().max().item()


@unittest.skipIf(DRAFTER is None, f"mlx-vlm 0.7.10 not unpacked in {MLX_VLM}")
class TestMTPBlockAgainstMLXVLM(unittest.TestCase):
    def test_release_names(self):
        # Each side maps DeepSeek's names with its own sanitize.
        logits, streams = compare("release")
        self.assertLess(logits, TOLERANCE)
        self.assertLess(streams, TOLERANCE)

    def test_mlx_names(self):
        logits, streams = compare("mlx")
        self.assertLess(logits, TOLERANCE)
        self.assertLess(streams, TOLERANCE)

    def test_kept_drafts_read_again_from_the_target_streams(self):
        # Where they differ on purpose: mlx-vlm's block keeps what it read
        # from its own streams at kept drafts; the fork's reads the target's
        # there, and so is the block DeepSeek trains.
        self.assertLess(kept_round(reread=True), TOLERANCE)
        self.assertGreater(kept_round(reread=False), 0.1)


def _block_call(embed, hidden):
    """MTPBlock.__call__ with its embedding and streams inputs replaced."""

    def call(self, h, embeds, input_ids, cache, rows):
        e = embed(self, embeds)[:, :, None]
        h = hidden(self, h)
        h = deepseek_v4.DecoderLayer.__call__(self, e + h, input_ids, cache, rows)
        return self.norm(self.hc_head(h)), h

    return mock.patch.object(deepseek_v4.MTPBlock, "__call__", call)


def _late_positions():
    """Model.mtp_draft rotating the block's tokens one position late from
    its second call on, as if it took the target's offset (one ahead of its
    own cache, which has not read the last position). A constant shift would
    not show: the queries, the keys and the output's inverse rotation all
    move with it."""
    original, rope = deepseek_v4.Model.mtp_draft, deepseek_v4._rope

    def draft(self, hidden, inputs, cache):
        if cache[0].offset == 0:
            return original(self, hidden, inputs, cache)

        def late(x, freqs, offset, scale=1.0):
            return rope(x, freqs, offset + 1, scale)

        with mock.patch.object(deepseek_v4, "_rope", late):
            return original(self, hidden, inputs, cache)

    return mock.patch.object(deepseek_v4.Model, "mtp_draft", draft)


def _frozen_cache():
    def make(self):
        caches = original(self)
        for c in caches:
            c._advance = lambda rows: None
        return caches

    original = deepseek_v4.Model.make_mtp_cache
    return mock.patch.object(deepseek_v4.Model, "make_mtp_cache", make)


# The block broken on purpose, each of which the check must catch.
BREAKS = {
    # The target's streams averaged before hnorm (one stream, not each).
    "hnorm-mean-stream": lambda: _block_call(
        lambda b, e: b.e_proj(b.enorm(e)),
        lambda b, h: mx.broadcast_to(
            b.h_proj(b.hnorm(h.mean(axis=2, keepdims=True))), h.shape
        ),
    ),
    # The embedding added without its projection.
    "no-e_proj": lambda: _block_call(
        lambda b, e: b.enorm(e),
        lambda b, h: b.h_proj(b.hnorm(h)),
    ),
    # The block's positions one late after its first call.
    "late-positions": _late_positions,
    # The block's cache never moves on: every call writes position 0 on.
    "cache-not-advanced": _frozen_cache,
}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--break", dest="broken", choices=sorted(BREAKS))
    args, rest = parser.parse_known_args()
    if DRAFTER is None:
        sys.exit(f"mlx-vlm 0.7.10 is not unpacked in {MLX_VLM}")
    with BREAKS[args.broken]() if args.broken else contextlib.nullcontext():
        for layout in ("release", "mlx"):
            logits, streams = compare(layout)
            print(f"{layout} names: logits {logits:.3g}, streams {streams:.3g}")
        unittest.main(argv=[sys.argv[0], *rest])
