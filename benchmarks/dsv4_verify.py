# Copyright © 2026 Apple Inc.
"""What a speculative verify costs DeepSeek-V4, and what drafting buys.

Random weights at Flash's per-layer sizes (``--tiny``: the demo's widths),
the model built as benchmarks/dsv4_speed.py builds it, with its MTP block.
After a ``--context``-token prompt it prints:

- verify: the time and the primitives of one forward over L tokens
  (L = ``--lengths``) against one token's, the lengths alternated in one
  process, each forward trimmed after and the cache one token further each
  round (so the forwards fall at every offset of the compression windows);
  primitives are the mean over 8 consecutive offsets;
- rounds (``--rounds``): ``speculative_generate_step``'s round with the MTP
  block at ``--mtp-k`` drafts (random weights: nothing is accepted, so each
  round gives one token) against a plain ``generate_step`` step;
- batch (``--batch B``): a ``BatchGenerator``'s round with the MTP block
  at ``--mtp-k`` drafts a row over B rows against a plain batched step;
- oracle (``--oracle``): greedy tok/s of the loop with drafters that propose
  the target's own greedy tokens (a plain run's) with a wrong one where the
  published acceptance says: MTP at k=2 accepted 70% then 29% per position
  (vLLM's V4-Flash figures; the MTP block runs, its tokens replaced), and a
  block of 5 drafts of mean accepted length ``--block-mean`` (DSpark's
  figure, read as tokens a round: no drafter compute, then with three
  stand-in stages over the block), against plain decoding, alternated ``--repeat`` times;
  the loop's tokens are checked against the plain run's;
- exactness (``--exactness``): the largest logit difference between a
  forward over 8 tokens and 8 one-token steps, float32 and bfloat16 on the
  same weights, and how often their argmax differs.

    python benchmarks/dsv4_verify.py --layers 43 --tiny --dtype float32
    python benchmarks/dsv4_verify.py --layers 43 --tiny --dtype float32 \\
        --rounds --oracle --exactness
    python benchmarks/dsv4_verify.py --layers 43 --tiny --dtype float32 \\
        --no-verify --batch 4
    python benchmarks/dsv4_verify.py --layers 43 --experts 8    # on a GPU
"""

import argparse
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
from dsv4_speed import OVERRIDES, make_config, make_fork  # noqa: E402
from long_decode import cache_arrays  # noqa: E402


def build(args, dtype=None):
    config = make_config(args)
    # The MTP block after the layers, a CSA layer as Flash's.
    config["num_nextn_predict_layers"] = 1
    config["mtp"] = True
    config["compress_ratios"] = config["compress_ratios"] + [4]
    model = make_fork(config, dtype=getattr(mx, dtype or args.dtype), seed=args.seed)
    return config, model


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


def verify(args, config, model):
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
    times = {n: [] for n in lengths}
    for r in range(args.verify_rounds + 2):
        for n in lengths:
            tokens = mx.random.randint(0, vocab, (1, n)).astype(mx.int32)
            mx.eval(tokens)
            tic = time.perf_counter()
            mx.eval(model(tokens, cache))
            if r >= 2:
                times[n].append(time.perf_counter() - tic)
            trim_prompt_cache(cache, n)
        mx.eval(model(one, cache))
    t1, p1 = statistics.median(times[1]), statistics.mean(prims[1])
    print(
        f"verify after {args.context} tokens, medians of {args.verify_rounds} "
        "alternated forwards (time) and means over 8 offsets (primitives):"
    )
    print(f"{'L':>3} {'ms':>9} {'x one':>7} {'primitives':>11} {'x one':>7}")
    for n in lengths:
        t, p = statistics.median(times[n]), statistics.mean(prims[n])
        print(f"{n:>3} {t * 1e3:>9.2f} {t / t1:>7.2f} {p:>11.0f} {p / p1:>7.2f}")


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


def run(steps):
    """tok/s from the first token on, the tokens, and the time of a round
    (a round ends with a token the target gave, not the drafter)."""
    tokens, rounds, tic = [], 0, None
    for n, item in enumerate(steps):
        if n == 0:
            tic = time.perf_counter()
        else:
            rounds += not (len(item) > 2 and item[2])
        tokens.append(int(item[0]))
    elapsed = time.perf_counter() - tic
    return (len(tokens) - 1) / elapsed, tokens, elapsed / max(rounds, 1)


def rounds(args, config, model):
    from mlx_lm.generate import generate_step, speculative_generate_step

    mx.random.seed(args.seed + 1)
    prompt = mx.random.randint(0, config["vocab_size"], (args.context,))
    prompt = prompt.astype(mx.int32)
    plain, spec, sync = [], [], []

    def one_at_a_time(n):
        # Plain steps with no pipelining: each token evaluated before the
        # next step is built (generate_step overlaps them).
        cache, y = prefill(model, prompt[:-1]), prompt[None, -1:]
        mx.eval(model(y, cache))
        tic = time.perf_counter()
        for _ in range(n):
            y = model(y, cache)[:, -1:].argmax(-1)
            mx.eval(y)
        return (time.perf_counter() - tic) / n

    # The first of each warms up (compiled steps of every forward's length).
    for r in range(args.repeat + 1):
        tokens = args.tokens if r else 16
        _, _, step = run(generate_step(prompt, model, max_tokens=tokens))
        plain.append(step)
        steps = speculative_generate_step(
            prompt, model, mtp=True, num_draft_tokens=args.mtp_k, max_tokens=tokens
        )
        spec.append(run(steps)[2])
        sync.append(one_at_a_time(tokens // 2))
    step, round_ = statistics.median(plain[1:]), statistics.median(spec[1:])
    one = statistics.median(sync[1:])
    print(
        f"rounds after {args.context} tokens, medians of {args.repeat}: plain "
        f"step {step * 1e3:.1f} ms; MTP round at k={args.mtp_k} "
        f"{round_ * 1e3:.1f} ms = {round_ / step:.2f} plain steps; a step one "
        f"at a time {one * 1e3:.1f} ms ({round_ / one:.2f} of those)"
    )


def batch_rounds(args, config, model):
    """--batch B: a BatchGenerator's round with the MTP block at --mtp-k
    drafts a row, B rows after --context-token prompts (random weights:
    about one token a row a round), against a plain BatchGenerator's step,
    alternated --repeat times, --tokens rounds (steps) each."""
    from mlx_lm.generate import BatchGenerator

    mx.random.seed(args.seed + 4)
    vocab, B = config["vocab_size"], args.batch
    prompts = [mx.random.randint(0, vocab, (args.context,)).tolist() for _ in range(B)]

    def per_round(mtp, rounds):
        kwargs = {"mtp": True, "num_draft_tokens": args.mtp_k} if mtp else {}
        generator = BatchGenerator(model, stop_tokens=set(), **kwargs)
        max_tokens = (rounds + 2) * (args.mtp_k + 1)
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
        f"plain batched step {step * 1e3:.1f} ms; MTP round at k={args.mtp_k} "
        f"{round_ * 1e3:.1f} ms = {round_ / step:.2f} plain steps "
        f"({statistics.mean(per_row):.2f} tokens a row a round)"
    )


def oracle(args, config, model):
    from mlx_lm.generate import generate_step, speculative_generate_step

    from mlx_lm.models.cache import trim_prompt_cache
    from mlx_lm.models.mtp_drafter import MTPDrafter

    mx.random.seed(args.seed + 2)
    vocab = config["vocab_size"]
    prompt = mx.random.randint(0, vocab, (args.context,)).astype(mx.int32)
    _, greedy, _ = run(generate_step(prompt, model, max_tokens=args.tokens))
    mtp_rates = (0.70, 0.29)
    _, a = geometric(5, args.block_mean, random.Random(0))
    names = [
        "plain",
        "MTP k=2, 70%/29%",
        f"block 5, mean {args.block_mean:g}",
        "  + 3 stand-in stages",
    ]
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

    drafters = {
        names[0]: None,
        names[1]: (2, lambda rng: per_position(mtp_rates, rng), True),
        names[2]: (
            5,
            lambda rng: geometric(5, args.block_mean, rng)[0],
            False,
        ),
        names[3]: (5, lambda rng: geometric(5, args.block_mean, rng)[0], stages),
    }

    def once(name, seed, tokens):
        spec = drafters[name]
        if spec is None:
            return run(generate_step(prompt, model, max_tokens=tokens))
        k, make, extra = spec
        inner = MTPDrafter(model) if extra is True else None
        work = extra if callable(extra) else None
        drafter = OracleDrafter(greedy, make(random.Random(seed)), vocab, inner, work)
        steps = speculative_generate_step(
            prompt, model, drafter=drafter, num_draft_tokens=k, max_tokens=tokens
        )
        return run(steps)

    for name in drafters:
        # Warm up: the compiled steps of every forward's length.
        once(name, -1, 16)
    rates = {name: [] for name in drafters}
    per_round = {name: [] for name in drafters}
    round_time = {name: [] for name in drafters}
    mismatch = {name: 0 for name in drafters}
    for r in range(args.repeat):
        for name in drafters:
            rate, tokens, t = once(name, r, args.tokens)
            rates[name].append(rate)
            per_round[name].append(rate * t)
            round_time[name].append(t)
            mismatch[name] += sum(a != b for a, b in zip(tokens, greedy))
    base = statistics.median(rates["plain"])
    means = dict(zip(names, (1.0, 1 + sum(mtp_rates), *[args.block_mean] * 2)))
    print(
        f"oracle drafters after {args.context} tokens, {args.tokens} tokens a "
        f"run, medians of {args.repeat} alternated runs (block 5: each draft "
        f"kept with p={a:.3f} after the one before). 'at the mean': the "
        "published tokens a round over the measured round time:"
    )
    print(
        f"{'':24} {'tok/s':>8} {'x plain':>8} {'tokens/round':>13} "
        f"{'round/step':>11} {'at the mean':>12} {'!= plain':>9}"
    )
    for name in drafters:
        rate = statistics.median(rates[name])
        per = statistics.mean(per_round[name])
        # The round's time in plain steps.
        cost = statistics.median(round_time[name]) / statistics.median(
            round_time["plain"]
        )
        print(
            f"{name:24} {rate:>8.2f} {rate / base:>8.2f} {per:>13.2f} "
            f"{cost:>11.2f} {means[name] / cost:>12.2f} {mismatch[name]:>9}"
        )


def exactness(args):
    from mlx_lm.models.cache import trim_prompt_cache

    print("verify forward over 8 tokens against 8 one-token steps:")
    cpu = mx.default_device() == mx.cpu
    _, model32 = build(args, "float32")
    for dtype in ("float32", "bfloat16"):
        # The same weights, the float32 ones rounded.
        model = model32 if dtype == "float32" else build(args, dtype)[1]
        if dtype != "float32" and mx.default_device() == mx.cpu:
            # The CPU multiplies gathered experts in float32 only.
            experts = [
                (k, v.astype(mx.float32))
                for k, v in tree_flatten(model.parameters())
                if ".switch_mlp." in k
            ]
            model.update(tree_unflatten(experts))
        vocab = model.args.vocab_size
        mx.random.seed(args.seed + 3)
        prompt = mx.random.randint(0, vocab, (args.context,)).astype(mx.int32)
        cache = prefill(model, prompt)
        worst, scale, differ, total = 0.0, 0.0, 0, 0
        for _ in range(args.exactness_rounds):
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
        print(
            f"  {dtype:8}: max |logit difference| {worst:.3e} (logits up to "
            f"{scale:.2f}), argmax differs at {differ} of {total} positions"
            + (" (experts float32)" if dtype != "float32" and cpu else "")
        )


def main():
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
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--context", type=int, default=512, help="prompt tokens")
    parser.add_argument("--lengths", default="1,2,4,6,8")
    parser.add_argument("--verify-rounds", type=int, default=30)
    parser.add_argument("--no-verify", action="store_true")
    parser.add_argument("--rounds", action="store_true", help="MTP round cost")
    parser.add_argument("--mtp-k", type=int, default=2)
    parser.add_argument(
        "--batch", type=int, help="a BatchGenerator's MTP round at B rows"
    )
    parser.add_argument("--oracle", action="store_true", help="oracle drafters")
    parser.add_argument("--block-mean", type=float, default=3.0)
    parser.add_argument("--tokens", type=int, default=64, help="tokens a run")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--exactness", action="store_true")
    parser.add_argument("--exactness-rounds", type=int, default=16)
    args = parser.parse_args()

    config, model = build(args)
    print(
        f"DeepSeek-V4: {config['num_hidden_layers']} layers, hidden "
        f"{config['hidden_size']}, {config['n_routed_experts']} experts "
        f"top-{config['num_experts_per_tok']}, {args.dtype}, device "
        f"{mx.default_device()}"
    )
    if not args.no_verify:
        verify(args, config, model)
    if args.rounds:
        rounds(args, config, model)
    if args.batch:
        batch_rounds(args, config, model)
    if args.oracle:
        oracle(args, config, model)
    if args.exactness:
        del model
        exactness(args)


if __name__ == "__main__":
    main()
