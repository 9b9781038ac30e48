# Copyright © 2026 Apple Inc.
"""Where a pipelined decode step's time goes, against a step one at a time.

On the H200 ``generate_step``'s pipelined loop took longer a step than the
same model one step at a time (docs/benchmarks.md, issue 32). This times the
loop of ``dsv4_speed.Driver`` (``generate_step``'s) pipelined on a new
stream, on the default stream and on ``mlx_lm.generate``'s
``generation_stream`` (a thread-local stream), one step at a time, and
``generate_step`` itself, alternated in one process; and splits each of
the Driver's steps into building the graph, ``async_eval`` (the launches)
and the wait for the token (``Driver.decode``'s ``phases``). "GB": peak memory above the active memory.

    python3 benchmarks/dsv4_async_steps.py --layers 43 --experts 8 --context 1024
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx

from mlx_lm.generate import generate_step, generation_stream

sys.path.insert(0, str(Path(__file__).parent))
from dsv4_speed import Driver, make_config, make_fork  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=43)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    config = make_config(args)
    model = make_fork(config, dtype=getattr(mx, args.dtype))
    print(
        f"DeepSeek-V4: {len(config['compress_ratios'])} layers, hidden "
        f"{config['hidden_size']}, {args.experts} experts, {args.dtype}, "
        f"{mx.default_device()}"
    )
    forward = lambda inputs, cache: model(inputs, cache=cache)  # noqa: E731
    streams = {
        "a new stream": mx.new_stream(mx.default_device()),
        "the default stream": mx.default_stream(mx.default_device()),
        "generate's generation_stream": generation_stream,
    }
    drivers = {}
    for name, stream in streams.items():
        drivers[name] = Driver(name, model, forward, 2048)
        drivers[name].stream = stream

    def driver(name, serial):
        def run(tokens):
            d = drivers[name]
            cache, y = d.prefill(prompt)
            d.serial, phases = serial, [0.0, 0.0, 0.0]
            tic = time.perf_counter()
            d.decode(y, cache, tokens, phases=phases)
            total = time.perf_counter() - tic
            return [x * 1e3 / tokens for x in (total, *phases)]

        return run

    def plain(tokens):
        # generate_step itself: its steps from the first token on.
        for n, _ in enumerate(generate_step(prompt, model, max_tokens=tokens + 1)):
            if n == 0:
                tic = time.perf_counter()
        step = (time.perf_counter() - tic) * 1e3 / tokens
        return [step] + [float("nan")] * 3

    variants = {f"pipelined, {name}": driver(name, False) for name in streams}
    variants["one at a time, a new stream"] = driver("a new stream", True)
    variants["generate_step"] = plain
    mx.random.seed(1)
    prompt = mx.random.randint(0, config["vocab_size"], (args.context,))
    times = {name: [] for name in variants}
    memory = {name: [] for name in variants}
    for r in range(args.repeat + 1):
        for name, fn in variants.items():
            mx.reset_peak_memory()
            row = fn(args.tokens if r else 8)
            if r:
                times[name].append(row)
                memory[name].append(
                    (mx.get_peak_memory() - mx.get_active_memory()) / 1e9
                )
    print(
        f"decode after {args.context} tokens, {args.tokens} tokens a run, "
        f"medians of {args.repeat} alternated runs; ms a step"
    )
    print(f"{'':44s} {'step':>7s} {'build':>7s} {'launch':>7s} {'wait':>7s} GB")
    for name, rows in times.items():
        cols = [statistics.median(c) for c in zip(*rows)]
        cells = " ".join(f"{c:7.1f}" for c in cols)
        print(f"{name:44s} {cells} {statistics.median(memory[name]):.2f}")
    print(f"cache memory at the end {mx.get_cache_memory() / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
