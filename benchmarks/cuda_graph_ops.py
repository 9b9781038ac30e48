# Copyright © 2026 Apple Inc.
"""Microseconds an op of DeepSeek-V4's decode step costs with MLX's CUDA
graphs on and off.

MLX's CUDA backend records the kernels of an evaluation into CUDA graphs of
``MLX_MAX_OPS_PER_BUFFER`` ops (100 on an H100 or H200) and launches a cached
executable where a graph's shape repeats; matmuls go through cuBLAS, whose
kernels it captures as child graphs. With ``MLX_USE_CUDA_GRAPHS=0`` each
kernel is launched on its own. On an H100 a 43-layer bf16 decode step took
about 2.8x as long with the graphs as without where a process alternated
several kinds of forwards (docs/benchmarks.md; dsv4_cuda_calls.py counts the
graph instantiations behind it). This
script times each kind of op the step runs, at Flash's widths, ``--copies``
independent calls in one evaluation, in child processes with the graphs on
and off, alternated ``--runs`` times, and prints the median microseconds a
call of each and their ratio: the kinds whose calls cost more with the
graphs are where the step's time goes.

    python3 benchmarks/cuda_graph_ops.py --runs 3
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import mlx.core as mx


def op_kinds(dtype):
    """name: (make the inputs of one call, the call); fp32 where the model
    computes in float32, ``dtype`` elsewhere."""
    bf16, f32 = dtype, mx.float32

    def normal(*shape, dtype=bf16):
        return lambda: mx.random.normal(shape).astype(dtype)

    def matmul(m, k, n, dtype=bf16):
        w = mx.random.normal((n, k)).astype(dtype) * 0.02
        return normal(m, k, dtype=dtype), lambda x: x @ w.T

    w4, s4, b4 = mx.quantize(mx.random.normal((1024, 4096)).astype(bf16) * 0.02)
    experts = mx.random.normal((8, 2048, 4096)).astype(bf16) * 0.02
    chosen = mx.array([[0, 2, 3, 5, 6, 7]], mx.uint32)
    norm = mx.ones((4096,), bf16)
    freqs = mx.random.uniform(shape=(32,))
    keys = mx.random.normal((1, 1, 1024, 512)).astype(bf16)
    pool = mx.zeros((1, 2048, 512), bf16)
    return {
        "matmul 1x4096 -> 1024": matmul(1, 4096, 1024),
        "matmul 1x1024 -> 32768": matmul(1, 1024, 32768),
        "matmul 4x4096 -> 1024": matmul(4, 4096, 1024),
        "matmul fp32 1x16384 -> 24": matmul(1, 16384, 24, f32),
        "matmul fp32 1x4096 -> 256": matmul(1, 4096, 256, f32),
        "quantized_matmul 4-bit 1x4096 -> 1024": (
            normal(1, 4096),
            lambda x: mx.quantized_matmul(x, w4, s4, b4, transpose=True),
        ),
        "gather_mm 6 of 8 experts": (
            normal(1, 1, 1, 4096),
            lambda x: mx.gather_mm(x, experts.swapaxes(-1, -2), rhs_indices=chosen),
        ),
        "rms_norm 4096": (
            normal(1, 4096),
            lambda x: mx.fast.rms_norm(x, norm, 1e-6),
        ),
        "rope 64 heads x 64": (
            normal(1, 64, 1, 64),
            lambda x: mx.fast.rope(
                x, 64, traditional=True, base=None, scale=1.0, offset=1024, freqs=freqs
            ),
        ),
        "softmax fp32 64 x 1024": (
            normal(1, 64, 1, 1024, dtype=f32),
            lambda x: mx.softmax(x, axis=-1, precise=True),
        ),
        "argpartition fp32 256": (
            normal(1, 256, dtype=f32),
            lambda x: mx.argpartition(-x, 5, axis=-1)[..., :6],
        ),
        "add 16384": (normal(1, 16384), lambda x: x + 1),
        "slice_update into a pool": (
            normal(1, 1, 512),
            lambda x: mx.slice_update(pool, x, mx.array([0, 1000, 0]), (0, 1, 2)),
        ),
        "sdpa 64 heads, 1 query, 1,024 keys": (
            normal(1, 64, 1, 512),
            lambda q: mx.fast.scaled_dot_product_attention(
                q, keys, keys, scale=0.04, mask=None
            ),
        ),
    }


def child(args):
    mx.random.seed(0)
    out = {}
    for name, (make, call) in op_kinds(getattr(mx, args.dtype)).items():
        inputs = [make() for _ in range(args.copies)]
        mx.eval(inputs)
        times = []
        for trial in range(args.trials + 1):
            mx.synchronize()
            tic = time.perf_counter()
            mx.eval([call(x) for x in inputs])
            elapsed = time.perf_counter() - tic
            # The first warms up (kernels compiled, graphs instantiated).
            if trial:
                times.append(elapsed / args.copies * 1e6)
        out[name] = statistics.median(times)
    print(json.dumps(out))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="processes a setting")
    parser.add_argument("--copies", type=int, default=240, help="calls an eval")
    parser.add_argument("--trials", type=int, default=5, help="evals a process")
    parser.add_argument("--dtype", default="bfloat16", help="float32 on a CPU")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    settings = {"graphs": "1", "no graphs": "0"}
    runs = {name: [] for name in settings}
    for _ in range(args.runs):
        for name, value in settings.items():
            env = dict(os.environ, MLX_USE_CUDA_GRAPHS=value)
            cmd = [sys.executable, __file__, "--child"]
            cmd += ["--copies", str(args.copies), "--trials", str(args.trials)]
            cmd += ["--dtype", args.dtype]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if done.returncode:
                sys.exit(done.stderr)
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(
        f"{mx.default_device()}: microseconds a call, {args.copies} calls an "
        f"evaluation, {args.dtype}, medians of {args.runs} processes a setting "
        "(alternated)"
    )
    print(f"{'':40} {'graphs':>9} {'no graphs':>10} {'ratio':>7}")
    for op in runs["graphs"][0]:
        on, off = (statistics.median(r[op] for r in runs[n]) for n in settings)
        print(f"{op:40} {on:>9.1f} {off:>10.1f} {on / off:>7.2f}")


if __name__ == "__main__":
    main()
