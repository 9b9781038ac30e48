# Copyright © 2026 Apple Inc.
"""What a speculative verify costs DeepSeek-V4, and what drafting buys.

Random weights at Flash's per-layer sizes (``--tiny``: the demo's widths),
the model built as benchmarks/dsv4_speed.py builds it, with its MTP block.
After a ``--context``-token prompt it prints:

- verify: the time and the primitives of one forward over L tokens
  (L = ``--lengths``) against one token's, the lengths alternated in one
  process, each forward trimmed after and the cache one token further each
  round (so the forwards fall at every offset of the compression windows);
  primitives are the mean over 8 consecutive offsets; ``--without`` times it
  again with parts cut out (the compressors' pooling, the indexer's top-k,
  the routed experts of all but the first token, the attention), each
  alternated with the whole forward, to find what grows with L;
- rounds (``--rounds``): ``speculative_generate_step``'s round with the MTP
  block at each ``--mtp-k`` (a list) drafts (random weights: nothing is
  accepted, so each round gives one token) against a plain ``generate_step``
  step; with ``--dspark`` also its round with the DSpark drafter (a second
  model: the same target weights, three random DSpark stages, taps after the
  last three layers, as V4-Flash-0731) at each ``--dspark-blocks`` drafts,
  through the same loop (``mtp=True`` picks ``DSparkDrafter``); with
  ``--peer`` also mlx-vlm 0.7.10's rounds on the same weights
  (``_mtp_rounds`` with its ``deepseek_v4_mtp`` drafter, ``_dflash_rounds``
  with its ``deepseek_v4_dspark`` drafter, over its ``LanguageModel`` and
  cache, prefilled as its ``generate_step`` prefills) and its plain step
  (the pipelined greedy loop of its ``generate_step``, on its model), all
  alternated in one process; ``--hc-ab`` runs each of ours twice, with the
  hyper-connection kernels (``MLX_LM_HC_KERNELS=1``'s path) and with the
  ops, alternated, each against its own plain step; ``--attention-from
  PATH`` likewise with ``Attention._dense`` of another deepseek_v4.py (a
  parent commit's, staged by ``tools/fork.py stage``), which ``--exactness``
  then measures too;
- batch (``--batch B``): a ``BatchGenerator``'s round with the MTP block
  at the first ``--mtp-k`` drafts a row over B rows against a plain batched
  step;
- batch oracle (``--batch B --oracle``): a ``BatchGenerator``'s tok/s over B
  rows with batch oracle drafters (MTP k=2 at the published acceptance, with
  ``--dspark`` DSpark block 5, and a block of 5 without drafter compute), each
  row drawing its own accepted count a round, against plain batched decoding;
- oracle (``--oracle``): greedy tok/s of the loop with drafters that propose
  the target's own greedy tokens (a plain run's) with a wrong one where the
  published acceptance says: MTP at k=2 accepted 70% then 29% per position
  (vLLM's V4-Flash figures; the MTP block runs, its tokens replaced), and a
  block of 5 drafts of mean accepted length ``--block-mean`` (DSpark's
  figure, read as tokens a round: no drafter compute, then with three
  stand-in stages over the block), against plain decoding, alternated ``--repeat`` times;
  the loop's tokens are checked against the plain run's (``--oracle-truth
  self``: the oracle proposes the loop's own greedy tokens, which in bf16
  can differ from plain's, each run's fed back until it repeats).
  ``--oracle-sets``
  picks the rows: ``published`` (MTP k=1..3 at 70% / 29% / 12% per
  position, the third extrapolated; with ``--dspark`` the real DSpark
  drafter at block 5, mean ``--block-mean``), ``rejected`` (the same
  drafters with every draft wrong: a round's cost with nothing accepted,
  alternated with the rounds that accept), ``standin`` (the block of 5
  without drafter compute and with the stand-in stages), ``trained`` (the
  per-position acceptance of the tiny drafters trained by
  dsv4_dspark_train.py: DSpark at blocks 2..5 with the real drafter, MTP at
  k=2..5 with the real block);
- exactness (``--exactness``): the largest logit difference between a
  forward over 8 tokens and 8 one-token steps, float32 and bfloat16 on the
  same weights, and how often their argmax differs;
- greedy guarantee (``--greedy-guarantee``): over 4 prompts, where greedy
  speculative decoding (oracle drafters at the published acceptance: MTP
  k=2, with ``--dspark`` DSpark block 5) first differs from plain greedy
  decoding, and plain's logit margin there against that largest difference.

    python benchmarks/dsv4_verify.py --layers 43 --tiny --dtype float32
    python benchmarks/dsv4_verify.py --layers 43 --tiny --dtype float32 \\
        --rounds --oracle --exactness
    python benchmarks/dsv4_verify.py --layers 43 --tiny --dtype float32 \\
        --rounds --dspark --oracle --tokens 32 --repeat 5
    python benchmarks/dsv4_verify.py --layers 43 --tiny --dtype float32 \\
        --no-verify --rounds --dspark --peer --tokens 32 --repeat 5
    python benchmarks/dsv4_verify.py --layers 43 --tiny --dtype float32 \\
        --no-verify --batch 4
    python benchmarks/dsv4_verify.py --layers 43 --experts 8    # on a GPU

``--peer`` needs mlx-vlm 0.7.10's unpacked ``mlx_vlm`` on the path
(PYTHONPATH); mlx-vlm's MTP drafter has a window-only layer, so with
``--peer`` the fork's MTP block is window-only too (``--mtp-ratio 0``).
"""

import argparse
import contextlib
import io
import random
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from mlx_lm.models.drafters import Drafter

sys.path.insert(0, str(Path(__file__).parent))
from dsv4_speed import (  # noqa: E402
    OVERRIDES,
    Driver,
    device_name,
    forward_fn,
    import_peer,
    make_config,
    make_fork,
    make_peer,
    quantize,
    random_weights,
)
from long_decode import cache_arrays  # noqa: E402


def build(args, dtype=None):
    config = make_config(args)
    # The MTP block after the layers (--mtp-ratio: 4, a CSA layer; 0,
    # window-only as mlx-vlm's drafter builds it).
    config["num_nextn_predict_layers"] = 1
    config["mtp"] = True
    config["compress_ratios"] = config["compress_ratios"] + [args.mtp_ratio]
    model = make_fork(config, dtype=getattr(mx, dtype or args.dtype), seed=args.seed)
    return config, model


def dspark_config(args, config):
    """V4-Flash-0731's layout: three window-only DSpark stages after the
    layers, the taps after the last three target layers."""
    layers = config["num_hidden_layers"]
    return {
        **config,
        "compress_ratios": config["compress_ratios"][:layers] + [0, 0, 0],
        "dspark_block_size": 5,
        "dspark_noise_token_id": config["vocab_size"] - 1,
        "dspark_target_layer_ids": [layers - 3, layers - 2, layers - 1],
        "dspark_markov_rank": args.markov_rank,
    }


def build_dspark(args, config, model):
    """The target of ``model`` (its arrays, shared) with a random DSpark
    drafter in place of the MTP block."""
    from mlx_lm.models.deepseek_v4 import Model, ModelArgs

    dconfig = dspark_config(args, config)
    dmodel = Model(ModelArgs.from_dict(dconfig))

    class Stages:
        # random_weights over the drafter's parameters only.
        def __init__(self):
            self.args, self.cast_predicate = dmodel.args, dmodel.cast_predicate

        def parameters(self):
            return {"dspark": dmodel.parameters()["dspark"]}

    dtype = getattr(mx, args.dtype)
    weights = random_weights(Stages(), dtype, args.seed + 7)
    weights += [
        (k, v) for k, v in tree_flatten(model.parameters()) if not k.startswith("mtp.")
    ]
    dmodel.update(tree_unflatten(weights))
    mx.eval(dmodel.parameters())
    # For inference, as load() leaves it: in training mode the hyper-connections
    # run the Sinkhorn loop of ops in place of its kernel (CUDA, Metal).
    dmodel.eval()
    return dconfig, dmodel


def prefill(model, prompt, step=2048):
    cache = model.make_cache()
    for i in range(0, prompt.size, step):
        model(prompt[None, i : i + step], cache)
        mx.eval(cache_arrays(cache))
    return cache


def primitives(model, cache, tokens):
    out = model(tokens, cache)
    f = io.StringIO()
    mx.export_to_dot(f, out, *cache_arrays(cache))
    mx.eval(out, cache_arrays(cache))
    return f.getvalue().count("shape=rectangle")


def cuts():
    """--without: parts of the forward cut out (its output is then wrong),
    to find what grows with L: name -> [(owner, attribute, replacement)]."""
    from mlx_lm.models import deepseek_v4 as v4

    windows, indexer, moe = v4.WindowRows.windows, v4.Indexer.__call__, v4.MoE.__call__

    def no_pools(self, sizes):
        return windows(self, sizes)[0], 0, None, None

    def no_top_k(self, x, qr, cache, rows):
        indexer(self, x, qr, cache, rows)
        return None

    def first_row_experts(self, x, input_ids):
        return mx.broadcast_to(moe(self, x[:, :1], input_ids[:, :1]), x.shape)

    return {
        "pools": [(v4.WindowRows, "windows", no_pools)],
        "top-k": [(v4.Indexer, "__call__", no_top_k)],
        "experts": [(v4.MoE, "__call__", first_row_experts)],
        "attention": [(v4.Attention, "__call__", lambda self, x, *a: x * 0)],
    }


def verify(args, config, model):
    from unittest import mock

    from mlx_lm.models.cache import trim_prompt_cache

    lengths = [int(n) for n in args.lengths.split(",")]
    vocab = config["vocab_size"]
    mx.random.seed(args.seed)
    prompt = mx.random.randint(0, vocab, (args.context,)).astype(mx.int32)
    cache = prefill(model, prompt)
    one = mx.array([[1]], mx.int32)
    prims = {n: [] for n in lengths}
    for _ in range(8):
        for n in lengths:
            prims[n].append(primitives(model, cache, mx.ones((1, n), mx.int32)))
            trim_prompt_cache(cache, n)
        mx.eval(model(one, cache))
    parts = cuts()
    variants = {"": []}
    for name in args.without.split(",") if args.without else []:
        variants[f"without {name}"] = parts[name]
    times = {(v, n): [] for v in variants for n in lengths}
    for r in range(args.verify_rounds + 2):
        for v, patches in variants.items():
            with contextlib.ExitStack() as stack:
                for owner, name, fn in patches:
                    stack.enter_context(mock.patch.object(owner, name, fn))
                for n in lengths:
                    tokens = mx.random.randint(0, vocab, (1, n)).astype(mx.int32)
                    mx.eval(tokens)
                    tic = time.perf_counter()
                    mx.eval(model(tokens, cache))
                    if r >= 2:
                        times[v, n].append(time.perf_counter() - tic)
                    trim_prompt_cache(cache, n)
        mx.eval(model(one, cache))
    t1, p1 = statistics.median(times["", 1]), statistics.mean(prims[1])
    print(
        f"verify after {args.context} tokens, medians of {args.verify_rounds} "
        "alternated forwards (time) and means over 8 offsets (primitives):"
    )
    print(f"{'L':>3} {'ms':>9} {'x one':>7} {'primitives':>11} {'x one':>7}")
    for n in lengths:
        t, p = statistics.median(times["", n]), statistics.mean(prims[n])
        print(f"{n:>3} {t * 1e3:>9.2f} {t / t1:>7.2f} {p:>11.0f} {p / p1:>7.2f}")
    if len(variants) > 1:
        print(
            "ms over L tokens less ms over one, the forward whole and with a part cut:"
        )
        print(f"{'':20}" + "".join(f"{'L=' + str(n):>9}" for n in lengths[1:]))
        for v in variants:
            one_t = statistics.median(times[v, lengths[0]])
            cells = "".join(
                f"{(statistics.median(times[v, n]) - one_t) * 1e3:>9.1f}"
                for n in lengths[1:]
            )
            print(f"{v or 'whole':20}{cells}")


class OracleDrafter(Drafter):
    """A ``Drafter`` (one row) proposing the target's greedy tokens ``greedy``
    (a plain run's), the first ``accepted()`` of a round right, the next
    wrong. With ``inner`` (an MTPDrafter) the inner drafter runs as it would
    and its tokens are replaced, so a round costs what its compute costs."""

    def __init__(self, greedy, accepted, vocab, inner=None, work=None):
        self.greedy, self.accepted, self.vocab = greedy, accepted, vocab
        self.inner = inner
        # A drafter's compute to pay for each round (the drafts wait on it).
        self.work = work
        self.return_hidden = inner.return_hidden if inner else None
        self.pos = 0

    def make_cache(self):
        return self.inner.make_cache() if self.inner else []

    def prefill(self, cache, tokens, hidden, lengths):
        if self.inner:
            self.inner.prefill(cache, tokens, hidden, lengths)

    def draft(self, cache, inputs, num_draft, sample):
        if self.inner:
            drafted, _ = self.inner.draft(cache, inputs, num_draft, sample)
            num_draft = drafted.shape[1]
        drafts = self.greedy[self.pos : self.pos + num_draft]
        drafts = drafts + [0] * (num_draft - len(drafts))
        right = self.accepted()
        if right < num_draft:
            drafts[right] = (drafts[right] + 1) % self.vocab
        drafts = mx.array([drafts], mx.uint32)
        if self.work is not None:
            drafts = mx.depends(drafts, self.work(num_draft))
        if self.inner:
            self.inner._drafts = drafts
        return drafts, None

    def accept(self, cache, accepted, hidden, tokens):
        self.num_draft = tokens.shape[1] - 1
        if self.inner:
            self.inner.accept(cache, accepted, hidden, tokens)

    def trim(self, cache, counts):
        self.pos += self.num_draft - counts[0] + 1
        if self.inner:
            self.inner.trim(cache, counts)

    def finish(self, cache):
        if self.inner:
            self.inner.finish(cache)


class BatchOracleDrafter(OracleDrafter):
    """``OracleDrafter`` over B rows: row e proposes ``greedy[e]`` (a plain
    batched run's), right up to its own ``accepted[e]()``, so rows accept
    different counts in one round."""

    def __init__(self, greedy, accepted, vocab, inner=None):
        super().__init__(greedy, accepted, vocab, inner)
        self.pos = [0] * len(greedy)
        # The batch loop always asks the target for hidden states.
        self.return_hidden = inner.return_hidden if inner else True

    def draft(self, cache, inputs, num_draft, sample):
        if self.inner:
            drafted, _ = self.inner.draft(cache, inputs, num_draft, sample)
            num_draft = drafted.shape[1]
        rows = []
        for e, (greedy, accepted) in enumerate(zip(self.greedy, self.accepted)):
            row = greedy[self.pos[e] : self.pos[e] + num_draft]
            row = row + [0] * (num_draft - len(row))
            right = accepted()
            if right < num_draft:
                row[right] = (row[right] + 1) % self.vocab
            rows.append(row)
        drafts = mx.array(rows, mx.uint32).reshape(len(rows), num_draft)
        if self.inner:
            self.inner._drafts = drafts
        return drafts, None

    def trim(self, cache, counts):
        self.pos = [p + self.num_draft - c + 1 for p, c in zip(self.pos, counts)]
        if self.inner:
            self.inner.trim(cache, counts)


def per_position(rates, rng):
    """Accepted drafts with P(accepted >= i) = rates[i - 1]."""

    def accepted():
        u = rng.random()
        return sum(u < r for r in rates)

    return accepted


def geometric(block, mean, rng):
    """Accepted drafts of a block of ``block``, each kept with the same
    probability given the one before was, for ``mean`` tokens a round (the
    accepted drafts and the target's own)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        a = (lo + hi) / 2
        lo, hi = (a, hi) if sum(a**i for i in range(block + 1)) < mean else (lo, a)

    def accepted():
        n = 0
        while n < block and rng.random() < a:
            n += 1
        return n

    return accepted, a


def ends_round(item):
    """Whether a loop's item ends a round: a token the target gave, not one
    of the drafter's (``generate_step`` gives only those)."""
    return not (len(item) > 2 and item[2])


def run(steps):
    """tok/s from the first token on, the tokens, and the time of a round
    (a round ends with a token the target gave, not the drafter)."""
    tokens, rounds, tic = [], 0, None
    for n, item in enumerate(steps):
        if n == 0:
            tic = time.perf_counter()
        else:
            rounds += ends_round(item)
        tokens.append(int(item[0]))
    elapsed = time.perf_counter() - tic
    return (len(tokens) - 1) / elapsed, tokens, elapsed / max(rounds, 1)


def ints(text):
    return [int(n) for n in str(text).split(",") if n]


# Per-position acceptance P(accepted >= i) of the tiny drafters trained by
# benchmarks/dsv4_dspark_train.py (docs/benchmarks.md, "DSpark acceptance,
# trained tiny model"): the differences of their mean accepted lengths at
# k = 1..5 drafts (the first k drafts of a round are the same at every k),
# which give 2.24 / 2.71 / 3.16 / 3.62 (DSpark) and 2.05 / 2.40 / 2.46 /
# 2.48 (MTP) tokens a target forward at 2 / 3 / 4 / 5 drafts. The script
# writes no file of them; these are its printed table.
TRAINED_MEAN_ACCEPTED = {
    "DSpark": (0.675, 1.239, 1.705, 2.164, 2.623),
    "MTP": (0.654, 1.050, 1.402, 1.462, 1.481),
}


def trained_rates(name, k):
    means = (0.0,) + TRAINED_MEAN_ACCEPTED[name]
    return tuple(round(means[i] - means[i - 1], 3) for i in range(1, k + 1))


# MTP's published acceptance: vLLM's V4-Flash figures, 70% then 29% (k=2);
# the third position extrapolated (0.29 * 0.29 / 0.70), not published.
MTP_RATES = (0.70, 0.29, 0.12)


def import_mlx_vlm_speculative():
    """mlx-vlm's DeepSeek-V4 MTP and DSpark drafter modules and its MTP and
    DFlash round loops (``speculative/mtp.py``, ``speculative/dflash.py``),
    under empty parent packages as dsv4_speed's ``import_peer`` imports its
    model (their ``__init__`` files import the whole of mlx-vlm)."""
    import importlib
    import types

    try:
        import PIL.Image  # noqa: F401
    except ImportError:
        # Used by mlx-vlm's image helpers only.
        pil = types.ModuleType("PIL")
        pil.Image = types.ModuleType("PIL.Image")
        sys.modules.update({"PIL": pil, "PIL.Image": pil.Image})
    import_peer()
    root = Path(sys.modules["mlx_vlm"].__path__[0])
    for name in ("mlx_vlm.speculative", "mlx_vlm.speculative.drafters"):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
            sys.modules[name] = package
    drafters = "mlx_vlm.speculative.drafters."
    return types.SimpleNamespace(
        mtp_drafter=importlib.import_module(drafters + "deepseek_v4_mtp"),
        dspark_drafter=importlib.import_module(drafters + "deepseek_v4_dspark"),
        mtp=importlib.import_module("mlx_vlm.speculative.mtp"),
        dflash=importlib.import_module("mlx_vlm.speculative.dflash"),
        common=importlib.import_module("mlx_vlm.speculative.common"),
    )


class Peer:
    """mlx-vlm 0.7.10 on the fork's arrays: its ``LanguageModel`` holding
    the target's weights, its MTP drafter loaded from the fork's MTP block
    (the fork's names mapped onto its modules, checks/test_mtp_mlx_vlm.py's
    map) and its DSpark drafter from the fork's stages under DeepSeek's
    released names through its own sanitize (checks/test_dspark_mlx_vlm.py's
    layout)."""

    def __init__(self, config, model, dconfig=None, dmodel=None):
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "checks"))
        from test_dspark_mlx_vlm import release_layout
        from test_mtp_mlx_vlm import mlx_layout, mlx_vlm_names

        self.vlm = vlm = import_mlx_vlm_speculative()
        layers = config["num_hidden_layers"]
        if config["compress_ratios"][layers] != 0:
            raise SystemExit(
                "--peer: mlx-vlm's MTP layer is window-only (--mtp-ratio 0)"
            )
        target = {**config, "compress_ratios": config["compress_ratios"][:layers]}
        weights = [
            (k, v) for k, v in tree_flatten(model.parameters()) if "mtp." not in k
        ]
        # Exact top-k: mlx-vlm's HISA selection past 1,024 entries.
        self.model = make_peer(target, weights, exact_indexer=True)
        mx.eval(self.model.parameters())
        conf = vlm.mtp_drafter.ModelConfig.from_dict({"text_config": config})
        self.mtp = vlm.mtp_drafter.Model(conf)
        mtp = mlx_vlm_names(mlx_layout(model))
        self.mtp.load_weights(list(mtp.items()), strict=True)
        self.dspark = None
        if dmodel is not None:
            dconf = vlm.dspark_drafter.ModelConfig.from_dict(
                {
                    "text_config": target,
                    "n_mtp_layers": 3,
                    "target_layer_ids": dconfig["dspark_target_layer_ids"],
                    "mask_token_id": dconfig["dspark_noise_token_id"],
                    "markov_rank": dconfig["dspark_markov_rank"],
                    "block_size": dconfig["dspark_block_size"] + 1,
                }
            )
            self.dspark = vlm.dspark_drafter.Model(dconf)
            stages = self.dspark.sanitize(release_layout(dmodel))
            self.dspark.load_weights(list(stages.items()), strict=True)
        mx.eval(self.mtp.parameters(), self.dspark and self.dspark.parameters())
        self.stream = vlm.common.generation_stream

    def _prefill(self, prompt, **capture):
        """Its ``generate_step``'s prefill: the prompt but the last token in
        one chunk (its default step is 2,048), the cache evaluated, then the
        last token, each with the drafter's capture arguments (DSpark: the
        taps of both, concatenated)."""
        cache = self.model.make_cache()
        chunk = capture.get("capture_layer_ids") and capture
        with mx.stream(self.stream):
            out = self.model(prompt[None, :-1], cache=cache, **(chunk or {}))
            mx.eval([c.state for c in cache], out.hidden_states or [])
            last = self.model(prompt[None, -1:], cache=cache, **capture)
            y = mx.argmax(last.logits[:, -1], axis=-1)
        mx.eval(y)
        if chunk:
            last.hidden_states = [
                mx.concatenate(parts, axis=1)
                for parts in zip(out.hidden_states, last.hidden_states)
            ]
        return cache, last, y.item()

    def round_time(self, kind, prompt, drafts, tokens):
        """The seconds of one round of its loop (the first token, sampled
        after the prefill, not counted) and the tokens a round."""
        greedy = lambda x: mx.argmax(x, axis=-1)  # noqa: E731
        if kind == "mtp":
            drafter = self.mtp
            capture = dict(return_hidden=True, return_shared_kv=True)
            cache, last, first = self._prefill(prompt, **capture)
            # As its run_speculative_rounds does for one row.
            self.vlm.mtp._buffer_mtp_target_cache(cache, drafter, drafts + 1)
            steps = self.vlm.mtp._mtp_rounds(
                self.model,
                drafter,
                cache,
                last.hidden_states[-1],
                last.shared_kv_states,
                prompt_tokens=prompt[None, -1:],
                first_bonus=first,
                max_tokens=tokens,
                sampler=greedy,
                draft_block_size=drafts + 1,
                token_dtype=mx.int32,
                greedy_sampling=True,
            )
        else:
            drafter = self.dspark
            ids = list(drafter.config.target_layer_ids)
            cache, last, first = self._prefill(prompt, capture_layer_ids=ids)
            steps = self.vlm.dflash._dflash_rounds(
                self.model,
                drafter,
                cache,
                mx.concatenate(last.hidden_states, axis=-1),
                first_bonus=first,
                max_tokens=tokens,
                sampler=greedy,
                draft_block_size=drafts + 1,
                token_dtype=mx.int32,
                greedy_sampling=True,
            )
        tic, n = time.perf_counter(), 0
        for _ in steps:
            n += 1
        elapsed = time.perf_counter() - tic
        rounds = len(drafter.accept_lens)
        drafted = getattr(drafter, "draft_lens", None)
        if drafted and (drafted[0] != drafts or max(drafted) != drafts):
            # Its loop shortens the last rounds to the tokens left, as ours.
            print(f"warning: mlx-vlm's {kind} rounds drafted {drafted}")
        return elapsed / max(rounds, 1), n / max(rounds, 1)


def one_at_a_time(model, prompt, n):
    """Seconds a plain step with no pipelining after ``prompt``: each token
    evaluated before the next step is built (generate_step overlaps them)."""
    cache, y = prefill(model, prompt[:-1]), prompt[None, -1:]
    mx.eval(model(y, cache))
    tic = time.perf_counter()
    for _ in range(n):
        y = model(y, cache)[:, -1:].argmax(-1)
        mx.eval(y)
    return (time.perf_counter() - tic) / n


def plain_step(model, prompt, n):
    """Seconds a ``generate_step`` step after ``prompt`` over ``n`` tokens."""
    from mlx_lm.generate import generate_step

    return run(generate_step(prompt, model, max_tokens=n))[2]


def drafting_round(model, prompt, k, n):
    """Seconds a round of ``speculative_generate_step(mtp=True)`` with ``k``
    drafts after ``prompt`` over ``n`` tokens, and the tokens a round."""
    from mlx_lm.generate import speculative_generate_step

    steps = speculative_generate_step(
        prompt, model, mtp=True, num_draft_tokens=k, max_tokens=n
    )
    rate, _, seconds = run(steps)
    return seconds, rate * seconds


def driver_step(model, peer, prompt, tokens):
    """A pipelined greedy step of ``model`` through dsv4_speed's ``Driver``
    (``generate_step``'s loop; mlx-vlm's plain decoding is the same loop)."""
    driver = Driver("", model, forward_fn(model, peer), 2048)
    cache, y = driver.prefill(prompt)
    tic = time.perf_counter()
    driver.decode(y, cache, tokens)
    return (time.perf_counter() - tic) / (tokens + 1)


HC_KERNELS = "HC kernels: "
OTHER_ATTENTION = "other attention: "


def hc_kernels(on):
    """The hyper-connection kernels (MLX_LM_HC_KERNELS=1's path) or the ops."""
    from mlx_lm.models import deepseek_v4

    deepseek_v4._HC_KERNELS = on


def attention_from(path):
    """A switch between our ``Attention._dense`` and the one of another
    deepseek_v4.py (a parent commit's, written by ``tools/fork.py stage``),
    loaded beside ours as a module of the same package."""
    import importlib.util

    from mlx_lm.models import deepseek_v4

    spec = importlib.util.spec_from_file_location(
        "mlx_lm.models._deepseek_v4_other", path
    )
    other = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(other)
    ours, theirs = deepseek_v4.Attention._dense, other.Attention._dense

    def switch(on):
        deepseek_v4.Attention._dense = theirs if on else ours

    return switch


def flag_switch(name):
    """A switch that flips deepseek_v4's module flag ``name`` (a trial's
    A/B switch) from its value."""
    from mlx_lm.models import deepseek_v4

    value = getattr(deepseek_v4, name)

    def switch(on):
        setattr(deepseek_v4, name, (not value) if on else value)

    return switch


def alternated(variants, prefix, switch):
    """Each variant of ours twice, alternated: as it is and, under
    ``prefix``, with ``switch(True)`` in force."""

    def use(fn, on):
        def call(n):
            switch(on)
            return fn(n)

        return call

    out = {}
    for name, fn in variants.items():
        out[name] = use(fn, False)
        if not name.startswith("mlx-vlm"):
            out[prefix + name] = use(fn, True)
    return out


def rounds(args, config, model, dmodel=None, peer=None):
    mx.random.seed(args.seed + 1)
    prompt = mx.random.randint(0, config["vocab_size"], (args.context,))
    prompt = prompt.astype(mx.int32)

    def spec(target, k):
        return lambda n: drafting_round(target, prompt, k, n)

    variants = {
        "plain step (generate_step)": lambda n: (plain_step(model, prompt, n), 1.0)
    }
    variants["plain step, one at a time"] = lambda n: (
        one_at_a_time(model, prompt, n // 2),
        1.0,
    )
    for k in ints(args.mtp_k):
        variants[f"MTP round, k={k}"] = spec(model, k)
    if dmodel is not None:
        for b in ints(args.dspark_blocks):
            variants[f"DSpark round, block {b}"] = spec(dmodel, b)
    if peer is not None:
        variants["ours: plain step, Driver loop"] = lambda n: (
            driver_step(model, False, prompt, n),
            1.0,
        )
        variants["mlx-vlm: plain step, Driver loop"] = lambda n: (
            driver_step(peer.model, True, prompt, n),
            1.0,
        )
        for k in ints(args.mtp_k):
            variants[f"mlx-vlm: MTP round, k={k}"] = lambda n, k=k: peer.round_time(
                "mtp", prompt, k, n
            )
        if peer.dspark is not None:
            for b in ints(args.dspark_blocks):
                variants[f"mlx-vlm: DSpark round, block {b}"] = (
                    lambda n, b=b: peer.round_time("dspark", prompt, b, n)
                )
    prefix, switch = "", None
    if args.hc_ab:
        prefix, switch = HC_KERNELS, hc_kernels
    elif args.attention_from:
        prefix, switch = OTHER_ATTENTION, attention_from(args.attention_from)
    elif args.flag_ab:
        prefix, switch = f"{args.flag_ab} flipped: ", flag_switch(args.flag_ab)
    if switch:
        variants = alternated(variants, prefix, switch)
    times = {name: [] for name in variants}
    per = {name: [] for name in variants}
    # The first of each warms up (compiled steps of every forward's length).
    for r in range(args.repeat + 1):
        for name, fn in variants.items():
            t, tokens_a_round = fn(args.tokens if r else 16)
            if r:
                times[name].append(t)
                per[name].append(tokens_a_round)
    if switch:
        # What follows runs as the variants without the prefix did.
        switch(False)
    # Issue 41's bars, in plain steps.
    bars = {"MTP round, k=2": 1.2, "DSpark round, block 5": 1.25}
    print(
        f"rounds after {args.context} tokens, {args.tokens} tokens a run, "
        f"medians of {args.repeat} alternated runs (random drafters: nothing "
        "accepted, a round is its cost); 'x step': of the plain step "
        "(generate_step), 'x one': of a step one at a time; ratios of "
        "medians, and the range of the run-by-run ratios:"
    )
    width = max(34, *map(len, variants))
    print(
        f"{'':{width}} {'ms':>8} {'x step':>7} {'(range)':>13} {'x one':>6} "
        f"{'tok/round':>9} {'bar':>5}"
    )
    for name in variants:
        # Against the plain steps of the same variant (--hc-ab, --attention-from).
        own = prefix if prefix and name.startswith(prefix) else ""
        plain_runs = times[own + "plain step (generate_step)"]
        step = statistics.median(plain_runs)
        one = statistics.median(times[own + "plain step, one at a time"])
        t = statistics.median(times[name])
        ratios = [a / b for a, b in zip(times[name], plain_runs)]
        span = f"{min(ratios):.2f}-{max(ratios):.2f}"
        base = name.removeprefix(own)
        bar = f"{bars[base]:g}" if base in bars else ""
        print(
            f"{name:{width}} {t * 1e3:>8.1f} {t / step:>7.2f} {span:>13} "
            f"{t / one:>6.2f} {statistics.mean(per[name]):>9.2f} {bar:>5}"
        )
    if peer is not None:
        pairs = [("plain step, Driver loop", "plain step, Driver loop")]
        pairs += [(f"MTP round, k={k}", f"MTP round, k={k}") for k in ints(args.mtp_k)]
        if peer.dspark is not None:
            pairs += [
                (f"DSpark round, block {b}", f"DSpark round, block {b}")
                for b in ints(args.dspark_blocks)
            ]
        print("ours / mlx-vlm's, the same alternated runs (median of run ratios):")
        for name, _ in pairs:
            mine = times.get(name, times.get(f"ours: {name}"))
            theirs = times[f"mlx-vlm: {name}"]
            ratio = statistics.median(a / b for a, b in zip(mine, theirs))
            print(f"ours/mlx-vlm {name:32} {ratio:.2f}")


def batch_rounds(args, config, model):
    """--batch B: a BatchGenerator's round with the MTP block at --mtp-k
    drafts a row, B rows after --context-token prompts (random weights:
    about one token a row a round), against a plain BatchGenerator's step,
    alternated --repeat times, --tokens rounds (steps) each."""
    from mlx_lm.generate import BatchGenerator

    mx.random.seed(args.seed + 4)
    vocab, B = config["vocab_size"], args.batch
    k = int(args.mtp_k.split(",")[0])
    prompts = [mx.random.randint(0, vocab, (args.context,)).tolist() for _ in range(B)]

    def per_round(mtp, rounds):
        kwargs = {"mtp": True, "num_draft_tokens": k} if mtp else {}
        generator = BatchGenerator(model, stop_tokens=set(), **kwargs)
        max_tokens = (rounds + 2) * (k + 1)
        generator.insert(prompts, max_tokens=[max_tokens] * B)
        while len(generator._generation_batch) < B:
            generator.next()
        batch = generator._generation_batch
        batch.next()
        tic, tokens = time.perf_counter(), 0
        for _ in range(rounds):
            tokens += len(batch.next())
        elapsed = time.perf_counter() - tic
        generator.close()
        return elapsed / rounds, tokens / rounds / B

    times = {False: [], True: []}
    per_row = []
    # The first of each warms up (compiled steps of every forward's length).
    for r in range(args.repeat + 1):
        for mtp in (False, True):
            t, n = per_round(mtp, args.tokens if r else 4)
            if r:
                times[mtp].append(t)
                per_row += [n] if mtp else []
    step, round_ = (statistics.median(times[m]) for m in (False, True))
    print(
        f"batch of {B} after {args.context} tokens, medians of {args.repeat}: "
        f"plain batched step {step * 1e3:.1f} ms; MTP round at k={k} "
        f"{round_ * 1e3:.1f} ms = {round_ / step:.2f} plain steps "
        f"({statistics.mean(per_row):.2f} tokens a row a round)"
    )


def batch_oracle(args, config, model, dmodel=None):
    """--batch B --oracle: a BatchGenerator's tok/s over B rows (all rows'
    tokens) with batch oracle drafters at the published acceptance, each row
    drawing its own accepted count (rows disagree), against the plain
    BatchGenerator, alternated --repeat times, --tokens rounds (steps) each;
    every row's tokens checked against the plain run's."""
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.models.deepseek_v4_dspark import DSparkDrafter
    from mlx_lm.models.mtp_drafter import MTPDrafter

    mx.random.seed(args.seed + 5)
    vocab, B = config["vocab_size"], args.batch
    prompts = [mx.random.randint(0, vocab, (args.context,)).tolist() for _ in range(B)]
    # name: (target, drafts a round, acceptance of a row, inner drafter,
    # tokens a round)
    drafters = {"plain": None}
    rates = MTP_RATES[:2]
    label = "/".join(f"{r * 100:.0f}" for r in rates)
    drafters[f"MTP k=2, {label}%"] = (
        model,
        2,
        lambda rng: per_position(rates, rng),
        MTPDrafter,
        1 + sum(rates),
    )

    def block(rng):
        return geometric(5, args.block_mean, rng)[0]

    if dmodel is not None:
        drafters[f"DSpark block 5, mean {args.block_mean:g}"] = (
            dmodel,
            5,
            block,
            DSparkDrafter,
            args.block_mean,
        )
    drafters[f"block 5, mean {args.block_mean:g}, no drafter"] = (
        model,
        5,
        block,
        None,
        args.block_mean,
    )

    def generate(target, rounds, drafter=None, k=0):
        kwargs = {"drafter": drafter, "num_draft_tokens": k} if drafter else {}
        generator = BatchGenerator(target, stop_tokens=set(), **kwargs)
        # Enough that no row stops within the rounds timed.
        generator.insert(prompts, max_tokens=[(rounds + 2) * (k + 1)] * B)
        while len(generator._generation_batch) < B:
            generator.next()
        batch = generator._generation_batch
        tic = time.perf_counter()
        for _ in range(rounds):
            batch.next()
        elapsed = time.perf_counter() - tic
        tokens = [list(t)[args.context :] for t in batch.tokens]
        generator.close()
        return elapsed, tokens

    greedy = {}
    for target in {id(s[0]): s[0] for s in drafters.values() if s}.values():
        _, greedy[id(target)] = generate(target, args.tokens * 6)

    def once(name, seed, rounds, truth=None):
        spec = drafters[name]
        if spec is None:
            elapsed, tokens = generate(model, rounds)
            return elapsed, tokens, greedy[id(model)]
        target, k, make, inner, _ = spec
        truth = truth or greedy[id(target)]
        accepted = [make(random.Random(seed * 131 + e)) for e in range(B)]
        inner = inner(target) if inner else None
        drafter = BatchOracleDrafter(truth, accepted, vocab, inner)
        elapsed, tokens = generate(target, rounds, drafter, k)
        return elapsed, tokens, truth

    for name in drafters:
        # Warm up: the compiled steps of every forward's length.
        once(name, -1, 4)
    # --oracle-truth self: each row's own tokens fed back until they repeat
    # (a verify can round to another token than plain batched steps); the
    # tail past a run's tokens stays plain's, for the last round's drafts.
    truths = {}
    if args.oracle_truth == "self":
        for name, spec in drafters.items():
            for r in range(args.repeat) if spec else ():
                truth = greedy[id(spec[0])]
                for _ in range(4):
                    _, tokens, _ = once(name, r, args.tokens, truth)
                    fed = [t + w[len(t) :] for t, w in zip(tokens, truth)]
                    if fed == truth:
                        break
                    truth = fed
                    print(f"  {name}, run {r}: own tokens fed back", flush=True)
                truths[name, r] = truth
    rate = {name: [] for name in drafters}
    # Each run is args.tokens rounds, so runs' times compare as rounds'.
    run_time = {name: [] for name in drafters}
    mismatch = {name: 0 for name in drafters}
    per_row = {name: [] for name in drafters}
    for r in range(args.repeat):
        for name in drafters:
            elapsed, tokens, truth = once(name, r, args.tokens, truths.get((name, r)))
            n = [len(t) for t in tokens]
            rate[name].append(sum(n) / elapsed)
            run_time[name].append(elapsed)
            # Each run as it ends: a run cut by a time limit keeps the rest.
            print(f"  {name}, run {r}: {rate[name][-1]:.2f} tok/s", flush=True)
            per_row[name].append([x / args.tokens for x in n])
            mismatch[name] += sum(
                a != b for row, want in zip(tokens, truth) for a, b in zip(row, want)
            )
            mismatch[name] += sum(len(t) > len(w) for t, w in zip(tokens, truth))
    print(
        f"batch oracle, {B} rows after {args.context} tokens, {args.tokens} "
        f"rounds a run, medians of {args.repeat} alternated runs (min-max); "
        "tok/s of all rows; 'at the mean': the expected tokens a round over "
        "the measured round time (in plain steps):"
    )
    print(
        f"{'':28} {'tok/s':>8} {'x plain':>16} "
        f"{'tokens a round, by row':>28} {'round/step':>11} {'at the mean':>12} "
        f"{'!= ' + args.oracle_truth:>9}"
    )
    for name in drafters:
        ratios = sorted(x / y for x, y in zip(rate[name], rate["plain"]))
        rows = [statistics.mean(col) for col in zip(*per_row[name])]
        mean = drafters[name][4] if drafters[name] else 1.0
        cost = statistics.median(run_time[name]) / statistics.median(run_time["plain"])
        print(
            f"{name:28} {statistics.median(rate[name]):>8.2f} "
            f"{statistics.median(ratios):>6.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f}) "
            f"{' '.join(f'{x:.2f}' for x in rows):>28} {cost:>11.2f} "
            f"{mean / cost:>12.2f} {mismatch[name]:>9}"
        )


def oracle(args, config, model, dmodel=None):
    from mlx_lm.generate import generate_step, speculative_generate_step
    from mlx_lm.models.cache import trim_prompt_cache
    from mlx_lm.models.deepseek_v4_dspark import DSparkDrafter
    from mlx_lm.models.mtp_drafter import MTPDrafter

    mx.random.seed(args.seed + 2)
    vocab = config["vocab_size"]
    prompt = mx.random.randint(0, vocab, (args.context,)).astype(mx.int32)
    greedy = {}
    for target in [model] + ([dmodel] if dmodel is not None else []):
        _, greedy[id(target)], _ = run(
            generate_step(prompt, target, max_tokens=args.tokens)
        )
    _, a = geometric(5, args.block_mean, random.Random(0))
    sets = set(args.oracle_sets.split(","))
    scratch = model.make_mtp_cache()
    width = (1, 5, model.args.hc_mult, model.args.hidden_size)
    hidden = mx.zeros(width, getattr(mx, args.dtype))

    def stages(n):
        # DSpark's compute stood in for: 3 decoder layers (the MTP block, a
        # CSA layer, heavier than DSpark's window-only stages) and the head
        # over the block of 5 (its context pass left out).
        out = []
        for _ in range(3):
            logits, _ = model.mtp_draft(hidden, mx.ones((1, 5), mx.int32), scratch)
            trim_prompt_cache(scratch, 5)
            out.append(logits.argmax(-1))
        return out

    def rates_of(rates):
        return lambda rng: per_position(rates, rng)

    def blocks(mean):
        return lambda rng: geometric(5, mean, rng)[0]

    # name: (target, drafts, acceptance, drafter compute, tokens a round)
    drafters = {"plain": None}
    if "published" in sets:
        for k in (1, 2, 3):
            rates = MTP_RATES[:k]
            label = "/".join(f"{r * 100:.0f}" for r in rates)
            drafters[f"MTP k={k}, {label}%"] = (
                model,
                k,
                rates_of(rates),
                "mtp",
                1 + sum(rates),
            )
        if dmodel is not None:
            drafters[f"DSpark block 5, mean {args.block_mean:g}"] = (
                dmodel,
                5,
                blocks(args.block_mean),
                "dspark",
                args.block_mean,
            )
    if "rejected" in sets:
        # The same drafters with every draft wrong: a round's cost with
        # nothing accepted, alternated with the rounds that accept.
        never = rates_of(())
        for k in (1, 2, 3):
            drafters[f"MTP k={k}, none kept"] = (model, k, never, "mtp", 1.0)
        if dmodel is not None:
            drafters["DSpark block 5, none kept"] = (dmodel, 5, never, "dspark", 1.0)
    if "standin" in sets:
        m = args.block_mean
        drafters[f"block 5, mean {m:g}, no drafter"] = (model, 5, blocks(m), None, m)
        drafters["  + 3 stand-in stages"] = (model, 5, blocks(m), stages, m)
    if "trained" in sets:
        if dmodel is not None:
            for b in (2, 3, 4, 5):
                rates = trained_rates("DSpark", b)
                drafters[f"DSpark block {b}, trained"] = (
                    dmodel,
                    b,
                    rates_of(rates),
                    "dspark",
                    1 + sum(rates),
                )
        for k in (2, 3, 4, 5):
            rates = trained_rates("MTP", k)
            drafters[f"MTP k={k}, trained"] = (
                model,
                k,
                rates_of(rates),
                "mtp",
                1 + sum(rates),
            )

    def once(name, seed, tokens, truth=None):
        spec = drafters[name]
        if spec is None:
            return run(generate_step(prompt, model, max_tokens=tokens))
        target, k, make, extra, _ = spec
        inner = {"mtp": MTPDrafter, "dspark": DSparkDrafter}.get(extra)
        inner = inner(target) if inner else None
        work = extra if callable(extra) else None
        truth = truth or greedy[id(target)]
        drafter = OracleDrafter(truth, make(random.Random(seed)), vocab, inner, work)
        steps = speculative_generate_step(
            prompt, target, drafter=drafter, num_draft_tokens=k, max_tokens=tokens
        )
        return run(steps)

    for name in drafters:
        # Warm up: the compiled steps of every forward's length.
        once(name, -1, 16)
    # --oracle-truth self: the oracle proposes the loop's own greedy tokens
    # (in bf16 a verify can round to another token than one-token steps), a
    # run's tokens fed back until the next run gives them again.
    truths = {}
    if args.oracle_truth == "self":
        for name, spec in drafters.items():
            for r in range(args.repeat) if spec else ():
                truth = None
                for _ in range(4):
                    _, tokens, _ = once(name, r, args.tokens, truth)
                    if tokens == truth:
                        break
                    truth = tokens
                truths[name, r] = truth
    rates = {name: [] for name in drafters}
    per_round = {name: [] for name in drafters}
    round_time = {name: [] for name in drafters}
    mismatch = {name: 0 for name in drafters}
    for r in range(args.repeat):
        for name in drafters:
            rate, tokens, t = once(name, r, args.tokens, truths.get((name, r)))
            rates[name].append(rate)
            per_round[name].append(rate * t)
            round_time[name].append(t)
            spec = drafters[name]
            expected = truths.get((name, r)) or greedy[id(spec[0] if spec else model)]
            mismatch[name] += sum(a != b for a, b in zip(tokens, expected))
            mismatch[name] += abs(len(tokens) - len(expected))
    base = statistics.median(rates["plain"])
    print(
        f"oracle drafters after {args.context} tokens, {args.tokens} tokens a "
        f"run, medians of {args.repeat} alternated runs (block 5 at mean "
        f"{args.block_mean:g}: each draft kept with p={a:.3f} after the one "
        "before). 'at the mean': the expected tokens a round over the "
        "measured round time (in plain steps):"
    )
    print(
        f"{'':28} {'tok/s':>8} {'x plain':>8} {'tokens/round':>13} "
        f"{'expected':>9} {'round/step':>11} {'at the mean':>12} "
        f"{'!= ' + args.oracle_truth:>9}"
    )
    for name in drafters:
        rate = statistics.median(rates[name])
        per = statistics.mean(per_round[name])
        mean = drafters[name][4] if drafters[name] else 1.0
        # The round's time in plain steps.
        cost = statistics.median(round_time[name]) / statistics.median(
            round_time["plain"]
        )
        print(
            f"{name:28} {rate:>8.2f} {rate / base:>8.2f} {per:>13.2f} "
            f"{mean:>9.2f} {cost:>11.2f} {mean / cost:>12.2f} {mismatch[name]:>9}"
        )


def bf16_like_the_gpu(model):
    """On the CPU, gathered experts multiply in float32 only."""
    if mx.default_device() == mx.cpu:
        experts = [
            (k, v.astype(mx.float32))
            for k, v in tree_flatten(model.parameters())
            if ".switch_mlp." in k
        ]
        model.update(tree_unflatten(experts))
    return model


def verify_difference(model, prompt, rounds):
    """The largest logit difference between a forward over 8 tokens and 8
    one-token steps after ``prompt``, the largest logit, and at how many of
    the positions their argmax differs."""
    from mlx_lm.models.cache import trim_prompt_cache

    vocab = model.args.vocab_size
    cache = prefill(model, prompt)
    worst, scale, differ, total = 0.0, 0.0, 0, 0
    for _ in range(rounds):
        tokens = mx.random.randint(0, vocab, (1, 8)).astype(mx.int32)
        wide = model(tokens, cache).astype(mx.float32)
        mx.eval(wide)
        trim_prompt_cache(cache, 8)
        steps = [model(tokens[:, i : i + 1], cache) for i in range(8)]
        steps = mx.concatenate(steps, axis=1).astype(mx.float32)
        worst = max(worst, mx.abs(wide - steps).max().item())
        scale = max(scale, mx.abs(steps).max().item())
        differ += (wide.argmax(-1) != steps.argmax(-1)).sum().item()
        total += 8
        # One token further each round: every offset of the windows.
        trim_prompt_cache(cache, 7)
    return worst, scale, differ, total


def exactness(args):
    print("verify forward over 8 tokens against 8 one-token steps:")
    cpu = mx.default_device() == mx.cpu
    label = OTHER_ATTENTION
    if args.attention_from:
        switch, others = attention_from(args.attention_from), (False, True)
    elif args.flag_ab:
        switch, others = flag_switch(args.flag_ab), (False, True)
        label = f"{args.flag_ab} flipped: "
    else:
        switch, others = (lambda on: None), (False,)
    _, model32 = build(args, "float32")
    for dtype in ("float32", "bfloat16"):
        # The same weights, the float32 ones rounded.
        if dtype == "float32":
            model = model32
        else:
            model = bf16_like_the_gpu(build(args, dtype)[1])
        for other in others:
            switch(other)
            mx.random.seed(args.seed + 3)
            prompt = mx.random.randint(0, model.args.vocab_size, (args.context,))
            worst, scale, differ, total = verify_difference(
                model, prompt.astype(mx.int32), args.exactness_rounds
            )
            print(
                f"  {label if other else ''}{dtype:8}: max |logit "
                f"difference| {worst:.3e} (logits up to {scale:.2f}), argmax "
                f"differs at {differ} of {total} positions"
                + (" (experts float32)" if dtype != "float32" and cpu else "")
            )
        switch(False)


def first_differences(model, prompts, tokens, drafters):
    """Greedy speculative decoding against plain greedy decoding: for each
    prompt and each drafter (a function of plain's tokens giving a
    ``Drafter`` and its drafts a round), the first index where the tokens
    differ and plain's logit margin there of its token over the speculative
    one (``None`` where they agree)."""
    from mlx_lm.generate import generate_step, speculative_generate_step

    found = []
    for prompt in prompts:
        plain = list(generate_step(prompt, model, max_tokens=tokens))
        greedy = [int(t) for t, _ in plain]
        for make in drafters:
            drafter, k = make(greedy)
            steps = speculative_generate_step(
                prompt, model, drafter=drafter, num_draft_tokens=k, max_tokens=tokens
            )
            spec = [int(t) for t, _, _ in steps]
            index = next(
                (i for i, (a, b) in enumerate(zip(spec, greedy)) if a != b), None
            )
            if index is None:
                found.append(None)
                continue
            logprobs = plain[index][1]
            margin = logprobs[greedy[index]] - logprobs[spec[index]]
            found.append((index, margin.item()))
    return found


def greedy_guarantee(args, model, dmodel=None, prompts=4):
    """Where greedy speculative decoding first differs from plain greedy
    decoding, against how far a verify's logits are from one-token steps'."""
    from mlx_lm.models.deepseek_v4_dspark import DSparkDrafter
    from mlx_lm.models.mtp_drafter import MTPDrafter

    vocab = model.args.vocab_size
    mx.random.seed(args.seed + 4)
    prompt = mx.random.randint(0, vocab, (args.context,)).astype(mx.int32)
    worst = verify_difference(model, prompt, args.exactness_rounds)[0]

    def mtp(greedy):
        rng = random.Random(len(greedy))
        accepted = per_position(MTP_RATES[:2], rng)
        return OracleDrafter(greedy, accepted, vocab, MTPDrafter(model)), 2

    def dspark(greedy):
        accepted = geometric(5, args.block_mean, random.Random(len(greedy)))[0]
        drafter = DSparkDrafter(dmodel)
        return OracleDrafter(greedy, accepted, vocab, drafter), 5

    prompts = [
        mx.random.randint(0, vocab, (args.context,)).astype(mx.int32)
        for _ in range(prompts)
    ]
    found = first_differences(model, prompts, args.tokens, [mtp])
    if dmodel is not None:
        found += first_differences(dmodel, prompts, args.tokens, [dspark])
    return worst, found


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=43, help="43: Flash's schedule")
    parser.add_argument(
        "--schedule", help="compress ratios, e.g. 0,4,128 (overrides --layers)"
    )
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--experts-per-token", type=int, default=6)
    parser.add_argument("--tiny", action="store_true", help="tiny sizes for a CPU")
    for flag in OVERRIDES:
        parser.add_argument("--" + flag.replace("_", "-"), type=int)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument(
        "--bits", type=int, help="quantize the target and its drafters (affine)"
    )
    parser.add_argument("--group-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--context", type=int, default=512, help="prompt tokens")
    parser.add_argument("--lengths", default="1,2,4,6,8")
    parser.add_argument("--verify-rounds", type=int, default=30)
    parser.add_argument(
        "--without",
        help="the verify also with parts cut: pools, top-k, experts, attention",
    )
    parser.add_argument("--no-verify", action="store_true")
    parser.add_argument("--rounds", action="store_true", help="MTP round cost")
    parser.add_argument("--mtp-k", default="2", help="MTP drafts, e.g. 1,2,3")
    ab = parser.add_mutually_exclusive_group()
    ab.add_argument(
        "--hc-ab",
        action="store_true",
        help="--rounds with the hyper-connection kernels and without, alternated",
    )
    ab.add_argument(
        "--attention-from",
        metavar="PATH",
        help="--rounds and --exactness also with Attention._dense of another "
        "deepseek_v4.py (a parent commit's), alternated",
    )
    ab.add_argument(
        "--flag-ab",
        metavar="NAME",
        help="--rounds and --exactness also with deepseek_v4's boolean NAME "
        "flipped (a trial's switch), alternated",
    )
    parser.add_argument(
        "--mtp-ratio", type=int, help="the MTP layer's compress ratio (4; --peer: 0)"
    )
    parser.add_argument(
        "--dspark", action="store_true", help="also the DSpark drafter's rounds"
    )
    parser.add_argument("--dspark-blocks", default="2,3,4,5")
    parser.add_argument("--markov-rank", type=int, default=256)
    parser.add_argument(
        "--peer", action="store_true", help="also mlx-vlm's rounds (with --rounds)"
    )
    parser.add_argument(
        "--batch", type=int, help="a BatchGenerator's MTP round at B rows"
    )
    parser.add_argument("--oracle", action="store_true", help="oracle drafters")
    parser.add_argument(
        "--oracle-sets",
        default="published,standin,trained",
        help="of published, rejected (nothing accepted), standin, trained",
    )
    parser.add_argument(
        "--oracle-truth",
        choices=["plain", "self"],
        default="plain",
        help="the oracle's tokens: plain greedy's, or the loop's own",
    )
    parser.add_argument("--block-mean", type=float, default=3.0)
    parser.add_argument("--tokens", type=int, default=64, help="tokens a run")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--exactness", action="store_true")
    parser.add_argument("--exactness-rounds", type=int, default=16)
    parser.add_argument(
        "--greedy-guarantee",
        action="store_true",
        help="where speculative greedy first differs from plain greedy",
    )
    args = parser.parse_args(argv)
    if args.mtp_ratio is None:
        args.mtp_ratio = 0 if args.peer else 4
    if args.bits and (args.peer or args.exactness):
        parser.error("--bits is not taken with --peer or --exactness")
    parts = {"pools", "top-k", "experts", "attention"}
    if args.without and not set(args.without.split(",")) <= parts:
        parser.error(f"--without takes {', '.join(sorted(parts))}")
    sets = {"published", "rejected", "standin", "trained"}
    if not set(args.oracle_sets.split(",")) <= sets:
        parser.error(f"--oracle-sets takes {', '.join(sorted(sets))}")
    return args


def main():
    args = parse_args()

    config, model = build(args)
    layers = config["num_hidden_layers"]
    print(
        f"DeepSeek-V4: {layers} layers, hidden "
        f"{config['hidden_size']}, {config['n_routed_experts']} experts "
        f"top-{config['num_experts_per_tok']}, {args.dtype}, device "
        f"{device_name()}; MTP layer compress ratio {args.mtp_ratio}"
    )
    dconfig = dmodel = peer = None
    if args.dspark:
        dconfig, dmodel = build_dspark(args, config, model)
        print(
            f"DSpark: 3 window-only stages, taps after layers "
            f"{dconfig['dspark_target_layer_ids']}, block 5, Markov rank "
            f"{args.markov_rank}; the same target arrays"
        )
    if args.bits:
        # Each model quantized as mlx_lm.convert -q does (after the DSpark
        # model took the target's arrays, so each holds its own copy).
        for m in (model, dmodel):
            if m is not None:
                quantize(m, args.bits, args.group_size)
        print(f"quantized: {args.bits}-bit affine, group {args.group_size}")
    if args.peer:
        peer = Peer(config, model, dconfig, dmodel)
        print(f"peer: mlx-vlm {import_peer()[2]}, the same arrays")
    if not args.no_verify:
        verify(args, config, model)
    if args.rounds:
        rounds(args, config, model, dmodel, peer)
    if args.batch and args.oracle:
        batch_oracle(args, config, model, dmodel)
    elif args.batch:
        batch_rounds(args, config, model)
    if args.oracle and not args.batch:
        oracle(args, config, model, dmodel)
    if args.greedy_guarantee:
        if args.dtype != "float32":
            for m in (model, dmodel):
                if m is not None:
                    bf16_like_the_gpu(m)
        worst, found = greedy_guarantee(args, model, dmodel)
        print(
            f"greedy, {args.dtype}: a verify's logits within {worst:.3e} of "
            f"one-token steps'; first differences from plain greedy "
            f"(index, plain's margin) over {len(found)} runs of "
            f"{args.tokens} tokens: {found}"
        )
    if args.exactness:
        del model
        exactness(args)


if __name__ == "__main__":
    main()
