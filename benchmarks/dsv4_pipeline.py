# Copyright © 2026 Apple Inc.

"""DeepSeek-V4 over several processes: pipeline against one process, and how
many machines Flash and Pro need.

Decode speed: builds a random DeepSeek-V4 (``--hidden``, ``--layers``; the
other sizes the tiny test model's), prefills ``--prompt`` tokens and decodes
``--tokens`` through ``generate_step``, then prints tokens/s and the bytes
this rank passes to ``send``, ``all_gather`` and ``all_sum`` in a decode step. Run it
alone, then under ``mlx.launch`` with ``--pipeline`` or ``--tensor`` (tensor
parallelism, ``Model.shard``); each rank prints a line:

    python3 benchmarks/dsv4_pipeline.py
    mlx.launch -n 2 --backend ring -- python3 benchmarks/dsv4_pipeline.py --pipeline
    mlx.launch -n 2 --backend ring -- python3 benchmarks/dsv4_pipeline.py --tensor

``--plan`` prints, from the released configs' parameter counts, the weight
bytes per machine of Flash and Pro quantized to 8, 4 and 2 bits (MLX affine,
group 64: its scales and biases add 0.5 bit a weight) over N machines, with
pipeline or tensor parallelism, and the fewest machines of each memory size
that hold them. The models are built lazily, so nothing is allocated.
"""

import argparse
import contextlib
import io
import json
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map_with_path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "checks"))
from test_deepseek_v4 import TINY_CONFIG, make_tiny_model  # noqa: E402
from test_deepseek_v4_shard import FLASH_CONFIG, PRO_CONFIG, FakeGroup  # noqa: E402

from mlx_lm.generate import generate_step  # noqa: E402
from mlx_lm.models import deepseek_v4  # noqa: E402
from mlx_lm.utils import quantize_model  # noqa: E402

# Machine memory sizes (GB) and the share of it the weights may take: macOS
# lets the GPU wire about 75% of memory by default, and the rest keeps the
# caches, activations and the system.
MEMORY_GB = (64, 128, 192, 256, 512)
USABLE = 0.75
# The machine counts of the first table (the second tries 1 to 16).
SHOWN = (1, 2, 3, 4, 8, 16)

# The bytes of each array given to send, all_gather and all_sum (tensor
# parallelism) in one-token forwards.
SENT = {"send": [], "all_gather": [], "all_sum": []}
STEPS = [0]


def _counted(name):
    op = getattr(mx.distributed, name)

    def wrapper(x, *args, **kwargs):
        if x.ndim > 2 and x.shape[1] == 1:
            SENT[name].append(x.nbytes)
        return op(x, *args, **kwargs)

    setattr(mx.distributed, name, wrapper)


def _count_steps():
    forward = deepseek_v4.Model.__call__

    def counted(self, inputs, cache=None):
        STEPS[0] += inputs.shape[1] == 1
        return forward(self, inputs, cache)

    deepseek_v4.Model.__call__ = counted


def nbytes(module):
    return sum(v.nbytes for _, v in tree_flatten(module.parameters()))


def lazy_model(config, bits):
    """The model of config in bfloat16 (float32 where DeepSeek keeps it),
    quantized to bits, without allocating it."""
    model = deepseek_v4.Model(deepseek_v4.ModelArgs.from_dict(config))
    keep = model.cast_predicate

    def cast(k, v):
        return v.astype(mx.bfloat16) if keep(k) else v

    # As mlx_lm.convert casts, then quantizes.
    model.update(tree_map_with_path(cast, model.parameters()))
    with contextlib.redirect_stdout(io.StringIO()):
        quantize_model(model, config, 64, bits)
    return model


def plan_rows(config, bits, sizes=range(1, 17)):
    """(N, pipeline GB, tensor GB) per machine: the largest rank's weights."""
    model = lazy_model(config, bits)
    total = nbytes(model)
    layers = [nbytes(layer) for layer in model.layers]
    shared = total - sum(layers)
    args = model.args
    rows = []
    for n in sizes:
        if n > len(layers):
            continue
        base, extra = divmod(len(layers), n)
        counts = [base + (r < extra) for r in range(n)]
        # Rank r runs the layers after those of ranks r+1 ... n-1.
        starts = [sum(counts[r + 1 :]) for r in range(n)]
        pipeline = shared + max(sum(layers[s : s + c]) for s, c in zip(starts, counts))
        fields = (args.num_attention_heads, args.o_groups, args.moe_intermediate_size)
        tensor = None
        if all(f % n == 0 for f in fields):
            sharded = lazy_model(config, bits)
            sharded.shard(FakeGroup(0, n))
            tensor = nbytes(sharded)
        rows.append((n, pipeline / 1e9, None if tensor is None else tensor / 1e9))
    return total / 1e9, rows


def machines(gb_per_rank):
    """The fewest machines of each memory size: {GB: N or None}."""
    out = {}
    for memory in MEMORY_GB:
        fits = [n for n, gb in gb_per_rank if gb is not None and gb <= USABLE * memory]
        out[memory] = min(fits) if fits else None
    return out


def plan():
    print("| model | bits | weights GB | N | pipeline GB/machine | tensor GB/machine |")
    print("|---|---|---:|---:|---:|---:|")
    summary = []
    for name, config in (("Flash", FLASH_CONFIG), ("Pro", PRO_CONFIG)):
        for bits in (8, 4, 2):
            total, rows = plan_rows(config, bits)
            for n, pipeline, tensor in rows:
                if n not in SHOWN:
                    continue
                tp = "-" if tensor is None else f"{tensor:,.0f}"
                print(
                    f"| {name} | {bits} | {total:,.0f} | {n} | {pipeline:,.0f} | {tp} |"
                )
            summary.append(
                (
                    name,
                    bits,
                    machines([(n, p) for n, p, _ in rows]),
                    machines([(n, t) for n, _, t in rows]),
                )
            )
    print()
    head = " | ".join(f"{m} GB" for m in MEMORY_GB)
    print(f"| model | bits | parallelism | {head} |")
    print("|---|---|---|" + "---:|" * len(MEMORY_GB))
    for name, bits, pipeline, tensor in summary:
        for kind, counts in (("pipeline", pipeline), ("tensor", tensor)):
            cells = " | ".join(str(counts[m] or "-") for m in MEMORY_GB)
            print(f"| {name} | {bits} | {kind} | {cells} |")


def decode(args):
    group = mx.distributed.init()
    config = {
        **TINY_CONFIG,
        "hidden_size": args.hidden,
        "num_hidden_layers": args.layers,
        "layer_types": (TINY_CONFIG["layer_types"] * args.layers)[: args.layers],
        "mlp_layer_types": ["hash_moe"] * 2 + ["moe"] * (args.layers - 2),
    }
    model = make_tiny_model(config)
    whole = nbytes(model)
    if args.pipeline:
        model.model.pipeline(group)
    elif args.tensor:
        model.shard(group)
    for name in SENT:
        _counted(name)
    _count_steps()
    mx.random.seed(2)
    prompt = mx.random.randint(2, config["vocab_size"], (args.prompt,))
    steps = generate_step(prompt, model, max_tokens=args.tokens + 1)
    tic = time.perf_counter()
    next(steps)
    prefill = time.perf_counter() - tic
    tic = time.perf_counter()
    n = sum(1 for _ in steps)
    seconds = time.perf_counter() - tic
    result = {
        "rank": group.rank(),
        "ranks": group.size() if args.pipeline or args.tensor else 1,
        "mode": "pipeline" if args.pipeline else "tensor" if args.tensor else "one",
        "hidden": args.hidden,
        "layers": args.layers,
        "prefill_tok_s": round(args.prompt / prefill, 1),
        "decode_tok_s": round(n / seconds, 1),
        "params_MB": round(nbytes(model) / 1e6, 2),
        "whole_MB": round(whole / 1e6, 2),
        "bytes_per_token": {k: sum(v) // STEPS[0] for k, v in SENT.items()},
    }
    print(json.dumps(result), flush=True)
    # Every rank done before any closes its connections.
    mx.eval(mx.distributed.all_sum(mx.array(1.0), stream=mx.cpu))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", action="store_true", help="the machines table")
    parser.add_argument("--pipeline", action="store_true", help="pipeline the ranks")
    parser.add_argument("--tensor", action="store_true", help="shard every layer")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=200)
    args = parser.parse_args()
    plan() if args.plan else decode(args)


if __name__ == "__main__":
    main()
