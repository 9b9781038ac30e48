# Copyright © 2026 Apple Inc.
"""ArraysCache metadata during a long BatchGenerator decode, fork against 0.32.2.

A tiny random qwen3_5 with 48 linear-attention layers (Qwen3.8-27B's count)
decodes through ``BatchGenerator``, which evaluates only the tokens, as
``mlx_lm.server`` does. One request per variant, on the same weights; the
variants take turns, ``--every`` steps each. After each turn it prints the
variant's tokens/s, how much its active memory less the caches' ``nbytes`` has
grown since its first token, and the largest unevaluated graph behind any
``lengths`` or ``left_padding``; at the end, tokens/s and the ratio to 0.32.2.

Variants:
  pristine  ArraysCache as released in mlx-lm 0.32.2
  fork      this fork (arrays-cache and arrays-cache-zero-padding)
  depends   the fork's advance with 0.32.2's merge and extend: arrays-cache
            alone (merged empty caches keep their zero padding)
  pending   0.32.2 with the decrements kept as a Python int, subtracted when
            the metadata is read (the alternative to ``mx.depends``)

    python benchmarks/arrays_cache_decode.py
    python benchmarks/arrays_cache_decode.py --variants pristine,depends,pending,fork
"""

import argparse
import contextlib
import importlib.util
import inspect
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx
from long_decode import CONFIGS, graph_edges

from mlx_lm.generate import BatchGenerator
from mlx_lm.models import qwen3_5
from mlx_lm.models.cache import ArraysCache

# The demo's tiny qwen3_5 with Qwen3.8-27B's 48 linear-attention layers.
CONFIG = {
    **CONFIGS["qwen3_5"],
    "text_config": {**CONFIGS["qwen3_5"]["text_config"], "num_hidden_layers": 64},
}


def pristine_cache_path():
    """cache.py of the pinned release, through tools/fork.py."""
    tools = Path(__file__).resolve().parent.parent / "tools" / "fork.py"
    out = subprocess.run(
        [sys.executable, str(tools), "upstream-path"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip()) / "mlx_lm" / "models" / "cache.py"


def load_pristine_cache_module(path):
    # A module of mlx_lm.models, so that its relative imports resolve.
    spec = importlib.util.spec_from_file_location("mlx_lm.models._cache_0_32_2", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_pristine(path):
    return load_pristine_cache_module(path).ArraysCache


def pending_methods():
    """The metadata as an array plus a Python int of pending decrements."""

    def field(name):
        def get(self):
            a = self.__dict__.get("_" + name)
            n = self.__dict__.get("_" + name + "_pending", 0)
            return a if a is None or n == 0 else a - n

        def set_(self, value):
            self.__dict__["_" + name] = value
            self.__dict__["_" + name + "_pending"] = 0

        return property(get, set_)

    def advance(self, N):
        for name in ("lengths", "left_padding"):
            if self.__dict__.get("_" + name) is not None:
                self.__dict__["_" + name + "_pending"] += N

    return {
        "lengths": field("lengths"),
        "left_padding": field("left_padding"),
        "advance": advance,
    }


def _source(member):
    if isinstance(member, property):
        return "".join(_source(f) or "" for f in (member.fget, member.fset))
    member = getattr(member, "__func__", member)
    return inspect.getsource(member) if inspect.isfunction(member) else None


def changed_members(pristine):
    """The release's ArraysCache methods whose code the fork changed."""
    fork = vars(ArraysCache)
    return {
        k: v
        for k, v in vars(pristine).items()
        if _source(v) and _source(v) != _source(fork.get(k))
    }


@contextlib.contextmanager
def variant(name, pristine):
    """Swap the ArraysCache members of a variant in, then restore them."""
    members = {
        "fork": {},
        "pristine": changed_members(pristine),
        "depends": {k: vars(pristine)[k] for k in ("merge", "extend")},
        "pending": {
            **{k: vars(pristine)[k] for k in ("merge", "extend")},
            **pending_methods(),
        },
    }[name]
    saved = {k: vars(ArraysCache).get(k) for k in members}
    for k, v in members.items():
        setattr(ArraysCache, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                delattr(ArraysCache, k)
            else:
                setattr(ArraysCache, k, v)


def held_memory(gens):
    """Active memory less what the caches of all generators store."""
    stored = sum(c.nbytes for g in gens for c in g._generation_batch.prompt_cache)
    return mx.get_active_memory() - stored


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--every", type=int, default=250)
    parser.add_argument("--variants", default="pristine,fork")
    parser.add_argument(
        "--pristine-cache", help="cache.py of mlx-lm 0.32.2 (default: tools/fork.py)"
    )
    args = parser.parse_args()
    variants = args.variants.split(",")

    pristine = load_pristine(args.pristine_cache or pristine_cache_path())
    print("0.32.2 methods swapped in for pristine:", *sorted(changed_members(pristine)))
    mx.random.seed(0)
    model = qwen3_5.Model(qwen3_5.ModelArgs.from_dict(CONFIG))
    mx.eval(model.parameters())
    n_linear = sum(l.is_linear for l in model.layers)
    print(
        f"qwen3_5, {len(model.layers)} layers ({n_linear} linear), "
        f"{args.steps} decode steps, mlx {mx.__version__}, {mx.default_device()}"
    )

    # One request per variant. The variants take turns, a block of steps
    # each, in a rotating order, so that drift in the machine's speed is
    # shared; a variant's memory is the change over its own blocks.
    gens = {}
    for name in variants:
        gens[name] = BatchGenerator(
            model, stop_tokens=set(), max_tokens=args.steps + 10
        )
        gens[name].insert([[1, 2, 3, 4, 5, 6, 7, 8]])
        with variant(name, pristine):
            gens[name].next_generated()  # prefill and first token, not timed
    time_taken = {name: 0.0 for name in variants}
    held = {name: 0 for name in variants}
    done = 0
    print(f"\n{'step':>6} {'variant':>9} {'tok/s':>8} {'grown KB':>9} {'graph':>6}")
    while done < args.steps:
        n = min(args.every, args.steps - done)
        k = (done // args.every) % len(variants)
        for name in variants[k:] + variants[:k]:
            gen = gens[name]
            with variant(name, pristine):
                before = held_memory(gens.values())
                tic = time.perf_counter()
                for _ in range(n):
                    gen.next_generated()
                mx.eval(gen._generation_batch._next_tokens)
                toc = time.perf_counter()
                held[name] += held_memory(gens.values()) - before
                graph = max(
                    max(graph_edges(c.lengths), graph_edges(c.left_padding))
                    for c in gen._generation_batch.prompt_cache
                    if isinstance(c, ArraysCache)
                )
            time_taken[name] += toc - tic
            print(
                f"{done + n:>6} {name:>9} {n / (toc - tic):>8.1f} "
                f"{held[name] / 1e3:>+9.1f} {graph:>6}",
                flush=True,
            )
        done += n

    print(f"\n{'variant':>9} {'tok/s':>8} {'ratio':>6}")
    tps = {name: args.steps / t for name, t in time_taken.items()}
    for name in variants:
        ratio = tps[name] / tps["pristine"] if "pristine" in tps else float("nan")
        print(f"{name:>9} {tps[name]:>8.1f} {ratio:>6.3f}")
    for gen in gens.values():
        gen.close()


if __name__ == "__main__":
    main()
