# Copyright © 2026 Apple Inc.

"""Where the time of one DeepSeek-V4 prefill chunk goes, module by module.

Builds the model of ``dsv4_speed.py`` (Flash per-layer sizes, 6 layers, random
weights), prefills ``--context`` tokens, then runs one more chunk with every
module's inputs evaluated before it starts and its output after it ends, and
prints the time of each kind of module, summed over the layers. Modules nest
(a layer holds its attention, which holds the indexer), so the times overlap.
The evaluation barriers make the instrumented chunk slower than a plain one;
both are printed. ``--peer`` profiles mlx-vlm's model on the same weights
too (every module class of its own, by class name).

    python3 benchmarks/dsv4_profile.py --context 14336
    python3 benchmarks/dsv4_profile.py --context 0 --peer
"""

import argparse
import functools
import time

import mlx.core as mx
from dsv4_speed import (
    OVERRIDES,
    cache_arrays,
    forward_fn,
    make_config,
    make_fork,
    make_peer,
)
from mlx.utils import tree_flatten

from mlx_lm.models import deepseek_v4

TIMES = {}
ACTIVE = [False]


def _arrays(values):
    return [v for v in values if isinstance(v, mx.array)]


def timed(name_of, fn):
    """fn, timed under the name ``name_of(self)`` while ACTIVE."""

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        if not ACTIVE[0]:
            return fn(self, *args, **kwargs)
        mx.eval(_arrays(args), _arrays(kwargs.values()))
        mx.synchronize()
        tic = time.perf_counter()
        out = fn(self, *args, **kwargs)
        mx.eval(out)
        mx.synchronize()
        name = name_of(self)
        TIMES[name] = TIMES.get(name, 0.0) + time.perf_counter() - tic
        return out

    return wrapper


def instrument():
    D = deepseek_v4
    D.DecoderLayer.__call__ = timed(
        lambda m: f"layer ({m.attn.kind})", D.DecoderLayer.__call__
    )
    D.Attention.__call__ = timed(
        lambda m: f"attention ({m.kind})", D.Attention.__call__
    )
    for cls, method in (
        (D.Attention, "_banded"),
        (D.Attention, "_sparse"),
        (D.Attention, "_output"),
        (D.Compressor, "__call__"),
        (D.Indexer, "__call__"),
        (D.MoE, "__call__"),
        (D.HyperConnection, "collapse"),
    ):
        name = f"{cls.__name__}.{method}"
        setattr(cls, method, timed(lambda m, n=name: n, getattr(cls, method)))


def instrument_classes(model):
    """Times the ``__call__`` of each module class of ``model`` not yet timed
    and not one of mlx.nn's own."""
    seen = set()
    for _, m in model.named_modules():
        cls = type(m)
        wrapped = hasattr(cls.__call__, "__wrapped__")
        if cls in seen or wrapped or cls.__module__.startswith("mlx.nn"):
            continue
        seen.add(cls)
        cls.__call__ = timed(lambda m: type(m).__name__, cls.__call__)


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

    TIMES.clear()
    plain = chunk(args.context)
    ACTIVE[0] = True
    instrumented = chunk(args.context + args.chunk)
    ACTIVE[0] = False
    print(f"{name}: chunk of {args.chunk} after {args.context} tokens: {plain:.1f} ms")
    print(f"the next chunk, instrumented: {instrumented:.1f} ms")
    for key, seconds in sorted(TIMES.items(), key=lambda kv: -kv[1]):
        print(f"  {key:44s} {seconds * 1e3:8.1f} ms")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--context", type=int, default=14336)
    parser.add_argument("--chunk", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--tiny", action="store_true", help="tiny sizes for a CPU")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--peer", action="store_true", help="also mlx-vlm's model")
    args = parser.parse_args()
    for flag in OVERRIDES:
        setattr(args, flag, None)
    args.schedule, args.experts_per_token = None, 6

    config = make_config(args)
    model = make_fork(config, dtype=getattr(mx, args.dtype))
    print(
        f"{config['num_hidden_layers']} layers, {args.dtype}, device {mx.default_device()}"
    )
    instrument()
    instrument_classes(model)
    profile("fork", model, forward_fn(model, False), args, config["vocab_size"])
    if args.peer:
        peer = make_peer(config, tree_flatten(model.parameters()))
        instrument_classes(peer)
        profile("mlx-vlm", peer, forward_fn(peer, True), args, config["vocab_size"])


if __name__ == "__main__":
    main()
