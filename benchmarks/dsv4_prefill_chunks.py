# Copyright © 2026 Apple Inc.
"""The time of each chunk of a long DeepSeek-V4 prefill, with the CSA gather
(``_sparse``) taken past several pool sizes, beside mlx-vlm's model.

Builds the model of ``dsv4_speed.py`` (Flash per-layer sizes, random
weights) and prefills ``--length`` tokens in chunks of ``--prefill-step`` as
``mlx_lm.generate.generate_step`` does (each chunk's cache evaluated, then
``mx.clear_cache()``), once for each ``--sparse-entries`` value (the
model's ``_SPARSE_ENTRIES``: CSA layers gather each query's top-k past that
many pool entries and mask the whole pool below it) and, with ``--peer``,
for mlx-vlm 0.7.10 on the same weights. The variants alternate, ``--repeat``
times. It prints the median ms of each chunk by variant (with the CSA pool
entries the chunk ends at), then the tokens/s of the prefill up to each
``--report`` length and the whole ``--length``, and its peak memory above the
weights.

    python3 benchmarks/dsv4_prefill_chunks.py --layers 43 --experts 8 \\
        --length 32768 --sparse-entries 8192,0 --peer --peer-exact-indexer
"""

import argparse
import statistics

import mlx.core as mx
from dsv4_speed import (
    Driver,
    device_name,
    forward_fn,
    import_peer,
    make_config,
    make_fork,
    make_peer,
)
from mlx.utils import tree_flatten

from mlx_lm.models import deepseek_v4


def prefill(driver, prompt, weight_bytes):
    """The seconds of each chunk and the peak memory above the weights."""
    times = []
    mx.clear_cache()
    mx.reset_peak_memory()
    cache, _ = driver.prefill(prompt, times)
    peak = mx.get_peak_memory() - weight_bytes
    del cache
    mx.clear_cache()
    return times, peak


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=43, help="43: Flash's schedule")
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--tiny", action="store_true", help="tiny sizes for a CPU")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--length", type=int, default=32768)
    parser.add_argument("--prefill-step", type=int, default=2048)
    parser.add_argument(
        "--sparse-entries",
        default=str(deepseek_v4._SPARSE_ENTRIES),
        help="comma list of _SPARSE_ENTRIES values, one variant each",
    )
    parser.add_argument("--report", default="8192,16384,32768")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--peer", action="store_true", help="also mlx-vlm")
    parser.add_argument(
        "--peer-exact-indexer", action="store_true", help="mlx-vlm's exact top-k"
    )
    args = parser.parse_args()

    config = make_config(args)
    model = make_fork(config, dtype=getattr(mx, args.dtype), seed=args.seed)
    weights = tree_flatten(model.parameters())
    weight_bytes = sum(v.nbytes for _, v in weights)
    print(
        f"DeepSeek-V4 prefill chunks: {config['num_hidden_layers']} layers, "
        f"{config['n_routed_experts']} experts, {args.dtype}, "
        f"{device_name()}, mlx {mx.__version__}; {args.length} tokens in "
        f"chunks of {args.prefill_step}, medians of {args.repeat} alternated runs"
    )
    variants = {}
    fork = forward_fn(model, False)
    for entries in (int(s) for s in args.sparse_entries.split(",")):
        name = f"fork@{entries}"
        variants[name] = (Driver(name, model, fork, args.prefill_step), entries)
    if args.peer:
        peer = make_peer(config, weights, args.peer_exact_indexer)
        name = "mlx-vlm" + (" exact" if args.peer_exact_indexer else "")
        peer_forward = forward_fn(peer, True)
        variants[name] = (Driver(name, peer, peer_forward, args.prefill_step), None)
        print(f"peer: mlx-vlm {import_peer()[2]}, same weights")

    mx.random.seed(args.seed + 1)
    # One more token than the chunks hold: the first decode step's input.
    prompt = mx.random.randint(0, config["vocab_size"], (args.length + 1,))
    prompt = prompt.astype(mx.int32)
    mx.eval(prompt)
    default = deepseek_v4._SPARSE_ENTRIES
    runs = {name: [] for name in variants}
    # Run 0 warms up (kernels are built on first use) over three chunks: the
    # indexer's top-k starts past 512 entries.
    for r in range(args.repeat + 1):
        tokens = prompt[: 3 * args.prefill_step + 1] if r == 0 else prompt
        for name, (driver, entries) in variants.items():
            deepseek_v4._SPARSE_ENTRIES = default if entries is None else entries
            try:
                times, peak = prefill(driver, tokens, weight_bytes)
            finally:
                deepseek_v4._SPARSE_ENTRIES = default
            if r > 0:
                runs[name].append((times, peak))
                print(
                    f"  run {r} {name}: {args.length / sum(times):.1f} tok/s",
                    flush=True,
                )

    step = args.prefill_step
    names = list(variants)
    print("\nms a chunk (medians); CSA pool entries at the chunk's end")
    print(f"{'chunk ends at':>13} {'entries':>8}" + "".join(f"{n:>14}" for n in names))
    chunks = len(runs[names[0]][0][0])
    for c in range(chunks):
        end = min((c + 1) * step, args.length)
        row = f"{end:>13} {end // 4:>8}"
        for n in names:
            row += f"{1e3 * statistics.median(t[c] for t, _ in runs[n]):>14.1f}"
        print(row)
    print("\nprefill tok/s up to each length, median (min-max) of the runs")
    report = {int(s) for s in args.report.split(",") if s}
    for length in sorted(n for n in report | {args.length} if n <= args.length):
        k = -(-length // step)
        row = f"{length:>13}"
        for n in names:
            rates = sorted(length / sum(t[:k]) for t, _ in runs[n])
            row += f"  {n}: {statistics.median(rates):.0f} ({rates[0]:.0f}-{rates[-1]:.0f})"
        print(row)
    print(
        "peak GB above the weights (whole prefill): "
        + ", ".join(f"{n} {max(p for _, p in runs[n]) / 2**30:.2f}" for n in names)
    )


if __name__ == "__main__":
    main()
