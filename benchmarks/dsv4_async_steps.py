# Copyright © 2026 Apple Inc.
"""Where a pipelined decode step's time goes, against a step one at a time.

On the H200 ``generate_step``'s pipelined loop took longer a step than the
same model one step at a time (docs/benchmarks.md, issue 32). This times the
loop of ``dsv4_speed.Driver`` in three forms, alternated in one process:
pipelined on its own stream (``generate_step``), pipelined on the default
stream, and one step at a time; and splits each step's wall time into
building the graph, ``async_eval`` (the launches) and the wait for the token.

    python3 benchmarks/dsv4_async_steps.py --layers 43 --experts 8 --context 1024
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).parent))
from dsv4_speed import Driver, make_config, make_fork  # noqa: E402


def decode(driver, y, cache, steps, serial):
    """``Driver.decode``'s loop, with the time of each phase a step."""
    build = launch = wait = 0.0
    tic = time.perf_counter()
    y = driver._step(y, cache)
    mx.async_eval(y)
    for n in range(1, steps + 1):
        if serial:
            t = time.perf_counter()
            y.item()
            wait += time.perf_counter() - t
        if n < steps:
            t = time.perf_counter()
            next_y = driver._step(y, cache)
            t2 = time.perf_counter()
            mx.async_eval(next_y)
            t3 = time.perf_counter()
            build += t2 - t
            launch += t3 - t2
        t = time.perf_counter()
        y.item()
        wait += time.perf_counter() - t
        if n < steps:
            y = next_y
    total = time.perf_counter() - tic
    return [x * 1e3 / steps for x in (total, build, launch, wait)]


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
    own = Driver("own stream", model, forward, 2048)
    default = Driver("default stream", model, forward, 2048)
    default.stream = mx.default_stream(mx.default_device())
    variants = {
        "pipelined, own stream (generate_step)": (own, False),
        "pipelined, default stream": (default, False),
        "one at a time, own stream": (own, True),
    }
    mx.random.seed(1)
    prompt = mx.random.randint(0, config["vocab_size"], (args.context,))
    times = {name: [] for name in variants}
    memory = {name: [] for name in variants}
    for r in range(args.repeat + 1):
        for name, (driver, serial) in variants.items():
            cache, y = driver.prefill(prompt)
            mx.reset_peak_memory()
            row = decode(driver, y, cache, args.tokens if r else 8, serial)
            if r:
                times[name].append(row)
                memory[name].append(
                    (mx.get_peak_memory() - mx.get_active_memory()) / 1e9
                )
            del cache
    print(
        f"decode after {args.context} tokens, {args.tokens} tokens a run, "
        f"medians of {args.repeat} alternated runs; ms a step"
    )
    print(f"{'':40s} {'step':>7s} {'build':>7s} {'launch':>7s} {'wait':>7s} GB")
    for name, rows in times.items():
        cols = [statistics.median(c) for c in zip(*rows)]
        cells = " ".join(f"{c:7.1f}" for c in cols)
        print(f"{name:40s} {cells} {statistics.median(memory[name]):.2f}")
    print(f"cache memory at the end {mx.get_cache_memory() / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
