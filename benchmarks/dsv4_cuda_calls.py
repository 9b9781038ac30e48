# Copyright © 2026 Apple Inc.
"""The CUDA calls behind DeepSeek-V4's decode loops: graph instantiations,
updates and launches, kernel launches, counted with torch's profiler (CUPTI).

MLX's CUDA backend records an evaluation's kernels into CUDA graphs and keeps
the executables of the last ``MLX_CUDA_GRAPH_CACHE_SIZE`` (400) graph shapes:
a graph of a shape it holds is updated in place, any other is instantiated
(milliseconds each). This script runs ``dsv4_verify.py --rounds``' variants
alternated in one process, as that script does (a plain ``generate_step``, a
step one at a time, MTP and DSpark rounds, each after a prefill of
``--context`` tokens), profiles each run, and prints its time a round with
the calls it made and their host milliseconds (the prefill's included; the
``prefill`` variant gives those alone). ``--kernels`` lists each variant's
kernels once; ``--variants "Driver steps"`` runs plain steps alone (the
``Driver`` loop of dsv4_speed.py, one cache from run to run). Run it once
per graph setting:

    [env MLX_USE_CUDA_GRAPHS=0 | MLX_CUDA_GRAPH_CACHE_SIZE=4000] \\
        python3 benchmarks/dsv4_cuda_calls.py --layers 43 --experts 8 --tokens 16

Needs torch with CUDA beside MLX's CUDA build (on a CPU the counts are empty).
"""

import argparse
import time

import mlx.core as mx
from dsv4_speed import Driver, device_name, forward_fn
from dsv4_verify import (
    build,
    build_dspark,
    drafting_round,
    one_at_a_time,
    parse_args,
    plain_step,
    prefill,
)
from long_decode import cache_arrays

CALLS = (
    "cudaGraphInstantiate",
    "cudaGraphExecUpdate",
    "cudaGraphLaunch",
    "cudaGraphAddKernelNode",
    "cudaStreamBeginCapture",
    "cudaLaunchKernelExC",
    "cuLaunchKernelEx",
)


VARIANTS = ["prefill", "plain", "one at a time", "MTP k=2", "DSpark 5", "Driver steps"]


def variants(args, config, model, dmodel):
    mx.random.seed(args.seed + 1)
    prompt = mx.random.randint(0, config["vocab_size"], (args.context,))
    prompt = prompt.astype(mx.int32)

    def prefill_only(n):
        mx.eval(cache_arrays(prefill(model, prompt)))
        return 0.0

    def spec(target, k):
        return lambda n: drafting_round(target, prompt, k, n)[0]

    driver = Driver("steps", model, forward_fn(model, False), 2048)
    state = {}

    def driver_steps(n):
        # dsv4_speed's Driver loop, the cache going on from run to run.
        if not state:
            state["cache"], state["y"] = driver.prefill(prompt)
        tic = time.perf_counter()
        state["y"] = driver.decode(state["y"], state["cache"], n)
        return (time.perf_counter() - tic) / n

    out = {
        "prefill": prefill_only,
        "plain": lambda n: plain_step(model, prompt, n),
        "one at a time": lambda n: one_at_a_time(model, prompt, n),
        "MTP k=2": spec(model, 2),
    }
    if dmodel is not None:
        out["DSpark 5"] = spec(dmodel, 5)
    out["Driver steps"] = driver_steps
    return out


def main():
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--kernels", action="store_true")
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS[:-1]),
        help=f"comma-separated, of {VARIANTS}",
    )
    own, rest = parser.parse_known_args()
    wanted = own.variants.split(",")
    if unknown := set(wanted) - set(VARIANTS):
        raise SystemExit(f"--variants: unknown {sorted(unknown)}; known {VARIANTS}")
    args = parse_args(rest + ["--dspark"])
    config, model = build(args)
    _, dmodel = build_dspark(args, config, model)
    print(f"{device_name()}; {args.tokens} tokens a run after {args.context}")

    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    runs = variants(args, config, model, dmodel)
    runs = {name: runs[name] for name in wanted}
    # The first pass builds each variant's kernels and graphs.
    for fn in runs.values():
        fn(16)
    for r in range(args.repeat):
        for name, fn in runs.items():
            with profile(activities=activities) as prof:
                t = fn(args.tokens)
            events = {e.key: e for e in prof.key_averages()}
            calls = ", ".join(
                f"{k} {events[k].count} ({events[k].cpu_time_total / 1e3:.0f} ms)"
                for k in CALLS
                if k in events
            )
            print(f"{name:14} {t * 1e3:7.1f} ms a round | {calls}", flush=True)
            if own.kernels and r == 0:
                launched = [
                    e
                    for e in events.values()
                    if getattr(e, "self_device_time_total", 0) > 0
                    and not e.key.startswith("cu")
                ]
                count = sum(e.count for e in launched)
                gpu = sum(e.self_device_time_total for e in launched) / 1e3
                print(f"  {count} kernels, {gpu:.0f} ms of GPU time in the run")
                for e in sorted(launched, key=lambda e: -e.count)[:30]:
                    print(
                        f"  {e.count:7d} {e.self_device_time_total / 1e3:7.1f} ms"
                        f"  {e.key[:100]}"
                    )


if __name__ == "__main__":
    main()
