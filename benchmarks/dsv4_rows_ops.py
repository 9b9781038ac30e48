# Copyright © 2026 Apple Inc.
"""Why a verify over a few tokens costs more than one token on a GPU.

A DeepSeek-V4 forward over L <= 8 tokens takes the decode step's path with
about as many primitives as one token (benchmarks/dsv4_verify.py), yet on an
H200 it took 1.4-1.6x one token's time from L = 2 on, the same with every
expert read at every L. This times, at Flash's per-layer shapes (bf16), the
matmuls of one layer for M = 1, 2, 4, 8 rows (``--dtype``; two of them also
as ``w @ x.T``, row by row and in 4 bits): each op ``--repeat`` times in
one graph (their results summed, so none is dropped), medians of
``--trials`` evaluations after a warm-up; and, for the model of
dsv4_verify.py, the host's time to build a forward's graph against the time
to evaluate it.

    python benchmarks/dsv4_rows_ops.py               # on a GPU
    python benchmarks/dsv4_rows_ops.py --forward --layers 6
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).parent))
from dsv4_speed import OVERRIDES  # noqa: E402

# (name, input features, output features): Flash's projections of a layer.
DENSE = [
    ("wq_a", 4096, 1024),
    ("wq_b", 1024, 32768),
    ("wkv", 4096, 512),
    ("wo_b", 8192, 4096),
    ("shared gate", 4096, 2048),
    ("shared down", 2048, 4096),
    ("indexer wq_b", 1024, 8192),
    ("compressor wkv", 4096, 1024),
    ("router", 4096, 256),
]


def timed(fn, trials):
    mx.eval(fn())
    times = []
    for _ in range(trials):
        start = time.perf_counter()
        mx.eval(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def ops(rows, dtype):
    """name -> a function of M building ``repeat`` applications of the op."""
    mx.random.seed(0)
    table = {}
    for name, k, n in DENSE:
        w = (0.02 * mx.random.normal((n, k))).astype(dtype)
        table[f"{name} {k}->{n}"] = (w, lambda x, w=w: x @ w.T, k)
    # Other ways to the same rows (for M > 1, where a plain projection
    # leaves MLX's one-row kernel): the weights as the left operand, one
    # one-row matmul a row, and the weights in 4 bits (as convert -q).
    for name, k, n in (DENSE[0], DENSE[3]):
        w = table[f"{name} {k}->{n}"][0]
        table[f"{name} as w @ x.T"] = (w, lambda x, w=w: (w @ x.T).T, k)
        table[f"{name} row by row"] = (
            w,
            lambda x, w=w: mx.concatenate(
                [x[i : i + 1] @ w.T for i in range(x.shape[0])]
            ),
            k,
        )
        q = mx.quantize(w, group_size=64, bits=4)
        table[f"{name} 4-bit"] = (
            q[0],
            lambda x, q=q: mx.quantized_matmul(x, *q, group_size=64, bits=4),
            k,
        )
    # wo_a: 8 groups of 4096 features to 1024 each, one batched matmul.
    w = (0.02 * mx.random.normal((8, 4096, 1024))).astype(dtype)
    table["wo_a 8 x 4096->1024"] = (
        w,
        lambda x, w=w: (x.reshape(-1, 8, 1, 4096) @ w).reshape(x.shape[0], -1),
        8 * 4096,
    )
    # The routed experts: 8 of 2048 features, 6 a token (gather_mm).
    w = (0.02 * mx.random.normal((8, 2048, 4096))).astype(dtype)
    idx = mx.array([[0, 1, 2, 3, 4, 5], [2, 3, 4, 5, 6, 7]] * 4, mx.uint32)

    def experts(x, w=w):
        m = x.shape[0]
        out = mx.gather_mm(x[:, None, None], w.swapaxes(-1, -2), rhs_indices=idx[:m])
        return out.reshape(m, -1)

    table["experts gather_mm 4096->2048 x6"] = (w, experts, 4096)

    def experts_sorted(x, w=w):
        # The pairs sorted by expert, as upstream's SwitchGLU does from 64
        # pairs on: each expert's rows as one matmul (the rows come out in
        # the pairs' sorted order; only the time counts here).
        m = x.shape[0]
        flat = idx[:m].flatten()
        order = mx.argsort(flat)
        rows = x[order // idx.shape[1]][:, None]
        out = mx.gather_mm(
            rows, w.swapaxes(-1, -2), rhs_indices=flat[order], sorted_indices=True
        )
        return out.reshape(m, -1)

    table["experts gather_mm sorted by expert"] = (w, experts_sorted, 4096)
    q = mx.quantize(w, group_size=64, bits=4)

    def experts_4bit(x, q=q):
        m = x.shape[0]
        out = mx.gather_qmm(x[:, None, None], *q, rhs_indices=idx[:m], bits=4)
        return out.reshape(m, -1)

    table["experts gather_qmm 4-bit"] = (q[0], experts_4bit, 4096)
    # One token's attention: the 64 heads' queries (x L) over 385 keys.
    keys = (0.02 * mx.random.normal((1, 385, 512))).astype(dtype)
    table["attention scores 64L x 512 . 385 keys"] = (
        keys,
        lambda x, keys=keys: (x.reshape(1, -1, 512) @ keys.swapaxes(-1, -2)).reshape(
            x.shape[0], -1
        ),
        64 * 512,
    )
    return table


def op_times(args, dtype):
    print(f"µs an op (median of {args.trials} graphs of {args.repeat}), {dtype}")
    lengths = [int(v) for v in args.lengths.split(",")]
    print(f"  {'op':40s}" + "".join(f"{'M=' + str(m):>10s}" for m in lengths))
    for name, (_, fn, k) in ops(args.repeat, dtype).items():
        row = []
        for m in lengths:
            xs = [(0.1 * mx.random.normal((m, k))).astype(dtype) for _ in range(4)]
            mx.eval(xs)

            def graph():
                return sum(fn(xs[i % 4]).sum() for i in range(args.repeat))

            row.append(1e6 * timed(graph, args.trials) / args.repeat)
        cells = "".join(f"{t:10.1f}" for t in row)
        ratios = " ".join(f"{t / row[0]:.2f}" for t in row[1:])
        print(f"  {name:40s}{cells}   x M=1: {ratios}")


def forward_split(args):
    """The host's time to build one forward's graph and the time to
    evaluate it, a forward over L tokens after ``--context`` tokens."""
    from dsv4_verify import build

    from mlx_lm.models.cache import trim_prompt_cache

    config, model = build(args)
    cache = model.make_cache()
    prompt = mx.random.randint(0, config["vocab_size"], (1, args.context))
    for i in range(0, args.context, 512):
        model(prompt[:, i : i + 512], cache=cache)
        mx.eval([c.state for c in cache])
    lengths = [int(v) for v in args.lengths.split(",")]
    build_t, eval_t = {m: [] for m in lengths}, {m: [] for m in lengths}
    for trial in range(args.trials + 2):
        for m in lengths:
            tokens = prompt[:, :m]
            start = time.perf_counter()
            out = model(tokens, cache=cache)
            built = time.perf_counter()
            mx.eval(out, [c.state for c in cache])
            done = time.perf_counter()
            trim_prompt_cache(cache, m)
            if trial >= 2:
                build_t[m].append(built - start)
                eval_t[m].append(done - built)
    print(
        f"forward after {args.context} tokens, {config['num_hidden_layers']} "
        f"layers: ms to build the graph / to evaluate it (medians of {args.trials})"
    )
    for m in lengths:
        b, e = statistics.median(build_t[m]), statistics.median(eval_t[m])
        print(f"  L={m}: build {1e3 * b:7.2f}  eval {1e3 * e:7.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="1,2,4,8")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--forward", action="store_true", help="the model's split")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--experts-per-token", type=int, default=6)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--tiny", action="store_true", help="tiny sizes for a CPU")
    parser.add_argument("--schedule", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="bfloat16", help="float32 on a CPU")
    for flag in OVERRIDES:
        parser.add_argument("--" + flag.replace("_", "-"), type=int)
    args = parser.parse_args()
    print(f"device {mx.default_device()}")
    if args.forward:
        forward_split(args)
    else:
        op_times(args, getattr(mx, args.dtype))


if __name__ == "__main__":
    main()
