# Copyright © 2026 Apple Inc.
"""What each forward path of DeepSeek-V4 gains, measured in one process.

Each path beyond the base (one ``scaled_dot_product_attention`` a layer,
uncompiled helpers) is timed as it is and disabled by patching the model's
module: a compiled helper replaced by its plain function, ``_STEP_ROWS`` set
to 1, ``_QUERY_BLOCK`` made huge, ... The two variants alternate, ``--runs``
times each, on copies of one cache holding ``--context`` tokens: a decode
step (1 token), a verify of 2, 4 or 8 tokens, a prefill chunk of ``--chunk``
tokens. Each row: the path, the workload, ms with and without it (min /
median / max), the ratio of the medians (without / with: above 1, the path
gains) and, for prefill chunks, the peak memory of each. ``--only "A|B"``
runs the paths whose names contain A or B.

    python benchmarks/dsv4_paths.py --tiny --layers 43 --dtype float32  # CPU
    python benchmarks/dsv4_paths.py --layers 43                # Flash's widths

A path removed from the model is listed as removed.
"""

import argparse
import contextlib
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

sys.path.insert(0, str(Path(__file__).parent))
from dsv4_speed import make_config, make_fork  # noqa: E402

import mlx_lm.models.deepseek_v4 as dsv4  # noqa: E402

HUGE = 1 << 30


def plain_module():
    """A second copy of the model's module, built with ``mx.compile`` as the
    identity: its helpers are the plain functions of the compiled ones."""
    spec = importlib.util.find_spec("mlx_lm.models.deepseek_v4")
    plain = importlib.util.spec_from_file_location(
        "mlx_lm.models._deepseek_v4_plain", spec.origin
    )
    module = importlib.util.module_from_spec(plain)
    compile_ = mx.compile
    mx.compile = lambda f=None, **kwargs: (lambda g: g) if f is None else f
    try:
        plain.loader.exec_module(module)
    finally:
        mx.compile = compile_
    return module


PLAIN = plain_module()


@contextlib.contextmanager
def patched(owner, **values):
    """``owner``'s attributes set to ``values`` for the duration."""
    old = {k: getattr(owner, k) for k in values}
    for k, v in values.items():
        setattr(owner, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(owner, k, v)


def plain_helpers(*names):
    """Disable: the compiled helpers ``names`` as their plain functions."""
    return lambda: patched(dsv4, **{n: getattr(PLAIN, n) for n in names})


def dense_by_sdpa():
    """Disable the heads as rows of one matmul (L = 1): the query through
    ``scaled_dot_product_attention``, as longer inputs."""
    cls = dsv4.Attention
    dense = cls._dense

    def by_sdpa(self, q, window, pool, seen, rows):
        if q.shape[2] != 1:
            return dense(self, q, window, pool, seen, rows)
        sizes = self.window, window.shape[1] - 2
        keys = window if pool is None else mx.concatenate([window, pool], 1)
        if pool is None:
            mask = rows.window_mask(sizes)
        elif seen is None:
            mask = rows.keys_mask((*sizes, self.compressor.ratio))
        else:
            mask = mx.concatenate([rows.window_mask(sizes), seen], axis=-1)
        sinks = self.attn_sink.astype(q.dtype)
        return mx.fast.scaled_dot_product_attention(
            q,
            keys[:, None],
            keys[:, None],
            scale=self.scale,
            mask=mask[:, None],
            sinks=sinks,
        )

    return patched(cls, _dense=by_sdpa)


def hc_whole():
    """Disable the by-stream hyper-connections of L > 8: the whole
    [B, L, hc, ...] products of V4.1's ``collapse`` and ``expand``."""
    cls = dsv4.HyperConnection
    collapse, expand = cls.collapse, cls.expand

    def whole_collapse(self, streams):
        if streams.shape[1] <= dsv4._STEP_ROWS:
            return collapse(self, streams)
        pre, post, comb = self(streams)
        return dsv4.collapse(streams, pre), post, comb

    def whole_expand(self, x, streams, post, comb):
        if streams.shape[1] <= dsv4._STEP_ROWS:
            return expand(self, x, streams, post, comb)
        return dsv4.expand(x, streams, post, comb)

    return patched(cls, collapse=whole_collapse, expand=whole_expand)


# name, what disabling it does, the names the path needs, the workloads, and
# how to disable it.
PATHS = [
    (
        "step rows (L 2-8)",
        "_STEP_ROWS = 1",
        ["_STEP_ROWS"],
        ["verify2", "verify4", "verify8"],
        lambda: patched(dsv4, _STEP_ROWS=1),
    ),
    (
        "heads as rows (L = 1)",
        "sdpa in _dense",
        ["_sink_softmax"],
        ["decode"],
        dense_by_sdpa,
    ),
    (
        "compiled _sink_softmax",
        "plain",
        ["_sink_softmax"],
        ["decode"],
        plain_helpers("_sink_softmax"),
    ),
    (
        "compiled _pool_step",
        "plain _pool",
        ["_pool_step"],
        ["decode", "verify8"],
        plain_helpers("_pool_step"),
    ),
    (
        "compiled _route_step",
        "plain _route",
        ["_route_step"],
        ["decode", "verify8"],
        plain_helpers("_route_step"),
    ),
    (
        "compiled hc (L <= 8)",
        "plain",
        ["_mix_and_collapse", "_compiled_expand"],
        ["decode", "verify8"],
        plain_helpers("_mix_and_collapse", "_compiled_expand"),
    ),
    (
        "hc by stream (L > 8)",
        "V4.1's whole products",
        ["_collapse_by_stream"],
        ["prefill"],
        hc_whole,
    ),
    (
        "compiled hc by stream",
        "plain",
        ["_collapse_by_stream", "_expand_by_stream"],
        ["prefill"],
        plain_helpers("_collapse_by_stream", "_expand_by_stream"),
    ),
    (
        "query blocks (L > 128)",
        "_QUERY_BLOCK huge",
        ["_QUERY_BLOCK"],
        ["prefill"],
        lambda: patched(dsv4, _QUERY_BLOCK=HUGE),
    ),
    (
        "CSA _sparse gather (pool > _SPARSE_ENTRIES)",
        "the top-k as a mask on _dense",
        ["_SPARSE_ENTRIES"],
        ["verify8", "prefill"],
        lambda: patched(dsv4, _SPARSE_ENTRIES=HUGE),
    ),
    (
        "top-k in blocks of 512",
        "_TOP_K_BLOCK huge",
        ["_TOP_K_BLOCK"],
        ["prefill"],
        lambda: patched(dsv4, _TOP_K_BLOCK=HUGE),
    ),
]

# Paths the model takes past a size: measured with them taken at any size.
ENABLE = {
    "CSA _sparse gather (pool > _SPARSE_ENTRIES)": lambda: patched(
        dsv4, _SPARSE_ENTRIES=0
    ),
}

# Paths measured by this script and then removed from the model: name, what
# took their place.
REMOVED = [
    ("_output per token", "L 2-8 take the prompt's layout"),
    ("compiled _index_scores", "the plain function"),
    ("heads as rows (L 2-8), _rows_sink_softmax", "sdpa, as longer inputs"),
    ("compiled _rope_step", "_rope"),
]


def arrays(cache):
    return [
        a for _, a in tree_flatten([c.state for c in cache]) if isinstance(a, mx.array)
    ]


class Bench:
    def __init__(self, model, context, chunk, prefill_step, seed):
        self.model = model
        vocab = model.args.vocab_size
        mx.random.seed(seed)
        tokens = mx.random.randint(0, vocab, (context + chunk,)).astype(mx.int32)
        self.cache = model.make_cache()
        for i in range(0, context, prefill_step):
            model(tokens[None, i : min(i + prefill_step, context)], self.cache)
            mx.eval(arrays(self.cache))
        rest = tokens[context:]
        self.inputs = {
            "decode": rest[None, :1],
            "verify2": rest[None, :2],
            "verify4": rest[None, :4],
            "verify8": rest[None, :8],
            "prefill": rest[None, :chunk],
        }

    def time(self, workload):
        """ms of one forward on a copy of the context's cache, and the peak
        memory above what was in use before it (MB)."""
        cache = [c.copy() for c in self.cache]
        mx.eval(arrays(cache))
        mx.clear_cache()
        mx.reset_peak_memory()
        base = mx.get_active_memory()
        tic = time.perf_counter()
        mx.eval(self.model(self.inputs[workload], cache))
        ms = 1e3 * (time.perf_counter() - tic)
        return ms, (mx.get_peak_memory() - base) / 2**20


def spread(values):
    return min(values), statistics.median(values), max(values)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=43, help="43: Flash's schedule")
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--tiny", action="store_true", help="tiny widths for a CPU")
    parser.add_argument(
        "--context", help="tokens before, a comma list (tiny 256, else 4096)"
    )
    parser.add_argument("--chunk", type=int, help="prefill chunk (tiny 256, else 2048)")
    parser.add_argument("--prefill-step", type=int, default=2048)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--only", help="paths whose name contains one of these texts, split by |"
    )
    args = parser.parse_args()
    contexts = [int(c) for c in (args.context or "").split(",") if c] or [
        256 if args.tiny else 4096
    ]
    chunk = args.chunk or (256 if args.tiny else 2048)

    config = make_config(args)
    model = make_fork(config, dtype=getattr(mx, args.dtype), seed=args.seed)
    print(
        f"DeepSeek-V4 paths: {config['num_hidden_layers']} layers, hidden "
        f"{config['hidden_size']}, {config['num_attention_heads']} heads x "
        f"{config['head_dim']}, {config['n_routed_experts']} experts, "
        f"{args.dtype}, {mx.default_device()}; chunk {chunk}, "
        f"{args.runs} runs alternated; ratio = without / with (medians)"
    )
    header = (
        "| path | disabled as | context | workload | ms with (min/med/max) "
        "| ms without (min/med/max) | ratio | peak MB with / without |"
    )
    print(header)
    print("|---|---|---:|---|---|---|---:|---|")
    only = args.only.split("|") if args.only else []

    def chosen(name):
        return not only or any(o in name for o in only)

    for name, instead in REMOVED:
        if chosen(name):
            print(f"| {name} | removed: {instead} | | | | | | |")
    for context in contexts:
        bench = Bench(model, context, chunk, args.prefill_step, args.seed)
        for name, disabled, needs, workloads, disable in PATHS:
            if not chosen(name):
                continue
            missing = [n for n in needs if not hasattr(dsv4, n)]
            if missing:
                print(f"| {name} | removed ({', '.join(missing)}) | | | | | | |")
                continue
            for workload in workloads:
                enable = ENABLE.get(name, contextlib.nullcontext)
                row = measure(bench, workload, enable, disable, args.runs)
                print(f"| {name} | {disabled} | {context} | {workload} | {row} |")
        del bench
        mx.clear_cache()


def measure(bench, workload, enable, disable, runs):
    """The row's timings, ratio and peaks for one path and workload."""
    results = {True: [], False: []}
    # One warm-up each (compiled traces), then alternated runs.
    for i in range(runs + 1):
        order = (True, False) if i % 2 == 0 else (False, True)
        for on in order:
            if on:
                with enable():
                    result = bench.time(workload)
            else:
                with disable():
                    result = bench.time(workload)
            if i > 0:
                results[on].append(result)
    ms = {on: spread([r[0] for r in results[on]]) for on in results}
    peak = {on: max(r[1] for r in results[on]) for on in results}
    ratio = ms[False][1] / ms[True][1]
    peaks = f"{peak[True]:.0f} / {peak[False]:.0f}" if workload == "prefill" else ""
    return (
        f"{'/'.join(f'{v:.1f}' for v in ms[True])} "
        f"| {'/'.join(f'{v:.1f}' for v in ms[False])} "
        f"| {ratio:.2f} | {peaks}"
    )


if __name__ == "__main__":
    main()
