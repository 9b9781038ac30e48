# Copyright © 2026 Apple Inc.

"""Where the time of one DeepSeek-V4 prefill chunk or decode step goes.

Builds the model of ``dsv4_speed.py`` (Flash per-layer sizes, random weights)
and prefills ``--context`` tokens. By default it then runs one more chunk
with every module's inputs evaluated before it starts and its output after it
ends, and prints the time of each kind of module, summed over the layers.
The evaluation barriers make the instrumented chunk slower than a plain one;
both are printed.

``--decode`` profiles one decode step instead, as
``mlx_lm.generate.generate_step`` runs it: the host time to build the step's
graph (the Python forward, nothing evaluated), by module with no barriers
(means over ``--steps``); the time of ``mx.async_eval`` and of the wait for
the device after it, of a blocking ``mx.eval``, and of a pipelined step
(medians); and the primitives in the step's graph, by kind, per layer and by
module.

Modules nest (a layer holds its attention, which holds the indexer): "total"
times overlap, "self" times (less the timed modules inside) do not. ``--peer``
profiles mlx-vlm's model on the same weights too.

    python3 benchmarks/dsv4_profile.py --context 14336
    python3 benchmarks/dsv4_profile.py --context 0 --peer
    python3 benchmarks/dsv4_profile.py --decode --layers 43 --experts 8 \
        --context 1024 --peer
"""

import argparse
import collections
import functools
import io
import re
import statistics
import time

import mlx.core as mx
import mlx.nn as nn
from dsv4_speed import (
    Driver,
    cache_arrays,
    forward_fn,
    make_config,
    make_fork,
    make_peer,
)
from mlx.utils import tree_flatten

from mlx_lm.models import cache as cache_module
from mlx_lm.models import deepseek_v4 as model_module

# Methods timed besides each module's __call__, where a class defines them.
METHODS = ("collapse", "expand", "apply_branch", "_dense", "_sparse", "_output")
CACHE_METHODS = ("update_and_fetch", "update_pool", "forward_rows", "row_spans")
ROWS_METHODS = ("slots", "window_mask", "bands", "entries")


class Meter:
    """The host time of the wrapped calls by name, or what ``clock(args,
    kwargs, out)`` counts (``out`` None at the start): total, self (less the
    wrapped calls inside) and the number of calls."""

    def __init__(self, barriers=False, clock=None):
        self.barriers = barriers
        self.clock = clock or (lambda *_: time.perf_counter())
        self.active = False
        self.stack = []
        self.totals = collections.defaultdict(lambda: [0.0, 0.0, 0])
        self.restore = []

    def wrap(self, owner, attr, name_of):
        fn = owner.__dict__[attr]
        if getattr(fn, "metered", False):
            return

        @functools.wraps(fn)
        def wrapper(obj, *args, **kwargs):
            if not self.active:
                return fn(obj, *args, **kwargs)
            if self.barriers:
                mx.eval(_arrays(args), _arrays(kwargs.values()))
                mx.synchronize()
            self.stack.append(0.0)
            start = self.clock(args, kwargs, None)
            out = fn(obj, *args, **kwargs)
            if self.barriers:
                mx.eval(out)
                mx.synchronize()
            value = self.clock(args, kwargs, out) - start
            inner = self.stack.pop()
            if self.stack:
                self.stack[-1] += value
            entry = self.totals[name_of(obj)]
            entry[0] += value
            entry[1] += value - inner
            entry[2] += 1
            return out

        wrapper.metered = True
        setattr(owner, attr, wrapper)
        self.restore.append((owner, attr, fn))

    def unwrap(self):
        for owner, attr, fn in reversed(self.restore):
            setattr(owner, attr, fn)
        self.restore.clear()

    def take(self, unit=1.0):
        """{name: (total, self, calls)} since the last call, in ``unit``s."""
        out = {k: (t / unit, s / unit, n) for k, (t, s, n) in self.totals.items()}
        self.totals.clear()
        return out


def _arrays(values):
    return [v for v in values if isinstance(v, mx.array)]


def kind(attn):
    if "indexer" in attn:
        return "CSA"
    return "HCA" if "compressor" in attn else "sliding"


def labels(model):
    """A name for each module: its class, by attention kind in a layer."""
    names = {}
    for layer in model.layers:
        k = kind(layer.attn)
        names[id(layer)] = f"layer ({k})"
        names[id(layer.attn)] = f"attention ({k})"
        if "compressor" in layer.attn:
            names[id(layer.attn.compressor)] = f"compressor ({k})"
        if "indexer" in layer.attn:
            names[id(layer.attn.indexer)] = "indexer"
            names[id(layer.attn.indexer.compressor)] = "compressor (indexer)"
    return names


def instrument(meter, model, cache, rows=True):
    """Meters every module class of ``model`` (mlx.nn's too), the methods
    METHODS names, the cache's update methods and the rows' (if ``rows``)."""
    names = labels(model)

    def name_of(attr):
        def name(m):
            label = names.get(id(m), type(m).__name__)
            return label if attr == "__call__" else f"{label}.{attr}"

        return name

    for _, m in model.named_modules():
        for cls in type(m).__mro__:
            if cls in (nn.Module, dict, object):
                break
            for attr in ("__call__",) + METHODS:
                if attr in cls.__dict__:
                    meter.wrap(cls, attr, name_of(attr))
    # The caches' classes (both models nest theirs in ``caches``), and the
    # fork's rows, whose masks the layers share.
    classes = {type(o) for c in cache for o in (c, *getattr(c, "caches", ()))}
    # In the model's module (in the cache's before the review of 2026-12-04).
    where = model_module if hasattr(model_module, "WindowRows") else cache_module
    rows = getattr(where, "WindowRows", None) if rows else None
    for cls, methods in [(c, CACHE_METHODS) for c in classes] + [(rows, ROWS_METHODS)]:
        for base in cls.__mro__[:-1] if cls else ():
            for attr in methods:
                if attr in base.__dict__:
                    meter.wrap(base, attr, name_of(attr))


def print_table(totals, title, unit="ms"):
    print(f"  {title:38s} {'calls':>6} {'total ' + unit:>9} {'self ' + unit:>8}")
    for key, (total, own, calls) in sorted(totals.items(), key=lambda kv: -kv[1][0]):
        print(f"  {key:38s} {calls:>6.3g} {total:>9.2f} {own:>8.2f}")


def profile(name, model, forward, args, vocab):
    mx.random.seed(0)
    total = args.context + 2 * args.chunk
    prompt = mx.random.randint(0, vocab, (1, total))
    # Warm-up on a cache of its own: the first chunks compile kernels.
    cache = model.make_cache()
    for i in range(0, 2 * args.chunk, args.chunk):
        mx.eval(forward(prompt[:, i : i + args.chunk], cache))
    cache = model.make_cache()
    for i in range(0, args.context, args.chunk):
        forward(prompt[:, i : i + args.chunk], cache)
        mx.eval(cache_arrays(cache))

    def chunk(start):
        mx.synchronize()
        tic = time.perf_counter()
        mx.eval(forward(prompt[:, start : start + args.chunk], cache))
        mx.synchronize()
        return (time.perf_counter() - tic) * 1e3

    meter = Meter(barriers=True)
    instrument(meter, model, cache)
    plain = chunk(args.context)
    meter.active = True
    instrumented = chunk(args.context + args.chunk)
    meter.unwrap()
    print(f"{name}: chunk of {args.chunk} after {args.context} tokens: {plain:.1f} ms")
    print(f"the next chunk, instrumented: {instrumented:.1f} ms")
    print_table(meter.take(1e-3), "module")


def primitives(*arrays):
    """The kinds of the primitives behind ``arrays`` not yet evaluated, one
    each, from the DOT text of the graph (one node a primitive, however many
    outputs; compiled calls share the node's id, so it names no node)."""
    f = io.StringIO()
    mx.export_to_dot(f, *arrays)
    kinds = re.findall(r'\[label ="([^"]*)", shape=rectangle', f.getvalue())
    return collections.Counter(re.sub(r"^Compiled.*", "Compiled", k) for k in kinds)


def hooked_step(driver, y, cache, hook):
    """The driver's step after ``y``, each layer called through ``hook(call,
    i, layer, *args, **kwargs)``."""
    layers = driver.model.layers
    cls = type(layers[0])
    call = cls.__call__
    index = {id(layer): i for i, layer in enumerate(layers)}
    cls.__call__ = lambda m, *a, **k: hook(call, index[id(m)], m, *a, **k)
    try:
        return driver._step(y, cache)
    finally:
        cls.__call__ = call


def count_primitives(driver, y, cache):
    """The primitives of one decode step by kind, and those each layer adds
    (behind its output and its cache, less those behind the layers before);
    then, on the next step, by module in the last layer of each attention
    kind, built on evaluated inputs (the same primitives, a graph of its
    own)."""
    calls = []

    def record(call, i, layer, *args, **kwargs):
        inputs = cache_arrays([args, kwargs])
        out = call(layer, *args, **kwargs)
        calls.append((layer, inputs, out))
        return out

    # From evaluated caches: a cache array's pending work from earlier steps
    # is no part of this one.
    mx.eval(y, cache_arrays(cache))
    y = hooked_step(driver, y, cache, record)
    step = primitives(y, *cache_arrays(cache))
    # Before the layers: the embedding and the arrays the layers share.
    before = primitives(*calls[0][1])
    parts = [("before the layers", before)]
    for i, (layer, _, h) in enumerate(calls):
        upto = primitives(h, *cache_arrays(cache[: i + 1]))
        parts.append((kind(layer.attn), upto - before))
        before = upto
    parts.append(("after the layers", step - before))
    mx.eval(y, cache_arrays(cache))

    layer_cache = []

    def clock(args, kwargs, out):
        return primitives(*cache_arrays([args, kwargs, out, layer_cache])).total()

    meter = Meter(clock=clock)
    last = {kind(layer.attn): i for i, layer in enumerate(driver.model.layers)}
    by_module = {}

    def metered(call, i, layer, *args, **kwargs):
        if i not in last.values():
            return call(layer, *args, **kwargs)
        mx.eval(cache_arrays([args, kwargs]))
        layer_cache[:] = [cache[i]]
        meter.active = True
        out = call(layer, *args, **kwargs)
        meter.active = False
        by_module[kind(layer.attn)] = meter.take()
        return out

    instrument(meter, driver.model, cache, rows=False)
    try:
        mx.eval(hooked_step(driver, y, cache, metered), cache_arrays(cache))
    finally:
        meter.unwrap()
    return step, parts, by_module


def print_primitives(step, parts, by_module):
    layers = collections.defaultdict(list)
    for part, counts in parts[1:-1]:
        layers[part].append(counts)
    kinds = sorted(layers)
    print(f"  primitives in the step: {step.total()}", end="")
    for part, counts in parts[:: len(parts) - 1]:
        print(f"; {part}: {counts.total()}", end="")
    print(f"\n  per layer: {' '.join(str(c.total()) for _, c in parts[1:-1])}")
    header = "".join(f"{f'{k} ({len(layers[k])})':>14}" for k in kinds)
    print(f"  {'primitive':20s} {'step':>6}{header}  (per layer: mean)")
    for label, n in [("all", step.total())] + step.most_common():
        row = f"  {label:20s} {n:>6}"
        for k in kinds:
            total = sum(c.total() if label == "all" else c[label] for c in layers[k])
            row += f"{total / len(layers[k]):>14.1f}"
        print(row)
    for k, totals in sorted(by_module.items()):
        print_table(totals, f"primitives by module, one {k} layer", "")


def decode_profile(name, model, forward, args, vocab):
    driver = Driver(name, model, forward, args.chunk)
    stream = driver.stream
    mx.random.seed(0)
    prompt = mx.random.randint(0, vocab, (args.context + 1,)).astype(mx.int32)
    cache, y = driver.prefill(prompt)
    # Warm-up: the first steps compile kernels and traces.
    y = driver.decode(y, cache, args.warmup)

    def step(blocking):
        nonlocal y
        mx.synchronize(stream)
        t0 = time.perf_counter()
        next_y = driver._step(y, cache)
        t1 = time.perf_counter()
        (mx.eval if blocking else mx.async_eval)(next_y)
        t2 = time.perf_counter()
        mx.synchronize(stream)
        t3 = time.perf_counter()
        y = next_y
        return [(t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3]

    # The two ways alternate, so that a busy host slows both alike.
    runs = [step(i % 2 == 1) for i in range(2 * args.steps)]
    build, async_eval, wait = [statistics.median(c) for c in zip(*runs[::2])]
    eval_ms = statistics.median(r[1] for r in runs[1::2])
    tic = time.perf_counter()
    y = driver.decode(y, cache, args.steps)
    pipelined = (time.perf_counter() - tic) / args.steps * 1e3

    meter = Meter()
    instrument(meter, model, cache)
    meter.active = True
    metered = statistics.median(step(False)[0] for _ in range(args.steps))
    meter.unwrap()
    # Means (a compressor closes a window one step in its ratio).
    n = args.steps
    modules = {k: (t / n, s / n, c / n) for k, (t, s, c) in meter.take(1e-3).items()}

    print(f"{name}: one decode step after {args.context} tokens, ms (medians)")
    print(f"  build the graph {build:.2f}, with every module timed {metered:.2f}")
    print(f"  async_eval {async_eval:.2f}, then wait {wait:.2f}; or eval {eval_ms:.2f}")
    print(f"  pipelined (generate_step's loop): {pipelined:.2f} a step")
    print_table(modules, "module (host time to build)")
    print_primitives(*count_primitives(driver, y, cache))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--context", type=int, default=14336)
    parser.add_argument("--chunk", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=6, help="43: Flash's schedule")
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--tiny", action="store_true", help="tiny sizes for a CPU")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--peer", action="store_true", help="also mlx-vlm's model")
    parser.add_argument(
        "--peer-exact-indexer", action="store_true", help="mlx-vlm's exact top-k"
    )
    parser.add_argument("--decode", action="store_true", help="one decode step")
    parser.add_argument("--steps", type=int, default=10, help="decode steps timed")
    parser.add_argument("--warmup", type=int, default=4, help="decode steps first")
    args = parser.parse_args()

    config = make_config(args)
    model = make_fork(config, dtype=getattr(mx, args.dtype))
    print(
        f"{config['num_hidden_layers']} layers {config['compress_ratios']}, "
        f"{config['n_routed_experts']} experts, {args.dtype}, "
        f"device {mx.default_device()}, mlx {mx.__version__}"
    )
    run = decode_profile if args.decode else profile
    run("fork", model, forward_fn(model, False), args, config["vocab_size"])
    if args.peer:
        weights = tree_flatten(model.parameters())
        peer = make_peer(config, weights, args.peer_exact_indexer)
        run("mlx-vlm", peer, forward_fn(peer, True), args, config["vocab_size"])


if __name__ == "__main__":
    main()
