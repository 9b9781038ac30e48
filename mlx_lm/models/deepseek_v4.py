# Copyright © 2026 Apple Inc.

import re
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Dict, List, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx.nn.layers.distributed import shard_inplace, shard_linear, sum_gradients

from . import deepseek_v41
from .base import BaseModelArgs
from .cache import CompressorCache, SharedWindowCache, WindowCompressorCache
from .deepseek_v41 import (
    DeepseekV41SwiGLU,
    SharedMLP,
    collapse,
    expand,
    mix_logits,
    mixes,
    repack_quantized,
)
from .pipeline import PipelineMixin
from .rope_utils import YarnRoPE
from .switch_layers import SwitchGLU, SwitchLinear

SLIDING = "sliding_attention"
CSA = "compressed_sparse_attention"
HCA = "heavily_compressed_attention"
_QUERY_BLOCK = 128
_TOP_K_BLOCK = 512
# Prompts over a CSA pool of more entries gather each query's own keys.
_SPARSE_ENTRIES = 6144
# Forwards of up to this many tokens (decode, verify) take the compiled helpers.
_STEP_ROWS = 8

TOKENIZER_DEFAULTS = {
    "chat_template_type": "deepseek_v4",
    "tool_parser_type": "deepseek_v4",
}


@dataclass
class ModelArgs(BaseModelArgs):
    model_type: str = "deepseek_v4"
    vocab_size: int = 129280
    hidden_size: int = 4096
    num_hidden_layers: int = 43
    num_attention_heads: int = 64
    num_key_value_heads: int = 1
    head_dim: int = 512
    qk_rope_head_dim: Optional[int] = None
    partial_rotary_factor: Optional[float] = None
    q_lora_rank: int = 1024
    o_groups: int = 8
    o_lora_rank: int = 1024
    sliding_window: int = 128
    moe_intermediate_size: int = 2048
    n_routed_experts: int = 256
    num_experts_per_tok: int = 6
    scoring_func: str = "sqrtsoftplus"
    routed_scaling_factor: float = 1.5
    norm_topk_prob: bool = True
    swiglu_limit: float = 10.0
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    rms_norm_eps: float = 1e-6
    index_n_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = 512
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    rope_scaling: Optional[Dict[str, Any]] = None
    rope_parameters: Optional[Dict[str, Any]] = None
    max_position_embeddings: int = 1048576
    compress_ratios: Optional[List[int]] = None
    num_hash_layers: Optional[int] = None
    layer_types: Optional[List[str]] = None
    compress_rates: Optional[Dict[str, int]] = None
    mlp_layer_types: Optional[List[str]] = None
    quantization_config: Optional[Dict[str, Any]] = None

    def __post_init__(self):
        n = self.num_hidden_layers
        rates = {CSA: 4, HCA: 128}
        ratios = self.compress_ratios
        if ratios is not None:
            # DeepSeek's list may end with the MTP layer's ratio.
            if len(ratios) < n:
                raise ValueError(f"`compress_ratios` needs {n} ratios: {ratios}.")
            ratios = ratios[:n]
            rates[HCA] = next((r for r in ratios if r not in (0, 4)), rates[HCA])
            if self.layer_types is None:
                kinds = {0: SLIDING, 4: CSA}
                self.layer_types = [kinds.get(r, HCA) for r in ratios]
        elif self.layer_types is None:
            raise ValueError("DeepSeek-V4 needs `layer_types` or `compress_ratios`.")
        self.compress_rates = {**rates, **(self.compress_rates or {})}
        if self.mlp_layer_types is None:
            hashed = 3 if self.num_hash_layers is None else self.num_hash_layers
            self.mlp_layer_types = ["hash_moe"] * hashed + ["moe"] * (n - hashed)
        for name, allowed in (
            ("layer_types", (SLIDING, CSA, HCA)),
            ("mlp_layer_types", ("hash_moe", "moe")),
        ):
            types = list(getattr(self, name))[:n]
            if len(types) != n or not set(types) <= set(allowed):
                raise ValueError(
                    f"`{name}` needs {n} entries from {allowed}: "
                    f"{getattr(self, name)}."
                )
            setattr(self, name, types)
        for i, (kind, ratio) in enumerate(zip(self.layer_types, ratios or ())):
            if ratio != self.compress_rates.get(kind, 0):
                raise ValueError(
                    f"`compress_ratios` and `layer_types` disagree on layer {i}: "
                    f"ratio {ratio}, but {kind} (rates {self.compress_rates})."
                )
        if self.qk_rope_head_dim is None:
            factor = self.partial_rotary_factor or 64 / 512
            self.qk_rope_head_dim = int(self.head_dim * factor)
        rope, groups = self.qk_rope_head_dim, self.o_groups
        for bad, message in (
            (self.scoring_func != "sqrtsoftplus", "`scoring_func` is not sqrtsoftplus"),
            (self.num_key_value_heads != 1, "`num_key_value_heads` is not 1"),
            (min(self.compress_rates.values()) < 1, "`compress_rates` are below 1"),
            (
                rope > self.head_dim or rope % 2,
                f"`qk_rope_head_dim` {rope} is odd or above `head_dim`",
            ),
            (
                self.num_experts_per_tok > self.n_routed_experts,
                "`num_experts_per_tok` is more than `n_routed_experts`",
            ),
            (
                self.num_attention_heads % groups,
                f"`o_groups` {groups} does not divide `num_attention_heads`",
            ),
        ):
            if bad:
                raise ValueError(f"Invalid DeepSeek-V4 config: {message}.")
        params = self.rope_parameters or {}
        if isinstance(params.get("compress"), dict):
            self.rope_theta = params["main"].get("rope_theta", self.rope_theta)
            params = params["compress"]
            self.compress_rope_theta = params.get(
                "rope_theta", self.compress_rope_theta
            )
        scaling = params or self.rope_scaling or {}
        yarn = scaling.get("rope_type", scaling.get("type")) == "yarn"
        self.rope_scaling = scaling if yarn else None


def make_rope(args: ModelArgs, compressed: bool) -> YarnRoPE:
    if not compressed:
        return YarnRoPE(
            dims=args.qk_rope_head_dim, traditional=True, base=args.rope_theta
        )
    scaling = args.rope_scaling or {}
    original = scaling.get(
        "original_max_position_embeddings", args.max_position_embeddings
    )
    return YarnRoPE(
        dims=args.qk_rope_head_dim,
        traditional=True,
        base=args.compress_rope_theta,
        scaling_factor=float(scaling.get("factor", 1.0)),
        original_max_position_embeddings=int(original),
        beta_fast=int(scaling.get("beta_fast", 32)),
        beta_slow=int(scaling.get("beta_slow", 1)),
        # DeepSeek-V4 uses attention_factor=1 for its YaRN RoPE.
        mscale=0.0,
        mscale_all_dim=0.0,
    )


def _rope_freqs(args: ModelArgs, compressed: bool, dims: int) -> mx.array:
    freqs = make_rope(args, compressed).freqs
    # An infinite period leaves a pair unrotated: positions rotate the last dims.
    return mx.concatenate([mx.full((dims // 2 - freqs.size,), mx.inf), freqs])


def _rope(x, freqs, offset, scale=1.0):
    dims = x.shape[-1]
    return mx.fast.rope(
        x, dims, traditional=True, base=None, scale=scale, offset=offset, freqs=freqs
    )


def _memoize(method):
    def wrapper(self, arg):
        key = (method.__name__, arg)
        if key not in self._memo:
            self._memo[key] = method(self, arg)
        return self._memo[key]

    return wrapper


class WindowRows:
    """Where each row's tokens of a forward sit: ``starts[b]:ends[b]`` are
    real (the rest padding), the first at position ``offsets[b]``."""

    def __init__(self, offsets, starts, ends, length):
        self.offsets, self.starts, self.ends = offsets, starts, ends
        self.counts = [e - s for s, e in zip(starts, ends)]
        self.length = length
        j = mx.arange(length)
        self.offset = mx.array(offsets)[:, None]
        self.start = mx.array(starts)[:, None]
        self.end = mx.array(ends)[:, None]
        self.shift = mx.array([o - s for o, s in zip(offsets, starts)])
        self.pos = self.shift[:, None] + j
        self.real = (j >= self.start) & (j < self.end)
        self._j = j
        self._memo = {}

    @_memoize
    def slots(self, size):
        keep = self.real & (self._j >= self.end - size)
        return mx.where(keep, self.pos % size, size)

    @_memoize
    def slot_index(self, sizes):
        size, width = sizes
        slots = self.slots(size)[..., None]
        return mx.broadcast_to(slots, (*slots.shape[:2], width))

    def _fetched(self, pos, capacity):
        shape = (-1,) + (1,) * (pos.ndim - 1)
        offset, start = self.offset.reshape(shape), self.start.reshape(shape)
        index = mx.where(
            pos >= offset, capacity + 1 + pos - offset + start, pos % capacity
        )
        return mx.minimum(index, capacity + self.length)

    @_memoize
    def window_mask(self, sizes):
        window, capacity = sizes
        s = mx.arange(capacity + 1)
        # Slot s holds the last position before the new tokens that is s mod
        # capacity; the extra slot nothing.
        kept = s + capacity * ((self.offset - 1 - s) // capacity)
        kept = mx.where(s < capacity, kept, -1)
        keys = mx.concatenate([kept, mx.where(self.real, self.pos, -1)], axis=1)
        keys, q = keys[:, None], self.pos[..., None]
        return (keys >= 0) & (keys <= q) & (keys > q - window)

    @_memoize
    def window_rows(self, sizes):
        window, capacity = sizes
        pos = self.pos[..., None] - window + 1 + mx.arange(window)
        return self._fetched(pos, capacity), pos >= 0

    @_memoize
    def bands(self, sizes):
        window, capacity, block = sizes
        blocks = -(-self.length // block)
        first = self.shift[:, None, None] + block * mx.arange(blocks)[:, None]
        pos = first - window + 1 + mx.arange(block + window - 1)
        q = (first + mx.arange(block))[..., None]
        k = pos[:, :, None]
        return self._fetched(pos, capacity), (k >= 0) & (k <= q) & (k > q - window)

    @_memoize
    def entries(self, ratio):
        n = max((o + c) // ratio for o, c in zip(self.offsets, self.counts))
        return n, (self.pos + 1) // ratio

    @_memoize
    def pool_mask(self, ratio):
        n, visible = self.entries(ratio)
        return mx.arange(n) < visible[..., None]

    @_memoize
    def keys_mask(self, sizes):
        window, capacity, ratio = sizes
        mask = self.window_mask((window, capacity))
        if ratio is None:
            return mask
        return mx.concatenate([mask, self.pool_mask(ratio)], axis=-1)

    @_memoize
    def windows(self, sizes):
        ratio, span, before = sizes
        first = [o // ratio for o in self.offsets]
        closed = max(
            (o + c) // ratio - f for o, c, f in zip(self.offsets, self.counts, first)
        )
        if closed == 0:
            return first, 0, None, None
        pos = (mx.array(first)[:, None] - before) * ratio + mx.arange(
            (closed + before) * ratio
        )
        idx = mx.where(
            pos < self.offset,
            mx.where(pos < 0, span, pos % span),
            span + 1 + pos - self.offset + self.start,
        )
        # A row that closes fewer windows pools garbage into slots it has not
        # reached; they are masked until it overwrites them.
        idx = mx.minimum(idx, span + self.length)[..., None]
        return first, closed, pos, idx


class Compressor(nn.Module):
    def __init__(self, args: ModelArgs, ratio: int, head_dim: int, overlap: bool):
        super().__init__()
        self.ratio = ratio
        self.overlap = overlap
        width = 2 * head_dim if overlap else head_dim
        self.wkv = nn.Linear(args.hidden_size, width, bias=False)
        self.wgate = nn.Linear(args.hidden_size, width, bias=False)
        self.ape = mx.zeros((ratio, width), dtype=mx.float32)
        self.norm = nn.RMSNorm(head_dim, eps=args.rms_norm_eps)
        self._freqs = _rope_freqs(args, True, head_dim)

    def __call__(
        self, x: mx.array, cache: CompressorCache, rows: WindowRows
    ) -> Optional[mx.array]:
        kv, gate = self.wkv(x), self.wgate(x)
        windows = self.ratio, cache.span, int(self.overlap)
        first, closed, pos, idx = rows.windows(windows)
        slots = rows.slot_index((cache.span, kv.shape[-1]))
        kv_rows, gate_rows = cache.update_and_fetch(kv, gate, slots)
        if closed == 0:
            return cache.pool
        pool = _pool_step if x.shape[1] <= _STEP_ROWS else _pool
        args = self.ape, self.norm.weight, self._freqs, self.ratio, self.overlap
        entries = pool(
            kv_rows, gate_rows, idx, pos, mx.array(first), *args, self.norm.eps
        )
        return cache.update_pool(entries.astype(kv.dtype), first)


def _pool(
    buf_kv, buf_gate, idx, pos, first, ape, norm_weight, freqs, ratio, overlap, eps
):
    idx = mx.stop_gradient(idx)
    batch, n, _ = idx.shape
    shape = (batch, n // ratio, ratio, buf_kv.shape[-1])
    kv = mx.take_along_axis(buf_kv, idx, axis=1).reshape(shape)
    gate = mx.take_along_axis(buf_gate, idx, axis=1).reshape(shape) + ape
    if overlap:
        # Entry w pools the first half of window w - 1 and the second of w.
        d = norm_weight.shape[0]
        early = (pos < 0).reshape(*shape[:3], 1)[:, :-1]
        kv_a = mx.where(early, 0, kv[:, :-1, :, :d])
        gate_a = mx.where(early, -mx.inf, gate[:, :-1, :, :d])
        kv = mx.concatenate([kv_a, kv[:, 1:, :, d:]], axis=2)
        gate = mx.concatenate([gate_a, gate[:, 1:, :, d:]], axis=2)
    weights = mx.softmax(gate.astype(mx.float32), axis=2, precise=True)
    entries = mx.sum(kv * weights.astype(kv.dtype), axis=2)
    entries = mx.fast.rms_norm(entries, norm_weight, eps)
    # An entry sits at the position of its window's first row.
    return _rope(entries, freqs, first, float(ratio))


_pool_step = mx.compile(_pool)


class Indexer(nn.Module):
    def __init__(self, args: ModelArgs, ratio: int):
        super().__init__()
        self.ratio = ratio
        self.n_heads = args.index_n_heads
        self.head_dim = args.index_head_dim
        self.index_topk = args.index_topk
        self.wq_b = nn.Linear(
            args.q_lora_rank, self.n_heads * self.head_dim, bias=False
        )
        self.weights_proj = nn.Linear(args.hidden_size, self.n_heads, bias=False)
        self.compressor = Compressor(args, ratio, self.head_dim, overlap=True)
        self._freqs = _rope_freqs(args, True, self.head_dim)

    def __call__(
        self, x: mx.array, qr: mx.array, cache: CompressorCache, rows: WindowRows
    ) -> Optional[mx.array]:
        keys = self.compressor(x, cache, rows)
        n, visible = rows.entries(self.ratio)
        if n <= self.index_topk:
            return None
        batch, length, _ = x.shape
        q = self.wq_b(qr).reshape(batch, length, self.n_heads, self.head_dim)
        q = _rope(q.transpose(0, 2, 1, 3), self._freqs, rows.shift)
        q = q.swapaxes(1, 2).astype(keys.dtype)
        keys = keys[:, None, :n].swapaxes(-1, -2)
        weights = self.weights_proj(x)
        scale = (self.n_heads * self.head_dim) ** -0.5
        k = self.index_topk
        entries = mx.arange(n)
        chosen = []
        for i in range(0, length, _TOP_K_BLOCK):
            block = slice(i, i + _TOP_K_BLOCK)
            scores = q[:, block] @ keys
            scores = _index_scores(
                scores, weights[:, block], entries, visible[:, block], scale
            )
            chosen.append(mx.argpartition(-scores, k - 1, axis=-1)[..., :k])
        chosen = mx.concatenate(chosen, axis=1) if len(chosen) > 1 else chosen[0]
        return mx.stop_gradient(chosen)


def _index_scores(scores, weights, entries, visible, scale):
    weights = weights.astype(mx.float32)[..., None] * scale
    scores = mx.sum(mx.maximum(scores, 0).astype(mx.float32) * weights, axis=-2)
    return mx.where(entries < visible[..., None], scores, -mx.inf)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer_idx: int):
        super().__init__()
        self.kind = args.layer_types[layer_idx]
        self.n_heads = args.num_attention_heads
        self.head_dim = args.head_dim
        self.window = args.sliding_window
        self.eps = args.rms_norm_eps
        self.scale = args.head_dim**-0.5
        self.o_groups = args.o_groups
        self.wq_a = nn.Linear(args.hidden_size, args.q_lora_rank, bias=False)
        self.q_norm = nn.RMSNorm(args.q_lora_rank, eps=args.rms_norm_eps)
        self.wq_b = nn.Linear(
            args.q_lora_rank, self.n_heads * self.head_dim, bias=False
        )
        self.wkv = nn.Linear(args.hidden_size, self.head_dim, bias=False)
        self.kv_norm = nn.RMSNorm(self.head_dim, eps=args.rms_norm_eps)
        self.wo_a = SwitchLinear(
            self.n_heads * self.head_dim // args.o_groups,
            args.o_lora_rank,
            args.o_groups,
            bias=False,
        )
        self.wo_b = nn.Linear(
            args.o_groups * args.o_lora_rank, args.hidden_size, bias=False
        )
        self.attn_sink = mx.zeros((self.n_heads,), dtype=mx.float32)
        self._group_ids = mx.arange(args.o_groups)[None]
        self._freqs = _rope_freqs(args, self.kind != SLIDING, self.head_dim)
        self._inverse_freqs = -self._freqs
        if self.kind != SLIDING:
            ratio = args.compress_rates[self.kind]
            self.compressor = Compressor(
                args, ratio, self.head_dim, overlap=self.kind == CSA
            )
        if self.kind == CSA:
            self.indexer = Indexer(args, ratio)

    def __call__(
        self, x: mx.array, cache: WindowCompressorCache, rows: WindowRows
    ) -> mx.array:
        batch, length, _ = x.shape
        qr = self.q_norm(self.wq_a(x))
        q = self.wq_b(qr).reshape(batch, length, self.n_heads, self.head_dim)
        q = mx.fast.rms_norm(q, None, self.eps).transpose(0, 2, 1, 3)
        q = _rope(q, self._freqs, rows.shift)
        kv = _rope(self.kv_norm(self.wkv(x)), self._freqs, rows.shift)

        slots = rows.slot_index((cache.window.capacity, kv.shape[-1]))
        window = cache.update_and_fetch(kv, slots)
        pool = seen = chosen = None
        if self.kind != SLIDING:
            entries = self.compressor(x, cache.compressor, rows)
            n, visible = rows.entries(self.compressor.ratio)
            if self.kind == CSA:
                chosen = self.indexer(x, qr, cache.indexer, rows)
            if chosen is None:
                pool = entries[:, :n] if n > 0 else None
            elif length == 1:
                pool = mx.take_along_axis(entries, chosen[:, 0, :, None], axis=1)
                seen = chosen < visible[..., None]
            elif n > _SPARSE_ENTRIES:
                seen = chosen < visible[..., None]
                out = self._sparse(q, window, entries, chosen, seen, rows)
                return self._output(out, rows)
            else:
                # Several queries: each one's top-k as a mask over the pool.
                pool = entries[:, :n]
                seen = mx.zeros((batch, length, n), dtype=mx.bool_)
                seen = mx.put_along_axis(
                    seen, chosen, chosen < visible[..., None], axis=-1
                )
        out = self._dense(q, window, pool, seen, rows)
        return self._output(out, rows)

    def _dense(self, q, window, pool, seen, rows):
        batch, heads, length, dims = q.shape
        sizes = self.window, window.shape[1] - 1 - length
        ratio = None if pool is None else self.compressor.ratio
        blocks = -(-length // _QUERY_BLOCK)
        if blocks == 1:
            keys = window if pool is None else mx.concatenate([window, pool], 1)
            if seen is None:
                mask = rows.keys_mask((*sizes, ratio))
            else:
                mask = mx.concatenate([rows.window_mask(sizes), seen], axis=-1)
            if length == 1:
                # The heads' queries as the rows of one matmul (one key head).
                scores = q.reshape(batch, heads, dims) @ keys.swapaxes(-1, -2)
                weights = _sink_softmax(scores, mask, self.attn_sink, self.scale)
                return (weights @ keys).reshape(batch, heads, 1, dims)
            keys, mask = keys[:, None], mask[:, None]
        else:
            block = _QUERY_BLOCK
            pad = blocks * block - length
            index, mask = rows.bands((*sizes, block))
            keys = mx.take_along_axis(window[:, None], index[..., None], axis=2)
            if pool is not None:
                if seen is None:
                    seen = rows.pool_mask(ratio)
                shape = (batch, blocks, pool.shape[1], dims)
                keys = mx.concatenate([keys, mx.broadcast_to(pool[:, None], shape)], 2)
                seen = mx.pad(seen, [(0, 0), (0, pad), (0, 0)])
                mask = mx.concatenate([mask, seen.reshape(*shape[:2], block, -1)], -1)
            q = mx.pad(q, [(0, 0), (0, 0), (0, pad), (0, 0)])
            q = q.reshape(batch, heads, blocks, block, dims).swapaxes(1, 2)
            q = q.reshape(batch * blocks, heads, block, dims)
            keys = keys.reshape(batch * blocks, 1, -1, dims)
            mask = mask.reshape(batch * blocks, 1, block, -1)
        out = mx.fast.scaled_dot_product_attention(
            q,
            keys,
            keys,
            scale=self.scale,
            mask=mask,
            sinks=self.attn_sink.astype(q.dtype),
        )
        if blocks > 1:
            out = out.reshape(batch, blocks, heads, -1, dims).swapaxes(1, 2)
            out = out.reshape(batch, heads, -1, dims)[:, :, :length]
        return out

    def _sparse(self, q, window, pool, chosen, seen, rows):
        # Each query's window rows and top-k entries, gathered for a block of
        # queries at a time: memory that does not grow with the pool.
        length = q.shape[2]
        index, valid = rows.window_rows((self.window, window.shape[1] - 1 - length))
        q = q.swapaxes(1, 2)
        window, pool = window[:, None], pool[:, None]
        out = []
        for i in range(0, length, _TOP_K_BLOCK):
            block = slice(i, i + _TOP_K_BLOCK)
            keys = mx.concatenate(
                [
                    mx.take_along_axis(window, index[:, block, :, None], axis=2),
                    mx.take_along_axis(pool, chosen[:, block, :, None], axis=2),
                ],
                axis=2,
            )
            mask = mx.concatenate([valid[:, block], seen[:, block]], axis=-1)
            scores = q[:, block] @ keys.swapaxes(-1, -2)
            weights = _sink_softmax(
                scores, mask[:, :, None], self.attn_sink, self.scale
            )
            out.append(weights @ keys)
        return mx.concatenate(out, axis=1).swapaxes(1, 2)

    def _output(self, out: mx.array, rows: WindowRows) -> mx.array:
        batch, _, length, _ = out.shape
        # Undo the keys' rotation at the query position.
        out = _rope(out, self._inverse_freqs, rows.shift)
        if length == 1:
            out = out.reshape(batch, self.o_groups, 1, -1)
        else:
            out = out.swapaxes(1, 2).reshape(batch, length, self.o_groups, -1)
            out = out.swapaxes(1, 2)
        # Plain weights as one matmul (gather_mm of whole groups JITs on CUDA).
        if isinstance(self.wo_a, SwitchLinear):
            out = out @ self.wo_a.weight.swapaxes(-1, -2)
        else:
            out = self.wo_a(out, self._group_ids)
        if length > 1:
            out = out.swapaxes(1, 2)
        return self.wo_b(out.reshape(batch, length, -1))


@partial(mx.compile, shapeless=True)
def _sink_softmax(scores, mask, sinks, scale):
    logits = mx.where(mask, scores.astype(mx.float32) * scale, -mx.inf)
    sinks = sinks[:, None]
    top = mx.maximum(logits.max(axis=-1, keepdims=True), sinks)
    weights = mx.exp(logits - top)
    total = weights.sum(axis=-1, keepdims=True) + mx.exp(sinks - top)
    return (weights / total).astype(scores.dtype)


class Router(nn.Module):
    def __init__(self, args: ModelArgs, hashed: bool = False):
        super().__init__()
        self.weight = mx.zeros(
            (args.n_routed_experts, args.hidden_size), dtype=mx.float32
        )
        self.top_k = args.num_experts_per_tok
        if hashed:
            self.tid2eid = mx.zeros((args.vocab_size, self.top_k), dtype=mx.int32)
            self.freeze(recurse=False, keys="tid2eid")
        else:
            self.e_score_correction_bias = mx.zeros(
                (args.n_routed_experts,), dtype=mx.float32
            )
        self.norm_topk_prob = args.norm_topk_prob
        self.route_scale = args.routed_scaling_factor

    def __call__(
        self, x: mx.array, input_ids: Optional[mx.array] = None
    ) -> tuple[mx.array, mx.array]:
        hashed = "tid2eid" in self
        choice = self.tid2eid[input_ids] if hashed else self.e_score_correction_bias
        route = _route_step if x.shape[-2] <= _STEP_ROWS else _route
        args = self.top_k, self.norm_topk_prob, self.route_scale
        return route(x, self.weight, choice, hashed, *args)


def _route(x, weight, choice, hashed, top_k, norm, scale):
    logits = x.astype(mx.float32) @ weight.astype(mx.float32).T
    scores = mx.sqrt(nn.softplus(logits))
    if hashed:
        chosen = choice
    else:
        # The bias only selects the experts.
        biased = scores + choice
        chosen = mx.argpartition(-biased, top_k - 1, axis=-1)[..., :top_k]
    chosen = mx.stop_gradient(chosen)
    weights = mx.take_along_axis(scores, chosen, axis=-1)
    if norm:
        weights = weights / (mx.sum(weights, axis=-1, keepdims=True) + 1e-20)
    return chosen, weights * scale


_route_step = mx.compile(_route)


class HashTablesFrozen:
    """Unfreezing leaves the hash layers' expert tables (integers) frozen."""

    def unfreeze(self, **kwargs) -> nn.Module:
        super().unfreeze(**kwargs)
        for m in self.modules():
            if isinstance(m, Router) and "tid2eid" in m:
                m.freeze(recurse=False, keys="tid2eid")
        return self


class MoE(nn.Module):
    def __init__(self, args: ModelArgs, hashed: bool):
        super().__init__()
        self.gate = Router(args, hashed)
        self.switch_mlp = SwitchGLU(
            args.hidden_size,
            args.moe_intermediate_size,
            args.n_routed_experts,
            activation=DeepseekV41SwiGLU(args.swiglu_limit),
        )
        self.shared_experts = SharedMLP(args)
        self.sharding_group = None

    def __call__(self, x: mx.array, input_ids: mx.array) -> mx.array:
        if self.sharding_group is not None:
            x = sum_gradients(self.sharding_group)(x)
        inds, weights = self.gate(x, input_ids)
        y = self.switch_mlp(x, inds)
        y = mx.sum(y * weights[..., None].astype(y.dtype), axis=-2)
        y = y.astype(x.dtype) + self.shared_experts(x)
        if self.sharding_group is not None:
            y = mx.distributed.all_sum(y, group=self.sharding_group)
        return y


class HyperConnection(deepseek_v41.HyperConnection):

    def collapse(self, streams: mx.array):
        if streams.shape[1] <= _STEP_ROWS:
            weights = (self.fn, self.base, self.scale, self._scale_ids, self._eps)
            return _mix_and_collapse(
                streams, *weights, self.iters, self.norm_eps, not self.training
            )
        pre, post, comb = self(streams)
        weights = [pre[:, :, i] for i in range(self.hc)]
        parts = [streams[:, :, i] for i in range(self.hc)]
        return _collapse_by_stream(weights, parts), post, comb

    def expand(self, x: mx.array, streams: mx.array, post: mx.array, comb: mx.array):
        if streams.shape[1] <= _STEP_ROWS:
            return _compiled_expand(x, streams, post, comb)
        rows = [comb[:, :, i] for i in range(self.hc)]
        parts = [streams[:, :, i : i + 1] for i in range(self.hc)]
        return _expand_by_stream(x, post, rows, parts)


@mx.compile
def _mix_and_collapse(
    streams, fn, base, scale, scale_ids, eps, iters, norm_eps, use_kernel
):
    pre, post, comb = mixes(
        streams,
        fn=fn,
        base=base,
        scale=scale[scale_ids],
        iters=iters,
        eps=eps,
        norm_eps=norm_eps,
        use_kernel=use_kernel,
    )
    return collapse(streams, pre), post, comb


_compiled_expand = mx.compile(expand, shapeless=True)


def _weighted_sum(weights, streams):
    out = mx.expand_dims(weights[0], -1) * streams[0]
    for w, stream in zip(weights[1:], streams[1:]):
        out = out + mx.expand_dims(w, -1) * stream
    return out


# By stream: no float32 copy of the streams, no [B, L, hc, hc, D] product.
@partial(mx.compile, shapeless=True)
def _collapse_by_stream(weights, streams):
    return _weighted_sum(weights, streams).astype(streams[0].dtype)


@partial(mx.compile, shapeless=True)
def _expand_by_stream(x, post, comb_rows, streams):
    mixed = _weighted_sum(comb_rows, streams)
    out = mx.expand_dims(post, -1) * mx.expand_dims(x, -2) + mixed
    return out.astype(streams[0].dtype)


class DecoderLayer(HashTablesFrozen, nn.Module):
    def __init__(self, args: ModelArgs, layer_idx: int):
        super().__init__()
        self.attn = Attention(args, layer_idx)
        self.ffn = MoE(args, hashed=args.mlp_layer_types[layer_idx] == "hash_moe")
        self.attn_norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.ffn_norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.attn_hc = HyperConnection(args)
        self.ffn_hc = HyperConnection(args)

    def __call__(
        self,
        h: mx.array,
        input_ids: mx.array,
        cache: WindowCompressorCache,
        rows: WindowRows,
    ) -> mx.array:
        x, post, comb = self.attn_hc.collapse(h)
        x = self.attn(self.attn_norm(x), cache, rows)
        h = self.attn_hc.expand(x, h, post, comb)
        x, post, comb = self.ffn_hc.collapse(h)
        x = self.ffn(self.ffn_norm(x), input_ids)
        return self.ffn_hc.expand(x, h, post, comb)


class HyperHead(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.eps = args.hc_eps
        self.norm_eps = args.rms_norm_eps
        self.fn = mx.zeros((args.hc_mult, args.hc_mult * args.hidden_size))
        self.base = mx.zeros((args.hc_mult,))
        self.scale = mx.ones((1,))

    def __call__(self, h: mx.array) -> mx.array:
        mix = mix_logits(h, self.fn, self.norm_eps)
        pre = mx.sigmoid(mix * self.scale + self.base) + self.eps
        return collapse(h, pre)


def _cache_arrays(cache: List[WindowCompressorCache]) -> List[mx.array]:
    return [a for c in cache for a in c.cache_arrays()]


class DeepseekV4Model(PipelineMixin, nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.hc_mult = args.hc_mult
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [DecoderLayer(args, i) for i in range(args.num_hidden_layers)]
        self.hc_head = HyperHead(args)
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)

    def __call__(
        self,
        inputs: mx.array,
        cache: List[WindowCompressorCache],
    ) -> mx.array:
        h = self.embed_tokens(inputs)
        batch, length, dims = h.shape
        h = mx.broadcast_to(h[:, :, None], (batch, length, self.hc_mult, dims))
        rows = WindowRows(*cache[0].row_spans(length, batch), length)
        rank, size = self.pipeline_rank, self.pipeline_size
        h = mx.distributed.recv_like(h, rank + 1) if rank < size - 1 else h
        for layer, layer_cache in zip(self.pipeline_layers, cache):
            h = layer(h, inputs, layer_cache, rows)
        if rank > 0:
            h = mx.distributed.send(h, rank - 1)
            # A prefill step evaluates only the caches, which must still send.
            cache[-1].window.kv = mx.depends(cache[-1].window.kv, h)
        out = self.norm(self.hc_head(h))
        out = mx.distributed.all_gather(out)[:batch] if size > 1 else out
        # Evaluating the output materializes every cache array: the caches'
        # graphs stay bounded (Metal aborts past its resource limit) without
        # a host sync a step.
        return mx.depends(out, _cache_arrays(cache))


# Checkpoint names (DeepSeek's, transformers', early MLX uploads) to this model's.
_RENAMES = tuple(
    (re.compile(old), new)
    for old, new in (
        (r"^(model\.)?embed\.", "model.embed_tokens."),
        (r"^(model\.)?head\.", "lm_head."),
        (r"^(norm|layers)\.", r"model.\1."),
        (r"^(model\.)?hc_head[_.](hc_)?(fn|base|scale)$", r"model.hc_head.\3"),
        (r"\.hc_(attn|ffn)[_.](fn|base|scale)$", r".\1_hc.\2"),
        (r"\.attn\.norm\.", ".attn.kv_norm."),
        (r"\.gate\.bias$", ".gate.e_score_correction_bias"),
        (r"\.ffn\.experts\.(\d+\.)?(w[123]\.)", r".ffn.switch_mlp.\2\1"),
        (r"\.w1\.", ".gate_proj."),
        (r"\.w2\.", ".down_proj."),
        (r"\.w3\.", ".up_proj."),
    )
)
# Weights stored one per expert or one per output group.
_PART_KEY = re.compile(r"(.+\.(?:switch_mlp\.\w+|wo_a))\.(\d+)\.(\w+)")
_MTP_KEY = re.compile(r"(^|\.)mtp\.")


class Model(HashTablesFrozen, nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        self.model = DeepseekV4Model(args)
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    def __call__(
        self,
        inputs: mx.array,
        cache: Optional[List[WindowCompressorCache]] = None,
    ) -> mx.array:
        if cache is None:
            cache = self.make_cache()
        return self.lm_head(self.model(inputs, cache))

    @property
    def layers(self):
        return self.model.pipeline_layers

    def make_cache(self) -> List[WindowCompressorCache]:
        return [self._layer_cache(layer.attn.kind) for layer in self.layers]

    def _layer_cache(self, kind: str) -> WindowCompressorCache:
        ratio = self.args.compress_rates.get(kind)
        compressor = indexer = None
        if kind != SLIDING:
            compressor = CompressorCache(ratio, overlap=kind == CSA)
        if kind == CSA:
            indexer = CompressorCache(ratio, overlap=True)
        window = SharedWindowCache(self.args.sliding_window)
        return WindowCompressorCache(window, compressor, indexer)

    def shard(self, group: Optional[mx.distributed.Group] = None) -> None:
        group = group or mx.distributed.init()
        n = group.size()
        fields = ("num_attention_heads", "o_groups", "moe_intermediate_size")
        sizes = {f: getattr(self.args, f) for f in fields}
        bad = [f"`{f}` {v}" for f, v in sizes.items() if v % n]
        if bad:
            raise ValueError(
                f"Cannot shard DeepSeek-V4 over {n} ranks: {n} does not divide "
                f"{', '.join(bad)}."
            )

        attn_axes = {"wo_a": 0, "attn_sink": 0}
        ffn_axes = {"gate_proj": -2, "up_proj": -2, "down_proj": -1}

        def split_axis(path, weight):
            parts = path.split(".")
            if parts[0] == "attn":
                return attn_axes.get(parts[1])
            return ffn_axes.get(parts[-2]) if parts[0] == "ffn" else None

        for layer in self.layers:
            attn = layer.attn
            attn.wq_b = shard_linear(attn.wq_b, "all-to-sharded", group=group)
            attn.wo_b = shard_linear(attn.wo_b, "sharded-to-all", group=group)
            shard_inplace(layer, split_axis, group=group)
            attn.n_heads //= n
            attn.o_groups //= n
            attn._group_ids = mx.arange(attn.o_groups)[None]
            layer.ffn.sharding_group = group

    def sanitize(self, weights: Dict[str, mx.array]) -> Dict[str, mx.array]:
        args = self.args
        block = (args.quantization_config or {}).get("weight_block_size", (128, 128))
        out, parts, problems, sources = {}, {}, {}, {}
        for key, value in weights.items():
            if _MTP_KEY.search(key):
                continue
            name = key
            for old, new in _RENAMES:
                name = old.sub(new, name)
            if name in sources:
                first, second = sorted((sources[name], key))
                problems[first] = f"{second} names the same weight ({name})"
                continue
            sources[name] = key
            if match := _PART_KEY.fullmatch(name):
                prefix, index, kind = match.groups()
                count = (
                    args.o_groups if prefix.endswith("wo_a") else args.n_routed_experts
                )
                parts.setdefault((prefix, kind, count), {})[int(index)] = key, value
            else:
                out[name] = value
        for (prefix, kind, count), members in parts.items():
            if set(members) != set(range(count)):
                missing = sorted(set(range(count)) - set(members))
                extra = sorted(set(members) - set(range(count)))
                key = members[min(members)][0]
                problems[key] = f"parts missing {missing}, unexpected {extra}"
            else:
                out[f"{prefix}.{kind}"] = mx.stack(
                    [members[i][1] for i in range(count)]
                )
        for name in [n for n in out if n.endswith(".weight")]:
            prefix = name.removesuffix(".weight")
            if out[name].dtype not in (mx.uint8, mx.int8):
                continue
            if f"{prefix}.scale" not in out:
                problems[name] = "an fp8 or fp4 weight needs its scale"
                continue
            try:
                scale = out.pop(f"{prefix}.scale")
                out[name], out[f"{prefix}.scales"] = repack_quantized(
                    out[name], scale, block
                )
            except ValueError as e:
                problems[name] = str(e)
        if problems:
            raise ValueError(
                f"Cannot load {len(problems)} DeepSeek-V4 checkpoint weights:\n"
                + "\n".join(f"  {k}: {why}" for k, why in sorted(problems.items()))
            )
        for name, value in out.items():
            if ".attn.wo_a." in name and value.ndim == 2:
                out[name] = value.reshape(args.o_groups, -1, value.shape[-1])
            elif name.endswith(".tid2eid"):
                out[name] = value.astype(mx.int32)
        return out

    @property
    def cast_predicate(self) -> Callable[[str], bool]:
        # DeepSeek keeps these in float32.
        keep = ("attn_hc.", "ffn_hc.", "hc_head.", "attn_sink", "correction_bias")

        def predicate(k: str) -> bool:
            return not any(s in k for s in keep) and not k.endswith(".ape")

        return predicate
