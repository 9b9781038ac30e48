# Copyright © 2026 Apple Inc.
"""The hyper-connection kernels against the ops, in one process on the same
weights (branch hc-kernels, issue 19).

First the logits of a tiny float32 model (every expert routed, every pool
entry picked, so no top-k choice flips), kernels against ops; then decode
rates alternating the variants, e.g.

    cd benchmarks
    python dsv4_kernels_ab.py 6,16,3,64,hc+none 43,8,3,24,hc+none

(layers, experts, repeats after a first one left out, steps, variants).
Each line also gives one unpipelined step: build, async_eval, the wait.
``loops:43,8,2,24`` times generate_step's pipelined loop against one step at
a time and against the loop with the caches not tied to the logits.
float32 matmuls run at full precision here (MLX_ENABLE_TF32=0): with TF32,
the two variants' float32 logits differ by the TF32 rounding.
"""

import os

os.environ.setdefault("MLX_ENABLE_TF32", "0")

import statistics
import sys
import time
import types

import mlx.core as mx

sys.path.insert(0, ".")
import dsv4_speed as S

from mlx_lm.models import deepseek_v4 as V4
from mlx_lm.models import deepseek_v41 as V41

KERNELS = {"hc": True, "none": False}


def use(variant):
    """ "hc": the kernels (collapse and expand), "none": the ops."""
    V4._HC_KERNELS = KERNELS[variant]


def numerics():
    # Every expert routed and every pool entry picked: no top-k choice can
    # flip on a rounding difference.
    a = types.SimpleNamespace(tiny=True, layers=6, experts=6, index_topk=512)
    config = S.make_config(a)
    model = S.make_fork(config, dtype=mx.float32)
    prompt = mx.arange(300)[None] % config["vocab_size"]
    out = {}
    for v in ("none", "hc"):
        use(v)
        cache = model.make_cache()
        full = model(prompt, cache=cache)
        steps = [model(prompt[:, i : i + 1] * 0 + 7, cache=cache) for i in range(8)]
        out[v] = mx.concatenate([full, *steps], axis=1)
        mx.eval(out[v])
    d = mx.abs(out["hc"] - out["none"]).max().item()
    print(
        f"float32 tiny 6 layers, kernels vs ops: max |logit diff| {d:.2e} (logits up to {mx.abs(out['none']).max().item():.2f})",
        flush=True,
    )


def flash_driver(layers, experts):
    """Random bf16 weights at Flash's per-layer sizes, dsv4_speed's driver and
    a 1,024-token prompt."""
    a = types.SimpleNamespace(layers=layers, experts=experts)
    config = S.make_config(a)
    model = S.make_fork(config)
    d = S.Driver("fork", model, S.forward_fn(model, False), 2048)
    return model, d, mx.arange(1024) % config["vocab_size"]


def run(layers, experts, reps, steps, variants):
    model, d, prompt = flash_driver(layers, experts)
    res = {v: [] for v in variants}
    prims = {}
    for r in range(reps + 1):
        for v in variants:
            use(v)
            cache, y = d.prefill(prompt)
            y = d.decode(y, cache, 4)
            tic = time.perf_counter()
            y = d.decode(y, cache, steps)
            rate = steps / (time.perf_counter() - tic)
            _, (b, e, w) = timed_decode(d, y, cache, 8, pipelined=False)
            if v not in prims:
                prims[v] = d.step_primitives(y, cache)
            if r:
                res[v].append(rate)
            print(
                f"  {layers} layers {v}: {rate:.1f} tok/s; build {b:.2f} ms, async_eval {e:.2f}, wait {w:.2f}; primitives {prims[v]}",
                flush=True,
            )
            del cache, y
    base = statistics.median(res[variants[-1]])
    print(
        f"{layers} layers: "
        + ", ".join(
            f"{v} {statistics.median(res[v]):.1f} ({statistics.median(res[v]) / base:.3f})"
            for v in variants
        ),
        flush=True,
    )
    del model, d
    mx.clear_cache()


def timed_decode(d, y, cache, steps, pipelined, tie=True):
    """Decode ``steps`` tokens; the medians of each step's build, async_eval
    and the wait for its token, ms, and the tokens a second. ``tie=False``:
    the cache arrays are not tied to the logits (mx.depends a no-op) but
    evaluated with the token."""
    from long_decode import cache_arrays

    depends = mx.depends
    if not tie:
        mx.depends = lambda a, b: a

    def step(y):
        t0 = time.perf_counter()
        nxt = d._step(y, cache)
        t1 = time.perf_counter()
        mx.async_eval(nxt, *([] if tie else cache_arrays(cache)))
        return nxt, t1 - t0, time.perf_counter() - t1

    parts = []
    try:
        tic = time.perf_counter()
        if pipelined:
            y, b, e = step(y)
            for n in range(steps):
                nxt, b, e = step(y) if n < steps - 1 else (None, 0, 0)
                t0 = time.perf_counter()
                y.item()
                parts.append((b, e, time.perf_counter() - t0))
                y = nxt
        else:
            for _ in range(steps):
                y, b, e = step(y)
                t0 = time.perf_counter()
                y.item()
                parts.append((b, e, time.perf_counter() - t0))
        rate = steps / (time.perf_counter() - tic)
    finally:
        mx.depends = depends
    med = [statistics.median(p[i] for p in parts[:-1]) * 1e3 for i in range(3)]
    return rate, med


def loops(layers, experts, reps, steps):
    """generate_step's pipelined loop against one step at a time (the ops),
    and pipelined without tying the caches to the logits."""
    model, d, prompt = flash_driver(layers, experts)
    use("none")
    kinds = (
        ("pipelined", True, True),
        ("serial", False, True),
        ("untied", True, False),
    )
    for _ in range(reps + 1):
        for name, pipelined, tie in kinds:
            cache, y = d.prefill(prompt)
            y = d.decode(y, cache, 4)
            rate, (b, e, w) = timed_decode(d, y, cache, steps, pipelined, tie)
            print(
                f"  {layers} layers {name}: {rate:.1f} tok/s; a step: build {b:.2f}"
                f" ms, async_eval {e:.2f}, wait for the token {w:.2f}",
                flush=True,
            )
            del cache, y
    del model, d
    mx.clear_cache()


numerics()
x = mx.random.normal((2, 5, 1, 300))
h = mx.broadcast_to(x, (2, 5, 4, 300))
args = V41.ModelArgs(hidden_size=300, hc_mult=4)
hc = V4.HyperConnection(args)
hc.fn = 0.5 * mx.random.normal(hc.fn.shape)
hc.base = mx.random.normal(hc.base.shape)
got = hc.collapse(h)
use("none")
want = hc.collapse(h)
use("hc")
print(
    "broadcast streams:",
    [f"{mx.abs(g - w).max().item():.2e}" for g, w in zip(got, want)],
    flush=True,
)
for spec in sys.argv[1:]:
    if spec.startswith("loops:"):
        loops(*map(int, spec[len("loops:") :].split(",")))
        continue
    layers, experts, reps, steps, variants = spec.split(",")
    run(int(layers), int(experts), int(reps), int(steps), variants.split("+"))
