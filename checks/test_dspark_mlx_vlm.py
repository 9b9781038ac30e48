# Copyright © 2026 Apple Inc.

"""DeepSeek-V4-Flash-0731's DSpark drafter against an independent
implementation: mlx-vlm 0.7.10's ``deepseek_v4_dspark`` drafter, on the same
random weights, each side loading DeepSeek's released names (``mtp.0..2``)
through its own sanitize.

Compared, round after round as the context grows (accepted positions of 1
to 5 tokens): the block's base logits over [anchor, noise x 4], the Markov
step logits of each draft and the greedy drafts. The drafter is imported
from the unpacked wheel (``MLX_VLM_SRC``, else ``build/mlx-vlm``); without
it the check skips (unpacking: see checks/test_mtp_mlx_vlm.py).

Where the two differ on purpose: the context window. DeepSeek's reference
attends to the last ``sliding_window`` context positions; mlx-vlm's
``RotatingKVCache`` returns ``window - 1 + L`` rows when L > 1 positions are
added past a full window, so after such a round its block also sees up to
L - 1 older positions (``test_window_past_a_multi_row_round``).
"""

import importlib
import os
import re
import sys
import types
import unittest
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from mlx_lm.models import deepseek_v4
from mlx_lm.models.deepseek_v4_dspark import dspark_block, dspark_context

ROOT = Path(__file__).resolve().parent.parent
MLX_VLM = Path(os.environ.get("MLX_VLM_SRC", ROOT / "build" / "mlx-vlm"))

# 0731-shaped and tiny: four layers (the taps the last three), then one
# window-only entry per DSpark stage.
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
    "sliding_window": 16,
    "moe_intermediate_size": 16,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "index_n_heads": 8,
    "index_head_dim": 16,
    "index_topk": 8,
    "compress_ratios": [0, 4, 16, 4, 0, 0, 0],
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
    "max_position_embeddings": 512,
    "num_nextn_predict_layers": 1,
    "dspark_block_size": 5,
    "dspark_noise_token_id": 299,
    "dspark_target_layer_ids": [1, 2, 3],
    "dspark_markov_rank": 8,
    "mtp": True,
}
# The context each round adds (the first: the prompt); within the window of
# 16 the rounds add up to 5 positions, past it one at a time.
ROUNDS = (10, 1, 3, 2) + (1,) * 12
TOLERANCE = 1e-4


def import_drafter():
    root = MLX_VLM / "mlx_vlm"
    if not (root / "speculative" / "drafters" / "deepseek_v4_dspark").is_dir():
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
    try:
        return importlib.import_module(
            "mlx_vlm.speculative.drafters.deepseek_v4_dspark"
        )
    except ImportError:
        return None


DRAFTER = import_drafter()


def random_model(seed=0):
    """A fork model with its DSpark drafter, every float parameter random."""
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


_RELEASE = (
    (r"^dspark\.", "mtp."),
    (r"\.hc_head\.", ".hc_head_"),
    (r"\.(attn|ffn)_hc\.", r".hc_\1_"),
    (r"\.e_score_correction_bias$", ".bias"),
    (r"\.gate_proj\.", ".w1."),
    (r"\.down_proj\.", ".w2."),
    (r"\.up_proj\.", ".w3."),
)


def release_layout(model):
    """The drafter as DeepSeek's checkpoint names it (``mtp.0..2``)."""
    out = {}
    for name, value in tree_flatten(model.parameters()):
        if not name.startswith("dspark."):
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


def target_weights(model):
    return {k: v for k, v in tree_flatten(model.parameters()) if "dspark." not in k}


def fork_model(ref):
    fresh = deepseek_v4.Model(deepseek_v4.ModelArgs.from_dict(CONFIG))
    weights = fresh.sanitize({**target_weights(ref), **release_layout(ref)})
    fresh.load_weights(list(weights.items()), strict=True)
    return fresh


def mlx_vlm_drafter(target, weights):
    config = DRAFTER.ModelConfig.from_dict(
        {
            # mlx-vlm's config takes ratios 0, 4 and 128 only; its stages
            # are window-only whatever the target's layers are.
            "text_config": {**CONFIG, "compress_ratios": [0] * 7},
            "n_mtp_layers": 3,
            "target_layer_ids": CONFIG["dspark_target_layer_ids"],
            "mask_token_id": CONFIG["dspark_noise_token_id"],
            "markov_rank": CONFIG["dspark_markov_rank"],
            "block_size": CONFIG["dspark_block_size"] + 1,
        }
    )
    drafter = DRAFTER.Model(config)
    drafter.load_weights(list(drafter.sanitize(weights).items()), strict=True)
    cache = drafter.reset(target)
    return drafter, cache


def rounds(sizes=ROUNDS, seed=1):
    """Per round: the largest differences of the block's base logits and of
    the Markov step logits, and whether the greedy drafts agree."""
    ref = random_model()
    fork = fork_model(ref)
    weights = release_layout(ref)
    # One mlx-vlm drafter gives the base logits, the other the drafts; both
    # read the same context.
    base_side, base_cache = mlx_vlm_drafter(fork, weights)
    draft_side, draft_cache = mlx_vlm_drafter(fork, weights)
    mx.random.seed(seed)
    total = sum(sizes)
    tokens = mx.random.randint(0, CONFIG["vocab_size"] - 1, (1, total + 1))
    _, taps = fork(tokens[:, :-1], return_hidden=True)
    context = dspark_context(fork, taps, 0)
    noise = CONFIG["dspark_noise_token_id"]
    block_size = CONFIG["dspark_block_size"]
    markov = fork.dspark[-1].markov_head
    window = CONFIG["sliding_window"]
    out, start = [], 0
    for n in sizes:
        start += n
        anchor = tokens[0, start].item()
        block = mx.array([[anchor] + [noise] * (block_size - 1)])
        keys = context[:, :, max(start - window, 0) : start]
        base, _ = dspark_block(fork, block, keys, start)
        hidden = taps[:, start - n : start]
        ref_base = base_side._logits(base_side._hidden(block, hidden, base_cache))
        greedy = lambda x: mx.argmax(x, axis=-1)
        ref_drafts = draft_side.draft_block(
            anchor, hidden, draft_cache, block_size + 1, greedy
        )[0].tolist()
        drafts, step_diff, prev = [], 0.0, mx.array([anchor])
        for i in range(block_size):
            logits = base[0, i : i + 1] + markov(prev)[0]
            ref_step = draft_side.markov_head.apply_step_logits(ref_base[:, i], prev)
            step_diff = max(step_diff, (logits - ref_step).abs().max().item())
            prev = mx.argmax(logits, axis=-1)
            drafts.append(prev.item())
        base_diff = (base - ref_base).abs().max().item()
        out.append((start, n, base_diff, step_diff, drafts == ref_drafts))
    return out


@unittest.skipIf(DRAFTER is None, f"mlx-vlm 0.7.10 not unpacked in {MLX_VLM}")
class TestDSparkAgainstMLXVLM(unittest.TestCase):
    def test_block_logits_markov_steps_and_drafts(self):
        results = rounds()
        for start, n, base_diff, step_diff, same in results:
            with self.subTest(context=start, added=n):
                self.assertLess(base_diff, TOLERANCE)
                self.assertLess(step_diff, TOLERANCE)
                self.assertTrue(same)
        # Rounds past the window, where the context slides.
        self.assertGreater(results[-1][0], 2 * CONFIG["sliding_window"] - 8)

    def test_window_past_a_multi_row_round(self):
        # The window of 16 full, then a round of 4 more: mlx-vlm's block
        # sees 19 context rows, the reference (and the fork) the last 16.
        # A first chunk longer than the window differs the same way.
        results = rounds(sizes=(14, 1, 1, 1, 4))
        for start, n, base_diff, _, _ in results[:-1]:
            self.assertLess(base_diff, TOLERANCE, (start, n))
        self.assertGreater(results[-1][2], 1e-3)
        self.assertGreater(rounds(sizes=(18,))[0][2], 1e-3)


if __name__ == "__main__":
    if DRAFTER is None:
        sys.exit(f"mlx-vlm 0.7.10 is not unpacked in {MLX_VLM}")
    for start, n, base_diff, step_diff, same in rounds():
        print(
            f"context {start:3d} (+{n}): base logits {base_diff:.3g}, "
            f"markov steps {step_diff:.3g}, drafts equal {same}"
        )
    unittest.main()
