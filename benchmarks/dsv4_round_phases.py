# Copyright © 2026 Apple Inc.
"""Where a speculative round's time goes, against a plain step.

``speculative_generate_step(mtp=True)`` (MTP at ``--mtp-k`` drafts; with
``--dspark`` also DSpark at the last of ``--dspark-blocks``) and
``generate_step`` on the same random weights as benchmarks/dsv4_verify.py
(nothing accepted: a round gives one token), alternated in one process.
Each round's (or step's) wall time is split into the host's work building
the drafter's graph (``Drafter.draft`` and ``accept``), the target's
forward graph, ``mx.async_eval`` (the launches) and the waits on the
device (``tolist``, ``item``, ``mx.eval``); "other" is the rest of the
loop's Python. ``--primitives`` then counts, in one more untimed run of
each, the primitives a round evaluates (the graphs given to ``mx.eval`` and
``mx.async_eval``, by kind, the same on every device; the kernels a device
launches follow from them) and the kinds a round adds to a plain step.

    python3 benchmarks/dsv4_round_phases.py --layers 43 --experts 8 --dspark
"""

import argparse
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from unittest import mock

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).parent))
import dsv4_verify  # noqa: E402
from dsv4_profile import primitives  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402

WAITS = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__")


class Phases:
    """Wall time by phase, the outer phase charged only for its own part."""

    def __init__(self):
        self.total, self.stack = defaultdict(float), []

    def timed(self, name, fn):
        def call(*args, **kwargs):
            tic = time.perf_counter()
            self.stack.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                inner = self.stack.pop()
                spent = time.perf_counter() - tic
                self.total[name] += spent - inner
                if self.stack:
                    self.stack[-1] += spent

        return call

    def patches(self, model, drafter_class):
        out = [mock.patch.object(mx, "eval", self.timed("wait", mx.eval))]
        out.append(
            mock.patch.object(mx, "async_eval", self.timed("launch", mx.async_eval))
        )
        for name in WAITS:
            out.append(
                mock.patch.object(
                    mx.array, name, self.timed("wait", getattr(mx.array, name))
                )
            )
        forward = type(model).__call__
        out.append(
            mock.patch.object(type(model), "__call__", self.timed("target", forward))
        )
        for name in ("draft", "accept"):
            method = getattr(drafter_class, name)
            out.append(
                mock.patch.object(drafter_class, name, self.timed("drafter", method))
            )
        return out


def split(model, drafter_class, steps, tokens):
    phases = Phases()
    patches = phases.patches(model, drafter_class)
    for p in patches:
        p.start()
    try:
        rounds, tic = 0, None
        for n, item in enumerate(steps(tokens)):
            if n == 0:
                # From the first token on: the prefill is not a round.
                phases.total.clear()
                tic = time.perf_counter()
            else:
                rounds += dsv4_verify.ends_round(item)
        wall = time.perf_counter() - tic
    finally:
        for p in reversed(patches):
            p.stop()
    out = {k: v / rounds for k, v in phases.total.items()}
    out["wall"] = wall / rounds
    out["other"] = out["wall"] - sum(
        out.get(k, 0.0) for k in ("drafter", "target", "launch", "wait")
    )
    return out


def primitives_a_round(steps, tokens):
    """The primitives a round (a step) evaluates, by kind."""
    seen, counting = Counter(), [False]

    def counted(fn):
        def call(*args, **kwargs):
            if counting[0]:
                arrays = tree_flatten(list(args))
                seen.update(
                    primitives(*(a for _, a in arrays if isinstance(a, mx.array)))
                )
            return fn(*args, **kwargs)

        return call

    patches = [
        mock.patch.object(mx, n, counted(getattr(mx, n)))
        for n in ("eval", "async_eval")
    ]
    for p in patches:
        p.start()
    try:
        rounds = 0
        for n, item in enumerate(steps(tokens)):
            if n == 0:
                # From the first token on, as split() times.
                seen.clear()
            else:
                rounds += dsv4_verify.ends_round(item)
            # Up to the last token, not what the loop does after it.
            counting[0] = n < tokens - 1
    finally:
        for p in reversed(patches):
            p.stop()
    return Counter({k: v / rounds for k, v in seen.items()})


def main():
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--primitives", action="store_true")
    own, rest = parser.parse_known_args()
    args = dsv4_verify.parse_args(rest)
    from mlx_lm.generate import generate_step, speculative_generate_step
    from mlx_lm.models.deepseek_v4_dspark import DSparkDrafter
    from mlx_lm.models.mtp_drafter import MTPDrafter

    config, model = dsv4_verify.build(args)
    mx.random.seed(args.seed + 1)
    prompt = mx.random.randint(0, config["vocab_size"], (args.context,)).astype(
        mx.int32
    )
    variants = {"plain step": (model, None, 0)}
    k = dsv4_verify.ints(args.mtp_k)[0]
    variants[f"MTP round, k={k}"] = (model, MTPDrafter, k)
    if args.dspark:
        _, dmodel = dsv4_verify.build_dspark(args, config, model)
        b = dsv4_verify.ints(args.dspark_blocks)[-1]
        variants[f"DSpark round, block {b}"] = (dmodel, DSparkDrafter, b)

    def steps_of(target, k):
        if k == 0:
            return lambda n: generate_step(prompt, target, max_tokens=n)
        return lambda n: speculative_generate_step(
            prompt, target, mtp=True, num_draft_tokens=k, max_tokens=n
        )

    for target, cls, k in variants.values():
        split(target, cls or MTPDrafter, steps_of(target, k), 8)  # warm up
    runs = defaultdict(list)
    for _ in range(args.repeat):
        for name, (target, cls, k) in variants.items():
            runs[name].append(
                split(target, cls or MTPDrafter, steps_of(target, k), args.tokens)
            )
    cols = ["wall", "drafter", "target", "launch", "wait", "other"]
    print(
        f"ms a round (a step), medians of {args.repeat} alternated runs of "
        f"{args.tokens} tokens after {args.context}; wall min-max in brackets"
    )
    print(f"{'':24}" + "".join(f"{c:>18}" for c in cols))
    for name, rs in runs.items():
        cells = []
        for c in cols:
            vals = [r.get(c, 0.0) * 1e3 for r in rs]
            cell = f"{statistics.median(vals):.1f}"
            if c == "wall":
                cell += f" ({min(vals):.1f}-{max(vals):.1f})"
            cells.append(cell)
        print(f"{name:24}" + "".join(f"{c:>18}" for c in cells))

    if not own.primitives:
        return
    counts = {
        name: primitives_a_round(steps_of(target, k), args.tokens)
        for name, (target, _, k) in variants.items()
    }
    plain = counts["plain step"]
    print("primitives a round (a step), and the kinds a round adds to a step:")
    for name, count in counts.items():
        added = sorted(((count[k] - plain[k], k) for k in count), reverse=True)
        top = ", ".join(f"{kind} {n:+.0f}" for n, kind in added[:8] if n >= 1)
        total = sum(count.values())
        print(f"{name:24} {total:8.0f} ({total / sum(plain.values()):.2f}x) {top}")


if __name__ == "__main__":
    main()
