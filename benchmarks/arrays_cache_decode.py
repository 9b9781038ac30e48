# Copyright © 2026 Apple Inc.
"""ArraysCache metadata during a long BatchGenerator decode, fork against 0.32.2.

A tiny random qwen3_5 with 48 linear-attention layers (Qwen3.8-27B's count)
decodes through ``BatchGenerator``, which evaluates only the tokens, as
``mlx_lm.server`` does. Every ``--every`` steps it prints, for each variant,
tokens/s of the last steps, active memory minus the caches' ``nbytes`` and the
largest unevaluated graph behind any ``lengths`` or ``left_padding``.

Variants, run one after the other on the same weights and prompts:
  pristine  ArraysCache as released in mlx-lm 0.32.2
  fork      this fork
  depends   the fork's advance alone (merged empty caches keep zero padding)
  pending   0.32.2 with the decrements kept as a Python int, subtracted when
            the metadata is read (the alternative to ``mx.depends``)

    python benchmarks/arrays_cache_decode.py
    python benchmarks/arrays_cache_decode.py --variants pristine,depends,pending,fork
"""

import argparse
import contextlib
import importlib.util
import inspect
import io
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import BatchGenerator

from mlx_lm.models import qwen3_5
from mlx_lm.models.cache import ArraysCache

CONFIG = {
    "model_type": "qwen3_5",
    "text_config": {
        "model_type": "qwen3_5_text",
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 64,
        "full_attention_interval": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "tie_word_embeddings": True,
    },
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


def load_pristine(path):
    # A module of mlx_lm.models, so that its relative imports resolve.
    spec = importlib.util.spec_from_file_location("mlx_lm.models._cache_0_32_2", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ArraysCache


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


def graph_edges(a):
    if a is None:
        return 0
    f = io.StringIO()
    mx.export_to_dot(f, a)
    return f.getvalue().count("->")


def run(model, steps, every, prompt):
    gen = BatchGenerator(model, stop_tokens=set(), max_tokens=steps + 1)
    gen.insert([prompt])
    rows, elapsed, done = [], 0.0, 0
    while done < steps:
        tic = time.perf_counter()
        for _ in range(min(every, steps - done)):
            gen.next_generated()
        batch = gen._generation_batch
        mx.eval(batch._next_tokens)
        elapsed_block = time.perf_counter() - tic
        n = min(every, steps - done)
        done += n
        elapsed += elapsed_block
        caches = batch.prompt_cache
        arrays = [c for c in caches if isinstance(c, ArraysCache)]
        graph = max(
            max(graph_edges(c.lengths), graph_edges(c.left_padding)) for c in arrays
        )
        held = mx.get_active_memory() - sum(c.nbytes for c in caches)
        rows.append((done, n / elapsed_block, held / 1e3, graph))
    gen.close()
    return rows, steps / elapsed


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
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    print(
        f"qwen3_5, {len(model.layers)} layers ({n_linear} linear), "
        f"{args.steps} decode steps, mlx {mx.__version__}, {mx.default_device()}"
    )

    totals = {}
    for name in variants:
        with variant(name, pristine):
            rows, tps = run(model, args.steps, args.every, prompt)
        totals[name] = tps
        print(f"\n{name}")
        print(f"{'step':>6} {'tok/s':>8} {'held KB':>9} {'graph':>6}")
        for step, block_tps, held, graph in rows:
            print(f"{step:>6} {block_tps:>8.1f} {held:>9.1f} {graph:>6}")
        mx.clear_cache()

    print(f"\n{'variant':>9} {'tok/s':>8} {'ratio':>6}")
    base = totals.get("pristine")
    for name, tps in totals.items():
        ratio = f"{tps / base:>6.3f}" if base else ""
        print(f"{name:>9} {tps:>8.1f} {ratio}")


if __name__ == "__main__":
    main()
