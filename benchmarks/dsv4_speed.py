# Copyright © 2026 Apple Inc.
"""Prefill and decode speed of DeepSeek-V4 at Flash's per-layer sizes.

Builds the model from ``ModelArgs`` with random weights (Flash's hidden size,
heads, ranks, indexer and experts' sizes, fewer layers and experts) and drives
it as ``mlx_lm.generate.generate_step`` does: the prompt in 2,048-token chunks
with the cache evaluated between chunks, then decoding with ``async_eval``
pipelining (``--serial``: one step at a time). For each length it reports prefill and decode tokens/s, the peak
memory above the weights, and the primitives in one decode step's graph.

With ``--peer`` it runs mlx-vlm's ``deepseek_v4`` (0.7.10) on the same weights,
alternating with this model at each length, and prints the ratios.

    python benchmarks/dsv4_speed.py                       # 6 layers, 16 experts
    python benchmarks/dsv4_speed.py --peer                # beside mlx-vlm
    python benchmarks/dsv4_speed.py --bf16-vs-fp32        # logit error of bf16
    python benchmarks/dsv4_speed.py --layers 43 --experts 8 --long-decode 65536 \
        --report 512 --seconds 400                        # Flash's 43 layers
    python benchmarks/dsv4_speed.py --layers 43 --experts 8 --bits 4 --peer
                                                          # 4-bit, as convert -q
    python benchmarks/dsv4_speed.py --tiny --dtype float32 --prefill 256 \
        --decode 128 --peer                               # on a CPU

"of bandwidth" is the share of ``--bandwidth`` that the weights a decode
token reads take at the measured rate (1.0: bound by memory).

MLX's CPU backend multiplies gathered experts in float32 only. mlx-vlm picks
the indexer's top-k approximately (HISA) past 1,024 entries unless
``--peer-exact-indexer``.
"""

import argparse
import dataclasses
import functools
import importlib.util
import io
import math
import os
import re
import statistics
import sys
import time
import types
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

sys.path.insert(0, str(Path(__file__).parent))
from long_decode import CONFIGS, cache_arrays, graph_edges  # noqa: E402

FLASH = {
    "model_type": "deepseek_v4",
    "vocab_size": 129280,
    "hidden_size": 4096,
    "num_attention_heads": 64,
    "num_key_value_heads": 1,
    "head_dim": 512,
    "qk_rope_head_dim": 64,
    "q_lora_rank": 1024,
    "o_groups": 8,
    "o_lora_rank": 1024,
    "sliding_window": 128,
    "moe_intermediate_size": 2048,
    "n_shared_experts": 1,
    "routed_scaling_factor": 1.5,
    "swiglu_limit": 10.0,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "rms_norm_eps": 1e-6,
    "index_n_heads": 64,
    "index_head_dim": 128,
    "index_topk": 512,
    "num_hash_layers": 3,
    "rope_theta": 10000.0,
    "compress_rope_theta": 160000.0,
    "rope_scaling": {
        "type": "yarn",
        "factor": 16,
        "original_max_position_embeddings": 65536,
        "beta_fast": 32,
        "beta_slow": 1,
    },
    "max_position_embeddings": 1048576,
}

OVERRIDES = {
    "hidden": "hidden_size",
    "heads": "num_attention_heads",
    "head_dim": "head_dim",
    "rope_dim": "qk_rope_head_dim",
    "q_lora": "q_lora_rank",
    "o_groups": "o_groups",
    "o_lora": "o_lora_rank",
    "window": "sliding_window",
    "moe_intermediate": "moe_intermediate_size",
    "index_heads": "index_n_heads",
    "index_head_dim": "index_head_dim",
    "index_topk": "index_topk",
    "vocab": "vocab_size",
}

# --tiny: the widths of the demo's tiny model.
TINY = {k: CONFIGS["deepseek_v4"][k] for k in OVERRIDES.values()}


def make_config(args):
    """Flash's config at ``args``' sizes; a size ``args`` lacks is the
    default of this script's flag."""
    config = dict(FLASH)
    if getattr(args, "tiny", False):
        config.update(TINY)
    for flag, key in OVERRIDES.items():
        if getattr(args, flag, None) is not None:
            config[key] = getattr(args, flag)
    if getattr(args, "schedule", None):
        ratios = [int(r) for r in args.schedule.split(",")]
    elif args.layers == 43:
        ratios = [0, 0] + [4, 128] * 20 + [4]
    else:
        ratios = ([0] + [4, 128] * args.layers)[: args.layers]
    config["num_hidden_layers"] = len(ratios)
    config["compress_ratios"] = ratios
    config["n_routed_experts"] = args.experts
    per_token = getattr(args, "experts_per_token", 6)
    config["num_experts_per_tok"] = min(per_token, args.experts)
    config["num_hash_layers"] = min(config["num_hash_layers"], len(ratios))
    return config


def _in_rows(shape, make, rows=4096):
    """``make(shape)`` built ``rows`` rows at a time: MLX's CUDA backend fails
    to launch some kernels over very many rows."""
    parts = [
        make((min(rows, shape[0] - i), *shape[1:])) for i in range(0, shape[0], rows)
    ]
    return mx.concatenate(parts) if len(parts) > 1 else parts[0]


def random_weights(model, dtype, seed):
    """Random weights in ``dtype``; the parameters the model keeps in float32
    (its ``cast_predicate``) stay float32. Returns the flat weight list."""
    mx.random.seed(seed)
    keep = model.cast_predicate
    experts = model.args.n_routed_experts
    weights = []
    for name, p in tree_flatten(model.parameters()):
        if name.endswith("tid2eid"):
            # Distinct experts per token, as a hash table picks them.
            k = p.shape[1]
            p = _in_rows(
                p.shape,
                lambda s: mx.argsort(mx.random.uniform(shape=(s[0], experts)))[:, :k],
            )
        elif name.endswith(("_hc.fn", "hc_head.fn")):
            p = mx.random.normal(p.shape) * 0.01
        elif name.endswith(("_hc.base", "hc_head.base", ".ape", "attn_sink")):
            p = mx.random.normal(p.shape) * 0.1
        elif p.ndim >= 2:
            # nn.Linear's initialization, the router and embedding too.
            scale = p.shape[-1] ** -0.5
            p = _in_rows(p.shape, lambda s: mx.random.uniform(-scale, scale, s))
        if keep(name) and mx.issubdtype(p.dtype, mx.floating):
            p = p.astype(dtype)
        try:
            mx.eval(p)
        except RuntimeError as e:
            raise RuntimeError(f"{name} {p.shape} {p.dtype}: {e}") from e
        weights.append((name, p))
    return weights


def make_fork(config, weights=None, dtype=mx.bfloat16, seed=0):
    from mlx_lm.models.deepseek_v4 import Model, ModelArgs

    model = Model(ModelArgs.from_dict(config))
    if weights is None:
        weights = random_weights(model, dtype, seed)
    model.update(tree_unflatten(weights))
    mx.eval(model.parameters())
    # For inference, as load() leaves it (training runs the Sinkhorn loop).
    model.eval()
    return model


def device_name():
    """The device, and on CUDA whether MLX's CUDA graphs are on (they move a
    decode step's time by up to 3x: docs/benchmarks.md)."""
    name = str(mx.default_device())
    if mx.default_device() == mx.gpu and mx.cuda.is_available():
        # MLX reads the variable with atoi: anything but a nonzero number is off.
        value = re.match(r"\s*[+-]?\d+", os.environ.get("MLX_USE_CUDA_GRAPHS", "1"))
        off = not (value and int(value.group()))
        name += f", CUDA graphs {'off' if off else 'on'}"
        for var in ("MLX_CUDA_GRAPH_CACHE_SIZE", "MLX_MAX_OPS_PER_BUFFER"):
            if var in os.environ and not off:
                name += f", {var}={os.environ[var]}"
    return name


@functools.cache
def import_peer():
    """mlx-vlm's DeepSeek-V4 language model class and its config class.

    mlx_vlm's package ``__init__`` imports its whole generation stack
    (processors, opencv, its own mlx_lm needs); only the model modules are
    imported here, under empty parent packages.
    """
    spec = importlib.util.find_spec("mlx_vlm")
    if spec is None:
        raise SystemExit(
            "--peer needs mlx-vlm 0.7.10 on the path: pip download --no-deps "
            "mlx-vlm==0.7.10, unzip the wheel, add it to PYTHONPATH."
        )
    root = Path(spec.submodule_search_locations[0])
    for name, path in (
        ("mlx_vlm", root),
        ("mlx_vlm.models.deepseek_v4", root / "models" / "deepseek_v4"),
    ):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(path)]
            sys.modules[name] = package
    from mlx_vlm.models.deepseek_v4.config import ModelConfig
    from mlx_vlm.models.deepseek_v4.language import LanguageModel
    from mlx_vlm.version import __version__

    if __version__ != "0.7.10":
        print(f"warning: mlx-vlm {__version__}, not 0.7.10", file=sys.stderr)
    return LanguageModel, ModelConfig, __version__


def quantize(model, bits, group_size, paths=None):
    """Quantize ``model`` as ``mlx_lm.convert -q`` does (affine), or the
    modules at ``paths`` only; return the paths quantized."""
    import mlx.nn as nn

    from mlx_lm.utils import quantize_model

    if paths is None:
        quantize_model(model, {}, group_size, bits)
    else:
        nn.quantize(
            model, group_size, bits, class_predicate=lambda path, _: path in paths
        )
    return {p for p, m in model.named_modules() if "scales" in m}


def step_bytes(model):
    """The bytes of weights one decode token reads: every weight, the
    routed experts' in the share of experts a token picks, one embedding
    row. The caches' reads (under 1% at 32K here) are left out."""
    args = model.args
    share = args.num_experts_per_tok / args.n_routed_experts
    total = 0
    for name, value in tree_flatten(model.parameters()):
        if name.startswith("mtp."):
            # The MTP block runs only when drafting.
            continue
        if ".switch_mlp." in name:
            total += value.nbytes * share
        elif "embed_tokens" in name:
            total += value.nbytes / value.shape[0]
        else:
            total += value.nbytes
    return total


def make_peer(config, weights, exact_indexer=False, quantized=(), bits=4, group=64):
    """mlx-vlm's model holding the same arrays as this model (quantized at
    the same ``quantized`` paths)."""
    LanguageModel, ModelConfig, _ = import_peer()
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    if exact_indexer:
        # mlx-vlm picks the top-k from block summaries (HISA) past 1,024 entries.
        config = {**config, "index_block": 0}
    model = LanguageModel(
        ModelConfig(**{k: v for k, v in config.items() if k in names})
    )
    if quantized:
        done = quantize(model, bits, group, quantized)
        if done != quantized:
            raise SystemExit(
                "mlx-vlm cannot quantize the same modules: "
                f"{sorted(done ^ quantized)[:8]}"
            )
    # Both models name their parameters as mlx_lm's checkpoint does.
    mine = dict(weights)
    theirs = dict(tree_flatten(model.parameters()))
    problems = [
        f"{k}: ours {mine[k].shape if k in mine else None}, "
        f"mlx-vlm's {theirs[k].shape if k in theirs else None}"
        for k in sorted(set(mine) | set(theirs))
        if k not in mine or k not in theirs or mine[k].shape != theirs[k].shape
    ]
    if problems:
        raise SystemExit("Weights do not map onto mlx-vlm:\n  " + "\n  ".join(problems))
    model.update(tree_unflatten(weights))
    return model


def forward_fn(model, peer):
    if peer:
        return lambda inputs, cache: model(inputs, cache=cache).logits
    return lambda inputs, cache: model(inputs, cache=cache)


class Driver:
    """The loop of ``mlx_lm.generate.generate_step``: chunked prefill, greedy
    decoding pipelined with ``async_eval``."""

    def __init__(self, name, model, forward, prefill_step, serial=False):
        self.name = name
        self.model = model
        self.forward = forward
        self.prefill_step = prefill_step
        # One step at a time: each token evaluated before the next is built.
        self.serial = serial
        self.stream = mx.new_stream(mx.default_device())

    def _step(self, y, cache):
        with mx.stream(self.stream):
            logits = self.forward(y.reshape(1, -1), cache)[:, -1, :]
            return mx.argmax(logits, axis=-1).squeeze(0)

    def prefill(self, prompt, chunk_times=None):
        """A new cache holding ``prompt`` and the first token; the seconds of
        each chunk go to the list ``chunk_times`` where one is given."""
        cache = self.model.make_cache()
        with mx.stream(self.stream):
            while prompt.size > 1:
                tic = time.perf_counter()
                n = min(self.prefill_step, prompt.size - 1)
                self.forward(prompt[None, :n], cache)
                mx.eval(cache_arrays(cache))
                if chunk_times is not None:
                    chunk_times.append(time.perf_counter() - tic)
                prompt = prompt[n:]
                mx.clear_cache()
        y = self._step(prompt, cache)
        mx.eval(y)
        return cache, y

    def decode(self, y, cache, steps, report=None, phases=None):
        """``steps`` tokens after ``y``; calls ``report(n)`` after token n and
        stops early when it returns True. ``phases``, a list of three, gets
        the seconds spent building the steps' graphs, in ``async_eval`` and
        waiting for the tokens."""
        clock = time.perf_counter
        y = self._step(y, cache)
        mx.async_eval(y)
        for n in range(1, steps + 1):
            t0 = clock()
            if self.serial:
                y.item()
            t1 = t2 = t3 = clock()
            if n < steps:
                next_y = self._step(y, cache)
                t2 = clock()
                mx.async_eval(next_y)
                t3 = clock()
            y.item()
            if phases is not None:
                phases[0] += t2 - t1
                phases[1] += t3 - t2
                phases[2] += (t1 - t0) + (clock() - t3)
            if n % 256 == 0:
                mx.clear_cache()
            if report is not None and report(n):
                break
            if n < steps:
                y = next_y
        return y

    def step_primitives(self, y, cache):
        """Primitives behind one decode step's logits and cache, unevaluated."""
        mx.eval(y, cache_arrays(cache))
        with mx.stream(self.stream):
            logits = self.forward(y.reshape(1, 1), cache)
        f = io.StringIO()
        mx.export_to_dot(f, logits, *cache_arrays(cache))
        mx.eval(logits, cache_arrays(cache))
        return f.getvalue().count("shape=rectangle")


def measure(driver, length, steps, weight_bytes, decode):
    mx.random.seed(length)
    vocab = driver.model.args.vocab_size
    prompt = mx.random.randint(0, vocab, (length,)).astype(mx.int32)
    mx.eval(prompt)
    mx.clear_cache()
    mx.reset_peak_memory()
    tic = time.perf_counter()
    cache, y = driver.prefill(prompt)
    out = {
        "prefill": length / (time.perf_counter() - tic),
        "prefill_peak": mx.get_peak_memory() - weight_bytes,
    }
    if decode:
        mx.reset_peak_memory()
        # The first step is left out: it waits on the prefill's last work.
        y = driver.decode(y, cache, 1)
        tic = time.perf_counter()
        y = driver.decode(y, cache, steps)
        out["decode"] = steps / (time.perf_counter() - tic)
        out["decode_peak"] = mx.get_peak_memory() - weight_bytes
        out["primitives"] = driver.step_primitives(y, cache)
    del cache, y
    mx.clear_cache()
    return out


def parse_lengths(text):
    return [int(s) for s in text.split(",") if s]


def speed(args, config, drivers, weight_bytes, read):
    prefill, decode = parse_lengths(args.prefill), parse_lengths(args.decode)
    lengths = sorted(set(prefill) | set(decode))
    # Warm up: kernels are built on first use. Two chunks reach the paths
    # of a long context (the indexer's top-k past 512 entries).
    warmup = min(max(lengths), 2 * args.prefill_step) + 1
    warmup = mx.arange(warmup) % config["vocab_size"]
    for d in drivers:
        cache, y = d.prefill(warmup)
        d.decode(y, cache, 4)
        del cache, y
    if len(drivers) == 2:
        # The same function of the same weights, up to rounding.
        tokens = warmup[None, : min(lengths) + 1]
        a, b = (d.forward(tokens, d.model.make_cache()) for d in drivers)
        stats = ErrorStats()
        stats.add(a, b)
        print(f"fork vs peer logits, {tokens.size} tokens (peer reference): {stats}")
    runs = {}
    for length in lengths:
        # Repeats alternate the models; the table shows the medians.
        for _ in range(args.repeat):
            for d in drivers:
                r = measure(d, length, args.steps, weight_bytes, length in decode)
                runs.setdefault((d.name, length), []).append(r)
                line = f"  {d.name:5} {length:>6}: prefill {r['prefill']:9.1f} tok/s"
                if "decode" in r:
                    line += f", decode {r['decode']:7.1f} tok/s"
                print(line, flush=True)
    results = {
        key: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        for key, rs in runs.items()
    }
    for r in results.values():
        if "decode" in r:
            # The share of the memory bandwidth a decode step's weights take.
            r["bandwidth"] = r["decode"] * read / (args.bandwidth * 1e9)

    gb = 1 << 30
    columns = [
        ("prefill tok/s", "prefill", 1, "{:>10.1f}"),
        ("prefill peak GB", "prefill_peak", gb, "{:>10.3f}"),
        ("decode tok/s", "decode", 1, "{:>10.1f}"),
        ("decode peak GB", "decode_peak", gb, "{:>10.3f}"),
        ("of bandwidth", "bandwidth", 1, "{:>10.3f}"),
        ("primitives/step", "primitives", 1, "{:>10.0f}"),
    ]
    names = [d.name for d in drivers]
    print()
    print(
        "peak GB: peak memory above the weights; ratio: fork / peer"
        + (f"; medians of {args.repeat} runs" if args.repeat > 1 else "")
    )
    header = f"{'length':>6} {'metric':<16}" + "".join(f"{n:>10}" for n in names)
    print(header + (f"{'ratio':>10}" if len(names) == 2 else ""))
    for length in lengths:
        for title, key, scale, fmt in columns:
            values = [results[n, length].get(key) for n in names]
            if values[0] is None:
                continue
            row = f"{length:>6} {title:<16}"
            row += "".join(fmt.format(v / scale) for v in values)
            if len(values) == 2:
                row += f"{values[0] / values[1]:>10.2f}" if values[1] else ""
            print(row)


class ErrorStats:
    """Max relative logit error (max |a - b| / max |b| per position) and
    argmax agreement of logits ``a`` against reference logits ``b``, over
    calls. A position where either is not finite makes the error nan and is
    counted, on each side."""

    def __init__(self):
        self.error, self.agree, self.n = 0.0, 0, 0
        self.bad = [0, 0]

    def add(self, a, b):
        a, b = a.astype(mx.float32), b.astype(mx.float32)
        bad = [mx.logical_not(mx.isfinite(x).all(axis=-1)).sum().item() for x in (a, b)]
        self.bad = [s + n for s, n in zip(self.bad, bad)]
        err = mx.abs(a - b).max(axis=-1) / mx.abs(b).max(axis=-1)
        # Python's max() drops a nan that comes second, MLX's may too.
        err = math.nan if any(bad) else err.max().item()
        if math.isnan(err) or math.isnan(self.error):
            self.error = math.nan
        else:
            self.error = max(self.error, err)
        agree = (a.argmax(axis=-1) == b.argmax(axis=-1)).astype(mx.float32)
        self.agree += int(agree.sum().item())
        self.n += agree.size

    def __str__(self):
        line = (
            f"max relative error {self.error:.3e}, argmax agrees "
            f"{self.agree}/{self.n}"
        )
        if any(self.bad):
            line += f", not finite: {self.bad[0]} positions, reference {self.bad[1]}"
        return line


def bf16_vs_fp32(args, config, peer_wanted):
    """Max relative logit error of bf16 against float32, same weights."""
    model16 = make_fork(config, dtype=getattr(mx, args.dtype), seed=args.seed)
    weights16 = tree_flatten(model16.parameters())
    weights32 = [
        (k, v.astype(mx.float32) if mx.issubdtype(v.dtype, mx.floating) else v)
        for k, v in weights16
    ]

    # Each pair is built when its turn comes, the peer's on copies of the
    # weights: with mlx-vlm's models built beside it, the fork's logits on the
    # GPU went NaN once the top-k started (cause not found; alone they do not).
    def fork():
        return make_fork(config, weights32), model16

    def peer():
        def copies(weights):
            return [(k, mx.array(v)) for k, v in weights]

        exact = args.peer_exact_indexer
        return (
            make_peer(config, copies(weights32), exact),
            make_peer(config, copies(weights16), exact),
        )

    models = [("fork", fork, False)] + ([("peer", peer, True)] if peer_wanted else [])
    length = parse_lengths(args.prefill)[0]
    mx.random.seed(length)
    prompt = mx.random.randint(0, config["vocab_size"], (length,)).astype(mx.int32)

    print(f"{args.dtype} vs float32: {length}-token prefill, {args.steps} decode steps")
    for name, build, is_peer in models:
        m32, m16 = build()
        f32, f16 = forward_fn(m32, is_peer), forward_fn(m16, is_peer)
        c32, c16 = m32.make_cache(), m16.make_cache()
        stats = {"prefill": ErrorStats(), "decode": ErrorStats()}

        def add(phase, a, b):
            stats[phase].add(a, b)

        for i in range(0, length, args.prefill_step):
            chunk = prompt[None, i : i + args.prefill_step]
            l32, l16 = f32(chunk, c32), f16(chunk, c16)
            mx.eval(l32, l16, cache_arrays(c32), cache_arrays(c16))
            add("prefill", l16, l32)
            y = l32[:, -1].argmax(axis=-1)
        # Both follow float32's greedy tokens.
        for _ in range(args.steps):
            l32, l16 = f32(y[None], c32), f16(y[None], c16)
            mx.eval(l32, l16)
            add("decode", l16, l32)
            y = l32[:, -1].argmax(axis=-1)
        for phase, s in stats.items():
            print(f"  {name:5} {phase:8} {s}")


def long_decode(args, driver):
    prompt_len = parse_lengths(args.prefill)[0]
    mx.random.seed(0)
    prompt = mx.random.randint(0, driver.model.args.vocab_size, (prompt_len,))
    cache, y = driver.prefill(prompt.astype(mx.int32))
    print(f"long decode: {args.long_decode} tokens after a {prompt_len}-token prompt")
    print(f"{'tokens':>7} {'tok/s':>9} {'active GB':>10} {'cache GB':>9} {'graph':>6}")
    start = time.perf_counter()
    state = {"tic": start, "last": 0}

    def report(n):
        done = args.seconds and time.perf_counter() - start > args.seconds
        if n % args.report and n != args.long_decode and not done:
            return False
        toc = time.perf_counter()
        arrays = cache_arrays(cache)
        graph = max((graph_edges(a) for a in arrays), default=0)
        print(
            f"{n:>7} {(n - state['last']) / (toc - state['tic']):>9.1f} "
            f"{mx.get_active_memory() / 2**30:>10.2f} "
            f"{sum(a.nbytes for a in arrays) / 2**30:>9.2f} {graph:>6}",
            flush=True,
        )
        state["tic"], state["last"] = time.perf_counter(), n
        return done

    driver.decode(y, cache, args.long_decode, report)


def batch_step(args, model):
    """Decode step time of a batch of rows at different positions against
    one row (the fork only)."""
    prompt = parse_lengths(args.prefill)[0]

    def step_ms(batch):
        caches = []
        for i in range(batch):
            cache = model.make_cache()
            tokens = mx.random.randint(2, 200, (1, prompt + 7 * i))
            mx.eval(model(tokens, cache), cache_arrays(cache))
            caches.append(cache)
        if batch > 1:
            caches = [c[0].merge(list(c)) for c in zip(*caches)]
        else:
            caches = caches[0]
        y = mx.ones((batch, 1), dtype=mx.int32)
        for _ in range(5):
            mx.eval(model(y, caches))
        tic = time.perf_counter()
        for _ in range(args.steps):
            mx.eval(model(y, caches))
        return (time.perf_counter() - tic) / args.steps * 1e3

    mx.random.seed(args.seed)
    one = step_ms(1)
    many = step_ms(args.batch)
    print(f"decode step after {prompt} tokens: B=1 {one:.2f} ms, ", end="")
    print(f"B={args.batch} {many:.2f} ms, ratio {many / one:.2f}")


def speculative(args, config, driver):
    """What speculative decoding can gain: the time of one forward over k + 1
    tokens against one token at each --decode context, then greedy tok/s with
    a tiny random draft (2 layers, hidden 256) and with the model's own MTP
    block (random weights, so it drafts at chance) against plain decoding."""
    from mlx_lm.generate import generate_step, speculative_generate_step
    from mlx_lm.models.cache import trim_prompt_cache

    model = driver.model
    for context in parse_lengths(args.decode):
        mx.random.seed(context)
        prompt = mx.random.randint(0, config["vocab_size"], (context,))
        cache, y = driver.prefill(prompt.astype(mx.int32))
        times = {}
        for k in [1, 2, 3, 4, 5, 6] * 2:
            tokens = mx.broadcast_to(y.reshape(1, 1), (1, k))
            mx.eval(model(tokens, cache))
            trim_prompt_cache(cache, k)
            tic = time.perf_counter()
            for _ in range(8):
                mx.eval(model(tokens, cache))
                trim_prompt_cache(cache, k)
            times[k] = (time.perf_counter() - tic) / 8
        row = ", ".join(f"k+1={k} {times[k] / times[1]:.2f}" for k in range(2, 7))
        print(f"context {context}: one token {times[1] * 1e3:.1f} ms; {row}")

    draft_config = dict(config, hidden_size=256, num_hidden_layers=2)
    draft_config.update(compress_ratios=[0, 4], num_hash_layers=1)
    draft_config.update(moe_intermediate_size=256, n_routed_experts=4)
    draft_config.update(num_experts_per_tok=2, q_lora_rank=128, o_lora_rank=128)
    draft = make_fork(draft_config, dtype=getattr(mx, args.dtype), seed=1)
    context = parse_lengths(args.decode)[0]
    mx.random.seed(1)
    prompt = mx.random.randint(0, config["vocab_size"], (context,)).astype(mx.int32)
    for name, kwargs in (
        ("plain", None),
        ("draft k=3", dict(draft_model=draft, num_draft_tokens=3)),
        ("draft k=5", dict(draft_model=draft, num_draft_tokens=5)),
        ("mtp k=1", dict(mtp=True, num_draft_tokens=1)),
        ("mtp k=2", dict(mtp=True, num_draft_tokens=2)),
        ("mtp k=3", dict(mtp=True, num_draft_tokens=3)),
    ):
        if kwargs is None:
            steps = generate_step(prompt, model, max_tokens=args.steps)
        else:
            steps = speculative_generate_step(
                prompt, model, max_tokens=args.steps, **kwargs
            )
        accepted, tic = 0, None
        for n, item in enumerate(steps):
            if n == 0:
                tic = time.perf_counter()
            accepted += bool(item[-1]) if kwargs else 0
        rate = (n / (time.perf_counter() - tic)) if n else float("nan")
        extra = f", {accepted} of {n + 1} from the draft" if kwargs else ""
        print(f"{name:9} {rate:.1f} tok/s after a {context}-token prompt{extra}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=6, help="43: Flash's schedule")
    parser.add_argument(
        "--schedule", help="compress ratios, e.g. 0,4,128 (overrides --layers)"
    )
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--experts-per-token", type=int, default=6)
    parser.add_argument("--tiny", action="store_true", help="tiny sizes for a CPU")
    for flag in OVERRIDES:
        parser.add_argument("--" + flag.replace("_", "-"), type=int)
    parser.add_argument("--prefill", default="2048,16384,32768")
    parser.add_argument("--decode", default="1024,8192,32768")
    parser.add_argument("--steps", type=int, default=64, help="decode steps")
    parser.add_argument(
        "--serial",
        action="store_true",
        help="decode one step at a time (each token evaluated before the next "
        "step is built) instead of generate_step's pipelining",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per length and model (medians)"
    )
    parser.add_argument("--prefill-step", type=int, default=2048)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--peer", action="store_true", help="also mlx-vlm")
    parser.add_argument(
        "--peer-exact-indexer",
        action="store_true",
        help="turn off mlx-vlm's approximate (HISA) top-k selection",
    )
    parser.add_argument("--bf16-vs-fp32", action="store_true")
    parser.add_argument(
        "--bits", type=int, help="quantize both models (affine, as convert -q)"
    )
    parser.add_argument("--group-size", type=int, default=64)
    parser.add_argument(
        "--bandwidth",
        type=float,
        default=4800,
        help="the device's memory bandwidth, GB/s (H200: 4,800)",
    )
    parser.add_argument(
        "--long-decode", type=int, help="decode this many tokens after --prefill"
    )
    parser.add_argument("--report", type=int, default=4096)
    parser.add_argument(
        "--speculative", action="store_true", help="what speculative decoding gains"
    )
    parser.add_argument(
        "--batch", type=int, help="time a decode step of this many rows against one"
    )
    parser.add_argument(
        "--seconds", type=float, help="end the long decode after this long"
    )
    args = parser.parse_args()

    config = make_config(args)
    if args.speculative:
        # The MTP block after the layers, a CSA layer as Flash's.
        config["num_nextn_predict_layers"] = 1
        config["mtp"] = True
        config["compress_ratios"] = config["compress_ratios"] + [4]
    print(
        f"DeepSeek-V4: {config['num_hidden_layers']} layers "
        f"{config['compress_ratios']}, hidden {config['hidden_size']}, "
        f"{config['n_routed_experts']} experts top-{config['num_experts_per_tok']}, "
        f"{args.dtype}, device {device_name()}, "
        f"decode {'one step at a time' if args.serial else 'pipelined'}"
    )
    if args.peer:
        print(f"peer: mlx-vlm {import_peer()[2]} deepseek_v4, same weights")
    if args.bf16_vs_fp32:
        bf16_vs_fp32(args, config, args.peer)
        return

    dtype = getattr(mx, args.dtype)
    fork = make_fork(config, dtype=dtype, seed=args.seed)
    quantized = ()
    if args.bits:
        quantized = quantize(fork, args.bits, args.group_size)
        mx.eval(fork.parameters())
    weights = tree_flatten(fork.parameters())
    weight_bytes = sum(v.nbytes for _, v in weights)
    read = step_bytes(fork)
    print(
        f"weights {weight_bytes / 2**30:.2f} GB"
        + (f" ({args.bits}-bit affine, group {args.group_size})" if args.bits else "")
        + f", {read / 2**30:.2f} GB read a decode token: at "
        f"{args.bandwidth:g} GB/s at most {args.bandwidth * 1e9 / read:.0f} tok/s"
    )
    fork_forward = forward_fn(fork, False)
    drivers = [Driver("fork", fork, fork_forward, args.prefill_step, args.serial)]
    if args.long_decode:
        long_decode(args, drivers[0])
        return
    if args.batch:
        batch_step(args, fork)
        return
    if args.speculative:
        speculative(args, config, drivers[0])
        return
    if args.peer:
        peer = make_peer(
            config,
            weights,
            args.peer_exact_indexer,
            quantized,
            args.bits,
            args.group_size,
        )
        peer_forward = forward_fn(peer, True)
        drivers.append(
            Driver("peer", peer, peer_forward, args.prefill_step, args.serial)
        )
    speed(args, config, drivers, weight_bytes, read)


if __name__ == "__main__":
    main()
