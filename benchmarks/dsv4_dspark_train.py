# Copyright © 2026 Apple Inc.

"""Train a tiny DeepSeek-V4-Flash-0731-shaped model's DSpark drafter on
text this machine has, beside the MTP block of the same target, then
measure on held-out text what a round of each gives: the mean accepted
length (the leading drafts equal to the target's greedy tokens) and tokens
per target forward, beside the same drafters untrained, and what cutting a
round where the confidence head says so does.

The target and its MTP block are trained as ``dsv4_mtp_train.py`` trains
them (its corpus, config and loop, imported): bytes as tokens, Python's
standard library source, ``argparse.py`` held out. Then the DSpark
drafter (three window-only stages, the Markov and confidence heads, taps
after target layers 1, 2 and 3 of 4) is trained on that target frozen: its
input states are the target's, computed without gradients. From the
window of the target's tapped states before an anchor, the query block
[anchor, noise x (block - 1)] (non-causal inside the block) predicts the
block of bytes after the anchor, position i the byte i + 1 after it, with
the Markov head's bias from the text's byte before each (teacher-forced);
the loss is the cross-entropy on the text's bytes. Then the confidence
head alone learns, on the drafter frozen, by a binary cross-entropy,
whether each draft equals the target's argmax there. ``--weights`` keeps
the first two phases' weights in a file and reads them from it again.

The measure is a round at every position of held-out spans, as at
inference: the target's cache holds the span up to the anchor, the drafter
proposes its block (DSpark: each draft the argmax of its base logits plus
the Markov bias of the draft before; MTP: its chain over its own streams
and drafts), and the target verifies [anchor, drafts] in one forward from
that cache, which is then trimmed back. Free greedy decoding of so small a
model loops, where any drafter is kept (``dsv4_mtp_train.py``'s docs), so
no free decoding is measured here.

    cd benchmarks && python3 dsv4_dspark_train.py --steps 200 --seed 0
"""

import argparse
import os
import time

import dsv4_mtp_train
import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_map

from mlx_lm.models import deepseek_v4
from mlx_lm.models.cache import trim_prompt_cache
from mlx_lm.models.deepseek_v4_dspark import dspark_block, dspark_context

# dsv4_mtp_train's target, 0731-shaped: a DSpark drafter of three stages
# (one window-only compress_ratios entry each), taps after the last three
# target layers (0731: 40, 41, 42 of 43), num_nextn_predict_layers still 1.
# The noise token is byte 0 (NUL), which the corpus never has (0731's is
# `</think>`); the Markov rank is an eighth of the vocabulary.
BLOCK = 5
DSPARK_CONFIG = {
    **dsv4_mtp_train.CONFIG,
    "compress_ratios": [0, 4, 16, 4, 0, 0, 0],
    "dspark_block_size": BLOCK,
    "dspark_noise_token_id": 0,
    "dspark_target_layer_ids": [1, 2, 3],
    "dspark_markov_rank": 32,
}


def target_weights(model):
    """The target's parameters (everything but its drafter's)."""
    return [
        (k, v)
        for k, v in tree_flatten(model.parameters())
        if not k.startswith(("mtp.", "dspark."))
    ]


def markov_logits(model, base, prev):
    """The block's logits at a position: its base logits plus the Markov
    bias of the token before, and the Markov embedding."""
    bias, e = model.dspark[-1].markov_head(prev)
    return base + bias, e


def dspark_forward(model, windows, anchors, labels):
    """The drafter's logits [N, K, V] on blocks after anchors, the last
    stage's state [N, K, D] and the Markov embeddings [N, K, r]:
    ``windows`` [N, W, F] the target's taps before each anchor, ``labels``
    [N, K] the text's K bytes after it (each position's Markov bias from
    the text's byte before)."""
    W = windows.shape[1]
    noise = model.args.dspark_noise_token_id
    blocks = mx.concatenate(
        [anchors[:, None], mx.full((anchors.size, BLOCK - 1), noise, anchors.dtype)],
        axis=1,
    )
    # The context at positions 0..W-1, the block after it: attention is
    # relative, so this is each anchor's window at its own positions.
    context = dspark_context(model, windows, 0)
    base, x = dspark_block(model, blocks, context, W)
    prev = mx.concatenate([anchors[:, None], labels[:, :-1]], axis=1)
    logits, e = markov_logits(model, base, prev)
    return logits, x, e


def dspark_loss(model, windows, anchors, labels, greedy):
    """The drafter's cross-entropy on the text's bytes, and the share of
    its drafts equal to the target's argmax ``greedy`` [N, K] there."""
    logits, _, _ = dspark_forward(model, windows, anchors, labels)
    ce = nn.losses.cross_entropy(logits, labels, reduction="mean")
    hit = (mx.argmax(logits, axis=-1) == greedy).astype(mx.float32)
    return ce, hit.mean(0)


def confidence_loss(model, windows, anchors, labels, greedy):
    """The confidence head's binary cross-entropy on whether each draft of
    the (frozen) drafter equals the target's argmax there, from the
    head's logit (its sigmoid is ``ConfidenceHead``'s output)."""
    logits, x, e = map(
        mx.stop_gradient, dspark_forward(model, windows, anchors, labels)
    )
    hit = (mx.argmax(logits, axis=-1) == greedy).astype(mx.float32)
    head = model.dspark[-1].confidence_head
    logit = head.proj(mx.concatenate([x, e], axis=-1))[..., 0]
    bce = nn.losses.binary_cross_entropy(logit, hit, reduction="mean")
    return bce, hit.mean()


def dspark_batch(model, data, args):
    """A batch of rows of the corpus through the frozen target: every
    row's ``args.anchors`` anchors, their windows of taps, the text's bytes
    after each and the target's argmax there."""
    W, T, n = model.args.sliding_window, args.length, args.anchors
    starts = mx.random.randint(0, data.size - T, (args.batch,))
    x = mx.stack([data[s.item() : s.item() + T] for s in starts])
    logits, taps = model(x, return_hidden=True)
    greedy = mx.argmax(logits, axis=-1)
    # Anchors with a whole window before them and a block after.
    a = mx.random.randint(W, T - BLOCK, (args.batch, n))
    rows = mx.arange(args.batch)[:, None, None] * T
    window = (rows + a[..., None] - W + mx.arange(W)).reshape(-1)
    after = (rows + a[..., None] + mx.arange(BLOCK)).reshape(-1)
    taps = taps.reshape(-1, taps.shape[-1])
    windows = mx.stop_gradient(taps[window]).reshape(-1, W, taps.shape[-1])
    anchors = x.reshape(-1)[(rows[..., 0] + a).reshape(-1)]
    labels = x.reshape(-1)[after + 1].reshape(-1, BLOCK)
    greedy = greedy.reshape(-1)[after].reshape(-1, BLOCK)
    return windows, anchors, labels, greedy


def train_drafter(model, data, args, modules, loss_fn, name):
    """``modules`` trained on ``loss_fn``, the rest of the model frozen."""
    model.freeze()
    for m in modules:
        m.unfreeze()
    rate = args.learning_rate
    if args.decay:
        rate = optim.cosine_decay(rate, args.steps)
    optimizer = optim.Adam(learning_rate=rate)
    step = nn.value_and_grad(model, lambda m, *b: loss_fn(m, *b)[0])
    tic = time.perf_counter()
    for i in range(args.steps):
        batch = dspark_batch(model, data, args)
        loss, grads = step(model, *batch)
        optimizer.update(model, grads)
        mx.eval(model.parameters(), optimizer.state, loss)
        if (i + 1) % args.report == 0 or i + 1 == args.steps:
            loss, hit = loss_fn(model, *batch)
            hits = " ".join(f"{h:.2f}" for h in hit.reshape(-1).tolist())
            print(
                f"step {i + 1}: {name} {loss.item():.3f}, drafts = the "
                f"target's argmax [{hits}] ({time.perf_counter() - tic:.0f} s)"
            )


def held_out_spans(held_out, rows, length):
    """dsv4_mtp_train's spans: ``rows`` of ``length`` bytes spread over
    the held-out file."""
    starts = [r * (held_out.size - length) // max(rows - 1, 1) for r in range(rows)]
    return mx.stack([held_out[s : s + length] for s in starts])


def dspark_drafts(model, x, anchors, size):
    """Every anchor's greedy DSpark drafts [R, A, size] and the
    confidence head's reading of each [R, A, size], as the drafter runs
    at inference: the window of the target's taps before the anchor at
    their positions, the query block [anchor, noise x (size - 1)] after
    it, each draft the argmax of its base logits and the Markov bias of
    the draft before (the anchor first)."""
    _, taps = model(x, return_hidden=True)
    keys = dspark_context(model, taps, 0)
    W, noise = model.args.sliding_window, model.args.dspark_noise_token_id
    conf_head = model.dspark[-1].confidence_head
    drafts, confs = [], []
    for a in anchors:
        y = x[:, a]
        block = mx.concatenate(
            [y[:, None], mx.full((x.shape[0], size - 1), noise, y.dtype)], axis=1
        )
        base, h = dspark_block(model, block, keys[:, :, max(a - W, 0) : a], a)
        prev, ds, cs = y, [], []
        for i in range(size):
            logits, e = markov_logits(model, base[:, i], prev)
            cs.append(conf_head(h[:, i], e))
            prev = mx.argmax(logits, axis=-1).astype(y.dtype)
            ds.append(prev)
        drafts.append(mx.stack(ds, axis=1))
        confs.append(mx.stack(cs, axis=1))
        mx.eval(drafts[-1], confs[-1])
    return mx.stack(drafts, axis=1), mx.stack(confs, axis=1)


def mtp_drafts(model, x, anchors, depth):
    """Every anchor's greedy MTP chain [R, A, depth], as the loop drafts:
    the target's streams before the anchor with the anchor, then the
    block's own streams with its last draft; the block's cache keeps only
    the entry of the target's streams."""
    _, hidden = model(x, return_hidden=True)
    cache = model.make_mtp_cache()
    a0 = anchors[0]
    if a0 > 1:
        model.mtp_draft(hidden[:, : a0 - 1], x[:, 1:a0], cache)
    drafts = []
    for a in anchors:
        h, y, ds = hidden[:, a - 1 : a], x[:, a : a + 1], []
        for _ in range(depth):
            logits, h = model.mtp_draft(h, y, cache)
            y = mx.argmax(logits[:, -1:], axis=-1).astype(x.dtype)
            ds.append(y[:, 0])
        if trim_prompt_cache(cache, depth - 1) != depth - 1:
            raise RuntimeError("the MTP block's cache did not trim")
        drafts.append(mx.stack(ds, axis=1))
        mx.eval(drafts[-1], [c.cache_arrays() for c in cache])
    return mx.stack(drafts, axis=1)


def verify(model, x, anchors, drafts):
    """The target's verdict on every drafter's drafts: ``drafts`` maps a
    name to [R, A, K] drafts. For every anchor the target's cache holds
    the span before it, the target reads [anchor, drafts] in one forward,
    and the cache is trimmed back to the anchor. Returns each name's
    accepted lengths [R, A] (leading drafts equal to the target's argmax
    after the anchor and the drafts before), the target's argmax on the
    text [R, L] and the share of anchors where the round's first argmax
    is the text forward's."""
    names = list(drafts)
    R, K = x.shape[0], max(d.shape[-1] for d in drafts.values())
    # Every drafter's rows side by side, padded to K drafts with a byte
    # whose verdicts are not read.
    padded = [
        mx.pad(drafts[n], [(0, 0), (0, 0), (0, K - drafts[n].shape[-1])]) for n in names
    ]
    all_drafts = mx.concatenate(padded, axis=0)
    xs = mx.concatenate([x] * len(names), axis=0)
    text_greedy = mx.argmax(model(x), axis=-1)
    cache = model.make_cache()
    mx.eval(model(xs[:, : anchors[0]], cache=cache), text_greedy)
    accepted, first = [], []
    for j, a in enumerate(anchors):
        inputs = mx.concatenate([xs[:, a : a + 1], all_drafts[:, j]], axis=1)
        greedy = mx.argmax(model(inputs, cache=cache), axis=-1)
        if trim_prompt_cache(cache, K) != K:
            raise RuntimeError("the target's cache did not trim")
        same = greedy[:, :K] == all_drafts[:, j]
        accepted.append(mx.cumprod(same.astype(mx.int32), axis=1))
        first.append(greedy[:, 0] == mx.tile(text_greedy[:, a], len(names)))
        mx.eval(accepted[-1], first[-1])
    leading = mx.stack(accepted, axis=1)
    out = {}
    for i, n in enumerate(names):
        k = drafts[n].shape[-1]
        out[n] = leading[i * R : (i + 1) * R, :, :k]
    return out, text_greedy, mx.stack(first).mean().item()


def confidence_cuts(leading, confs, c):
    """As ``DSparkDrafter(confidence=c)`` drafts: a round stops before its
    first draft after the first whose confidence is below c. Returns each
    round's drafts and accepted drafts [R, A]."""
    below = (confs[..., 1:] < c).astype(mx.int32)
    drafted = mx.cumprod(1 - below, axis=-1)
    drafted = mx.concatenate([mx.ones_like(drafted[..., :1]), drafted], axis=-1)
    return drafted.sum(-1), (leading * drafted).sum(-1)


def forward_seconds(model, x, lengths, repeats=20):
    """Seconds of one target forward of each length after a cache of most
    of a span, one row (the median of ``repeats``)."""
    cache, start = model.make_cache(), x.shape[1] - max(lengths)
    mx.eval(model(x[:1, :start], cache=cache))
    out = {}
    for n in lengths:
        times = []
        for _ in range(repeats):
            tic = time.perf_counter()
            mx.eval(model(x[:1, start : start + n], cache=cache))
            times.append(time.perf_counter() - tic)
            trim_prompt_cache(cache, n)
        out[n] = sorted(times)[repeats // 2]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=96)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--report", type=int, default=25)
    parser.add_argument("--corpus", type=int, default=2_000_000, help="bytes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--anchors", type=int, default=16, help="DSpark blocks a training row"
    )
    parser.add_argument("--dspark-steps", type=int, help="default: --steps")
    parser.add_argument("--confidence-steps", type=int, default=100)
    parser.add_argument(
        "--confidence-learning-rate",
        type=float,
        default=2e-5,
        help="the head's Adam rate, cosine-decayed to 0",
    )
    parser.add_argument(
        "--weights",
        help="a .safetensors file: the trained weights saved there, or, where "
        "it exists, read from it in place of training",
    )
    parser.add_argument("--eval-rows", type=int, default=16)
    parser.add_argument("--eval-length", type=int, default=256)
    args = parser.parse_args()
    tic = time.perf_counter()

    # The target and its MTP block, as dsv4_mtp_train.py --seed S trains
    # them (the same draws, so the same losses).
    mx.random.seed(args.seed)
    data, held_out = dsv4_mtp_train.corpus(args.corpus)
    mtp_model = deepseek_v4.Model(
        deepseek_v4.ModelArgs.from_dict(dsv4_mtp_train.CONFIG)
    )
    mtp_untrained = mtp_model.mtp[0].parameters()
    print(f"corpus {data.size:,} bytes, held out {held_out.size:,}, seed {args.seed}")
    load = args.weights and os.path.exists(args.weights)
    if load:
        weights = mx.load(args.weights)
        mtp_model.load_weights(
            [(k, v) for k, v in weights.items() if not k.startswith("dspark.")]
        )
    else:
        print("the target and its MTP block (dsv4_mtp_train.train)")
        dsv4_mtp_train.train(mtp_model, data, args)
    mtp_model.eval()

    # The same target with a DSpark drafter, trained on it frozen.
    mx.random.seed(args.seed + 1)
    model = deepseek_v4.Model(deepseek_v4.ModelArgs.from_dict(DSPARK_CONFIG))
    dspark_untrained = model.parameters()["dspark"]
    model.load_weights(target_weights(mtp_model), strict=False)
    for (k, v), (k2, v2) in zip(target_weights(model), target_weights(mtp_model)):
        if k != k2 or not mx.array_equal(v, v2):
            raise RuntimeError(f"the DSpark model's target differs at {k}")
    if load:
        model.load_weights(
            [(k, v) for k, v in weights.items() if k.startswith("dspark.")],
            strict=False,
        )
        print(f"trained weights loaded from {args.weights}")
    else:
        print(
            f"the DSpark drafter on the frozen target ({args.anchors} blocks "
            f"of {BLOCK} a row)"
        )
        dspark_args = argparse.Namespace(**vars(args))
        dspark_args.steps = args.dspark_steps or args.steps
        dspark_args.decay = False
        train_drafter(
            model, data, dspark_args, model.dspark, dspark_loss, "DSpark loss"
        )
    if args.weights and not load:
        weights = dict(tree_flatten(mtp_model.parameters()))
        weights.update(tree_flatten({"dspark": model.parameters()["dspark"]}))
        mx.save_safetensors(args.weights, weights)
    # The confidence head from zero (a logistic regression), on the drafter
    # frozen. Its input is the last stage's state before the norm, of RMS
    # in the hundreds here: the head's uniform initial weights give logits
    # of hundreds, and Adam at the drafter's rate moves them as much.
    head = model.dspark[-1].confidence_head
    head.update(tree_map(mx.zeros_like, head.parameters()))
    print("the confidence head on the frozen drafter")
    conf_args = argparse.Namespace(**vars(args))
    conf_args.steps = args.confidence_steps
    conf_args.learning_rate = args.confidence_learning_rate
    conf_args.decay = True
    train_drafter(model, data, conf_args, [head], confidence_loss, "BCE")
    model.eval()
    dspark_trained = model.parameters()["dspark"]
    trained_s = time.perf_counter() - tic

    # Rounds at every anchor of the held-out spans with a whole window
    # before it and a block after it.
    x = held_out_spans(held_out, args.eval_rows, args.eval_length)
    W = model.args.sliding_window
    anchors = list(range(W, args.eval_length - BLOCK))
    drafts, confs = {}, {}
    for name, params in (("trained", dspark_trained), ("untrained", dspark_untrained)):
        model.update({"dspark": params})
        drafts[f"DSpark {name}"], confs[name] = dspark_drafts(model, x, anchors, BLOCK)
        if name == "trained":
            # The same weights with a query block of k < 5.
            for k in range(2, BLOCK):
                d = dspark_drafts(model, x, anchors, k)[0]
                drafts[f"DSpark trained, block {k}"] = d
    model.update({"dspark": dspark_trained})
    for name, params in (("trained", None), ("untrained", mtp_untrained)):
        trained = mtp_model.mtp[0].parameters()
        if params is not None:
            mtp_model.mtp[0].update(params)
        drafts[f"MTP {name}"] = mtp_drafts(mtp_model, x, anchors, BLOCK)
        mtp_model.mtp[0].update(trained)
    # The byte read again (indentation and runs of spaces repeat).
    drafts["repeat the anchor"] = mx.repeat(x[:, anchors, None], BLOCK, axis=2).astype(
        x.dtype
    )
    leading, text_greedy, first = verify(model, x, anchors, drafts)
    accuracy = (text_greedy[:, :-1] == x[:, 1:]).mean().item()

    positions = len(anchors) * args.eval_rows
    print(
        f"\n{args.eval_rows} held-out spans of {args.eval_length} bytes, "
        f"anchors {anchors[0]}..{anchors[-1]} ({positions:,} rounds): the "
        f"target's argmax is the next byte at {accuracy:.3f}; a round's "
        f"first argmax is the text forward's at {first:.4f}"
    )
    print("mean accepted length (tokens per target forward = 1 + it), k drafts")
    print(f"  {'drafter':26}" + "".join(f"{'k=' + str(k):>7}" for k in range(1, 6)))
    for name, lead in leading.items():
        K = lead.shape[-1]
        means = [lead[..., :k].sum(-1).mean().item() for k in range(1, K + 1)]
        if K < BLOCK:
            # A query block of K: only its own K column is its round.
            cells = " " * 7 * (K - 1) + f"{means[-1]:7.3f}"
        else:
            cells = "".join(f"{m:7.3f}" for m in means)
        print(f"  {name:26}{cells}")
    print("  (k drafts of the block of 5: its first k; 'block k': a query block of k)")

    # Each draft against the target's argmax on the text there.
    print("teacher-forced agreement: draft i = the target's argmax on the text")
    for name in ("DSpark trained", "DSpark untrained", "MTP trained", "MTP untrained"):
        d = drafts[name]
        agree = [
            (d[:, :, i] == text_greedy[:, [a + i for a in anchors]]).mean().item()
            for i in range(BLOCK)
        ]
        print(f"  {name:26}" + "".join(f"{g:7.3f}" for g in agree))

    # The confidence head: cutting a round where it says so. A round's
    # work is its verify forward, timed here for each length.
    lead, conf = leading["DSpark trained"], confs["trained"]
    seconds = forward_seconds(model, x, range(1, BLOCK + 2))
    print(
        "the confidence head (trained): a round cut before its first draft "
        "after the first whose confidence < c"
    )
    print(
        "  a target forward of n tokens (one row, this CPU): "
        + ", ".join(f"n={n} {t * 1e3:.1f} ms" for n, t in seconds.items())
    )
    cost = mx.array([0.0] + [seconds[n] for n in range(1, BLOCK + 2)])
    print(
        f"  {'c':>4} {'drafts':>7} {'accepted':>9} {'tok/fwd':>8} "
        f"{'tok/verified':>13} {'tok/s of verify':>16}"
    )
    for c in (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9):
        drafted, kept = confidence_cuts(lead, conf, c)
        verified = (1 + drafted).sum().item()
        tokens = (1 + kept).sum().item()
        busy = cost[1 + drafted].sum().item()
        print(
            f"  {c:4.1f} {drafted.mean().item():7.3f} {kept.mean().item():9.3f} "
            f"{tokens / drafted.size:8.3f} {tokens / verified:13.3f} "
            f"{tokens / busy:16.1f}"
        )
    # Calibration: each draft whose drafts before it were kept.
    reached = mx.concatenate([mx.ones_like(lead[..., :1]), lead[..., :-1]], -1)
    kept = lead.astype(mx.float32)
    print("  drafts reached (those before kept), by confidence: count, kept")
    edges = (0.0, 0.2, 0.4, 0.6, 0.8, 1.01)
    for lo, hi in zip(edges, edges[1:]):
        sel = reached * (conf >= lo) * (conf < hi)
        n = sel.sum().item()
        rate = (kept * sel).sum().item() / max(n, 1)
        print(f"    [{lo:.1f}, {min(hi, 1):.1f}): {n:6d} reached, kept {rate:.3f}")
    print(f"total {time.perf_counter() - tic:.0f} s (training {trained_s:.0f} s)")


if __name__ == "__main__":
    main()
