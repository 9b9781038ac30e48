# Copyright © 2026 Apple Inc.

import math
import re
from dataclasses import dataclass, fields
from typing import Any, Callable, Dict, List, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx.nn.layers.distributed import shard_inplace, shard_linear, sum_gradients
from mlx.utils import tree_flatten

from ..utils import infer_quant_config
from .base import BaseModelArgs
from .cache import CompressorCache, SharedWindowCache, WindowCompressorCache
from .deepseek_v41 import (
    DeepseekV41SwiGLU,
    HyperConnection,
    SharedMLP,
    _apply_rope,
    _collapse,
    _expand,
    _gather_rows,
)
from .rope_utils import YarnRoPE
from .switch_layers import SwitchGLU, SwitchLinear

SLIDING = "sliding_attention"
CSA = "compressed_sparse_attention"
HCA = "heavily_compressed_attention"
_MLP_TYPES = ("hash_moe", "moe")

# For checkpoints without a chat template (a bundled one replaces the encoder).
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
    n_shared_experts: int = 1
    num_experts_per_tok: int = 6
    scoring_func: str = "sqrtsoftplus"
    routed_scaling_factor: float = 1.5
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
    # DeepSeek's schema
    compress_ratios: Optional[List[int]] = None
    num_hash_layers: Optional[int] = None
    # The transformers schema
    layer_types: Optional[List[str]] = None
    compress_rates: Optional[Dict[str, int]] = None
    mlp_layer_types: Optional[List[str]] = None
    # MLX's (converted checkpoints) or DeepSeek's (fp8 and fp4 weights)
    quantization: Optional[Dict[str, Any]] = None
    quantization_config: Optional[Dict[str, Any]] = None

    def __post_init__(self):
        _check_numbers(self)
        _check_quantization(self)
        n = self.num_hidden_layers
        rates = {CSA: 4, HCA: 128}
        if self.compress_ratios is not None:
            # DeepSeek's code overlaps (and indexes) ratio 4 only; any other
            # ratio is heavily compressed. The list may end with the MTP layer.
            ratios = list(self.compress_ratios)[:n]
            if len(ratios) < n or any(
                not isinstance(r, int) or isinstance(r, bool) or r < 0 for r in ratios
            ):
                raise ValueError(
                    f"`compress_ratios` needs {n} integer ratios of 0 or more, "
                    f"not {self.compress_ratios}."
                )
            hca = {r for r in ratios if r and r != 4}
            if len(hca) > 1:
                raise ValueError(
                    f"`compress_ratios` has several HCA ratios {sorted(hca)}."
                )
            ratio_rates = {CSA: 4, HCA: hca.pop() if hca else rates[HCA]}
            ratio_types = [SLIDING if not r else CSA if r == 4 else HCA for r in ratios]
        if self.layer_types is None:
            if self.compress_ratios is None:
                raise ValueError(
                    "The config needs `layer_types` or `compress_ratios` for "
                    "DeepSeek-V4."
                )
            rates, self.layer_types = ratio_rates, ratio_types
        else:
            rates.update(self.compress_rates or {})
        if set(rates) != {CSA, HCA} or any(
            not isinstance(r, int) or isinstance(r, bool) or r < 1
            for r in rates.values()
        ):
            raise ValueError(
                f"`compress_rates` needs positive integer rates for {CSA} and "
                f"{HCA}, not {self.compress_rates}."
            )
        self.compress_rates = rates
        if self.mlp_layer_types is None:
            hashed = 3 if self.num_hash_layers is None else self.num_hash_layers
            self.mlp_layer_types = ["hash_moe"] * hashed + ["moe"] * (n - hashed)
        for name, allowed in (
            ("layer_types", (SLIDING, CSA, HCA)),
            ("mlp_layer_types", _MLP_TYPES),
        ):
            types = list(getattr(self, name))[:n]
            if len(types) != n or any(t not in allowed for t in types):
                raise ValueError(
                    f"`{name}` needs {n} entries from {allowed}, not "
                    f"{getattr(self, name)}."
                )
            setattr(self, name, types)
        if self.compress_ratios is not None:
            # Both schemas given: they must describe the same layers.
            for i, (kind, r) in enumerate(zip(self.layer_types, ratios)):
                rate = 0 if kind == SLIDING else rates[kind]
                if kind != ratio_types[i] or rate != r:
                    raise ValueError(
                        f"`compress_ratios` and `layer_types` disagree on layer "
                        f"{i}: ratio {r} is {ratio_types[i]}, but `layer_types` "
                        f"says {kind} (rate {rate}, from `compress_rates`)."
                    )
        if self.scoring_func != "sqrtsoftplus":
            raise ValueError(
                f"`scoring_func` {self.scoring_func!r} is not supported: "
                "DeepSeek-V4 routes with 'sqrtsoftplus'."
            )
        if self.num_key_value_heads != 1:
            raise ValueError(
                "`num_key_value_heads` must be 1: DeepSeek-V4 shares one KV head."
            )
        if self.qk_rope_head_dim is None:
            factor = self.partial_rotary_factor or 64 / 512
            self.qk_rope_head_dim = int(self.head_dim * factor)
        for problem, message in (
            (
                self.qk_rope_head_dim > self.head_dim or self.qk_rope_head_dim % 2,
                f"`qk_rope_head_dim` {self.qk_rope_head_dim} must be even and at "
                f"most `head_dim` {self.head_dim}",
            ),
            (
                self.num_experts_per_tok > self.n_routed_experts,
                f"`num_experts_per_tok` {self.num_experts_per_tok} is more than "
                f"`n_routed_experts` {self.n_routed_experts}",
            ),
            (
                self.num_attention_heads % self.o_groups,
                f"`o_groups` {self.o_groups} does not divide "
                f"`num_attention_heads` {self.num_attention_heads}",
            ),
        ):
            if problem:
                raise ValueError(f"Invalid DeepSeek-V4 config: {message}.")
        params = self.rope_parameters or {}
        if isinstance(params.get("compress"), dict):
            self.rope_theta = params["main"].get("rope_theta", self.rope_theta)
            params = params["compress"]
            self.compress_rope_theta = params.get(
                "rope_theta", self.compress_rope_theta
            )
        scaling = params or self.rope_scaling or {}
        if scaling.get("rope_type", scaling.get("type")) != "yarn":
            scaling = None
        self.rope_scaling = scaling


# The smallest value of the number fields that may be below 1 (any other
# integer is at least 1, any other float above 0).
_MINIMUMS = {
    "qk_rope_head_dim": 0,
    "n_shared_experts": 0,
    "num_hash_layers": 0,
    "swiglu_limit": 0,
}


def _check_numbers(args: ModelArgs) -> None:
    """Raise one error naming every int or float field of the wrong type or
    out of range."""
    problems = []
    for field in fields(args):
        if field.type in (int, Optional[int]):
            kind, what = int, "an integer"
        elif field.type in (float, Optional[float]):
            kind, what = (int, float), "a number"
        else:
            continue
        value = getattr(args, field.name)
        if value is None and field.default is None:
            continue
        if not isinstance(value, kind) or isinstance(value, bool):
            problems.append(f"`{field.name}` {value!r} is not {what}")
            continue
        low = _MINIMUMS.get(field.name)
        if low is not None and not value >= low:
            problems.append(f"`{field.name}` {value} must be {low} or more")
        elif low is None and kind is int and value < 1:
            problems.append(f"`{field.name}` {value} must be 1 or more")
        elif low is None and not (0 < value < math.inf):
            problems.append(f"`{field.name}` {value} must be a positive number")
    if problems:
        raise ValueError("Invalid DeepSeek-V4 config:\n  " + "\n  ".join(problems))


def _make_rope(args: ModelArgs, compressed: bool) -> YarnRoPE:
    dims = args.qk_rope_head_dim
    if not compressed:
        return YarnRoPE(dims, traditional=True, base=args.rope_theta)
    scaling = args.rope_scaling
    if scaling is None:
        return YarnRoPE(dims, traditional=True, base=args.compress_rope_theta)
    original = scaling["original_max_position_embeddings"]
    factor = scaling.get("factor") or args.max_position_embeddings / original
    # DeepSeek-V4 does not scale the attention (YaRN's mscale is 1).
    return YarnRoPE(
        dims,
        traditional=True,
        base=args.compress_rope_theta,
        scaling_factor=factor,
        original_max_position_embeddings=original,
        beta_fast=scaling.get("beta_fast") or 32,
        beta_slow=scaling.get("beta_slow") or 1,
        mscale=0.0,
        mscale_all_dim=0.0,
    )


class Compressor(nn.Module):
    def __init__(self, args: ModelArgs, ratio: int, head_dim: int, overlap: bool):
        super().__init__()
        self.ratio = ratio
        self.head_dim = head_dim
        self.overlap = overlap
        self.rope_dim = args.qk_rope_head_dim
        width = 2 * head_dim if overlap else head_dim
        self.wkv = nn.Linear(args.hidden_size, width, bias=False)
        self.wgate = nn.Linear(args.hidden_size, width, bias=False)
        self.ape = mx.zeros((ratio, width), dtype=mx.float32)
        self.norm = nn.RMSNorm(head_dim, eps=args.rms_norm_eps)

    def __call__(
        self, x: mx.array, rope: YarnRoPE, cache: CompressorCache
    ) -> Optional[mx.array]:
        """Pool each window of ratio rows that x closes into one entry; return
        all entries so far, or None."""
        kv, gate, first = cache.update_pending(self.wkv(x), self.wgate(x))
        if kv.shape[1] == 0:
            return cache.fetch()
        batch, length, width = kv.shape
        n, d = length // self.ratio, self.head_dim
        kv = kv.reshape(batch, n, self.ratio, width)
        gate = gate.reshape(batch, n, self.ratio, width) + self.ape
        if self.overlap:
            # Entry w pools the first half of window w - 1 and the second
            # half of window w.
            prev_kv, prev_gate = cache.update_overlap(
                kv[:, -1:, :, :d], gate[:, -1:, :, :d]
            )
            kv_a = mx.concatenate([prev_kv, kv[:, :-1, :, :d]], axis=1)
            gate_a = mx.concatenate([prev_gate, gate[:, :-1, :, :d]], axis=1)
            kv = mx.concatenate([kv_a, kv[..., d:]], axis=2)
            gate = mx.concatenate([gate_a, gate[..., d:]], axis=2)
        weights = mx.softmax(gate.astype(mx.float32), axis=2, precise=True)
        entries = self.norm(mx.sum(kv * weights.astype(kv.dtype), axis=2))
        # An entry sits at the position of its window's first row.
        entries = _apply_rope(
            entries, rope, rope_dim=self.rope_dim, offset=first, scale=self.ratio
        )
        return cache.update_and_fetch(entries.astype(x.dtype))


class Indexer(nn.Module):
    def __init__(self, args: ModelArgs, ratio: int):
        super().__init__()
        self.ratio = ratio
        self.n_heads = args.index_n_heads
        self.head_dim = args.index_head_dim
        self.index_topk = args.index_topk
        self.rope_dim = args.qk_rope_head_dim
        self.wq_b = nn.Linear(
            args.q_lora_rank, self.n_heads * self.head_dim, bias=False
        )
        self.weights_proj = nn.Linear(args.hidden_size, self.n_heads, bias=False)
        self.compressor = Compressor(args, ratio, self.head_dim, overlap=True)

    def __call__(
        self,
        x: mx.array,
        qr: mx.array,
        rope: YarnRoPE,
        offset: int,
        cache: CompressorCache,
    ) -> Optional[mx.array]:
        """The entries each query attends to [B, L, k], -1 for none."""
        keys = self.compressor(x, rope, cache)
        if keys is None:
            return None
        batch, length, _ = x.shape
        q = self.wq_b(qr).reshape(batch, length, self.n_heads, self.head_dim)
        q = _apply_rope(q, rope, rope_dim=self.rope_dim, offset=offset)
        # In the keys' dtype: a float32 copy of the whole pool per step costs
        # more than it gains (DeepSeek's code even rounds these to fp4).
        scores = q.astype(keys.dtype) @ keys[:, None].swapaxes(-1, -2)
        scores = scores.astype(mx.float32)
        scores = mx.maximum(scores, 0.0) * self.head_dim**-0.5
        weights = self.weights_proj(x).astype(mx.float32) * self.n_heads**-0.5
        scores = mx.sum(scores * weights[..., None], axis=2)
        # A query sees the entries of the windows closed at its position.
        visible = (offset + mx.arange(length) + 1) // self.ratio
        scores = mx.where(mx.arange(keys.shape[1]) < visible[:, None], scores, -mx.inf)
        k = min(self.index_topk, keys.shape[1])
        chosen = mx.argpartition(-scores, k - 1, axis=-1)[..., :k].astype(mx.int32)
        return mx.stop_gradient(mx.where(chosen < visible[:, None], chosen, -1))


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer_idx: int):
        super().__init__()
        self.kind = args.layer_types[layer_idx]
        self.n_heads = args.num_attention_heads
        self.head_dim = args.head_dim
        self.rope_dim = args.qk_rope_head_dim
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
        # One projection per group of heads: [o_groups, o_lora_rank, group dims].
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
        self.rope = _make_rope(args, compressed=self.kind != SLIDING)
        if self.kind != SLIDING:
            ratio = args.compress_rates[self.kind]
            self.compressor = Compressor(
                args, ratio, self.head_dim, overlap=self.kind == CSA
            )
        if self.kind == CSA:
            self.indexer = Indexer(args, ratio)

    def __call__(self, x: mx.array, cache: WindowCompressorCache) -> mx.array:
        batch, length, _ = x.shape
        qr = self.q_norm(self.wq_a(x))
        q = self.wq_b(qr).reshape(batch, length, self.n_heads, self.head_dim)
        q = mx.fast.rms_norm(q, None, self.eps)
        kv = self.kv_norm(self.wkv(x))

        # Rows of a batch cache sit at their own positions, so each attends
        # to its own cache; right padding is left out and gives zeros.
        parts = cache.row_caches(length)
        rows = batch // len(parts)
        out = []
        for i, (c, n) in enumerate(parts):
            r = slice(i * rows, (i + 1) * rows)
            if n == 0:
                o = mx.zeros((rows, length, self.n_heads, self.head_dim), x.dtype)
            else:
                o = self._attend(x[r, :n], qr[r, :n], q[r, :n], kv[r, :n], c)
                if n < length:
                    o = mx.pad(o, [(0, 0), (0, length - n), (0, 0), (0, 0)])
            out.append(o)
        out = mx.concatenate(out) if len(out) > 1 else out[0]
        out = out.reshape(batch * length, self.o_groups, 1, -1)
        out = self.wo_a(out, self._group_ids)
        return self.wo_b(out.reshape(batch, length, -1))

    def _attend(
        self,
        x: mx.array,
        qr: mx.array,
        q: mx.array,
        kv: mx.array,
        cache: WindowCompressorCache,
    ) -> mx.array:
        """Attention of the rows of one cache, before the output projection."""
        batch, length, _ = x.shape
        offset = cache.offset
        q = _apply_rope(q, self.rope, rope_dim=self.rope_dim, offset=offset)
        kv = _apply_rope(kv, self.rope, rope_dim=self.rope_dim, offset=offset)

        # Window keys: the kept rows, then the new ones.
        window = cache.window.update_and_fetch(kv)
        q_pos = offset + mx.arange(length)[:, None]
        k_pos = offset - (window.shape[1] - length) + mx.arange(window.shape[1])
        mask = (k_pos <= q_pos) & (k_pos > q_pos - self.window)
        q = q.astype(mx.float32).transpose(0, 2, 1, 3)
        window = window.astype(mx.float32)[:, None]
        scores = [mx.where(mask, (q @ window.swapaxes(-1, -2)) * self.scale, -mx.inf)]

        # Compressed keys: all visible entries (HCA) or the indexer's top-k (CSA).
        pool = picked = None
        if self.kind != SLIDING:
            pool = self.compressor(x, self.rope, cache.compressor)
        if self.kind == CSA:
            chosen = self.indexer(x, qr, self.rope, offset, cache.indexer)
            if chosen is not None:
                picked = _gather_rows(pool, chosen).astype(mx.float32)
                s = (q.transpose(0, 2, 1, 3) @ picked.swapaxes(-1, -2)) * self.scale
                s = s.transpose(0, 2, 1, 3)
                scores.append(mx.where((chosen >= 0)[:, None], s, -mx.inf))
        elif pool is not None:
            pool = pool.astype(mx.float32)[:, None]
            visible = (q_pos + 1) // self.compressor.ratio
            s = (q @ pool.swapaxes(-1, -2)) * self.scale
            scores.append(mx.where(mx.arange(pool.shape[2]) < visible, s, -mx.inf))

        # The sink takes part in the softmax only.
        sink = mx.broadcast_to(
            self.attn_sink.astype(mx.float32)[:, None, None],
            (batch, self.n_heads, length, 1),
        )
        sizes = [s.shape[-1] for s in scores]
        probs = mx.softmax(mx.concatenate([*scores, sink], axis=-1), axis=-1)
        probs = mx.split(probs, [sizes[0], sum(sizes)], axis=-1)
        out = probs[0] @ window
        if picked is not None:
            p = probs[1].transpose(0, 2, 1, 3)
            out = out + (p @ picked).transpose(0, 2, 1, 3)
        elif len(sizes) > 1:
            out = out + probs[1] @ pool
        out = out.transpose(0, 2, 1, 3).astype(x.dtype)

        # Undo the keys' rotation at the query position.
        return _apply_rope(
            out, self.rope, rope_dim=self.rope_dim, offset=offset, inverse=True
        )


class Gate(nn.Module):
    def __init__(self, args: ModelArgs, hashed: bool):
        super().__init__()
        self.top_k = args.num_experts_per_tok
        self.scale = args.routed_scaling_factor
        self.weight = mx.zeros((args.n_routed_experts, args.hidden_size))
        if hashed:
            # Hash layers pick experts by token id.
            self.tid2eid = mx.zeros((args.vocab_size, self.top_k), dtype=mx.int32)
            self.freeze(recurse=False, keys="tid2eid")
        else:
            self.e_score_correction_bias = mx.zeros(
                (args.n_routed_experts,), dtype=mx.float32
            )

    def __call__(self, x: mx.array, input_ids: mx.array):
        logits = x.astype(mx.float32) @ self.weight.astype(mx.float32).T
        scores = mx.sqrt(nn.softplus(logits))
        if "tid2eid" in self:
            inds = self.tid2eid[input_ids]
        else:
            # The bias only selects the experts.
            biased = scores + self.e_score_correction_bias
            inds = mx.argpartition(-biased, self.top_k - 1, axis=-1)[..., : self.top_k]
        inds = mx.stop_gradient(inds)
        weights = mx.take_along_axis(scores, inds, axis=-1)
        weights = weights / (mx.sum(weights, axis=-1, keepdims=True) + 1e-20)
        return inds, weights * self.scale


def _freeze_hash_tables(module: nn.Module) -> None:
    # The hash layers' expert tables are integer lookups, never trained.
    for m in module.modules():
        if isinstance(m, Gate) and "tid2eid" in m:
            m.freeze(recurse=False, keys="tid2eid")


class MoE(nn.Module):
    def __init__(self, args: ModelArgs, hashed: bool):
        super().__init__()
        self.gate = Gate(args, hashed)
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


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, layer_idx: int):
        super().__init__()
        self.attn = Attention(args, layer_idx)
        self.ffn = MoE(args, hashed=args.mlp_layer_types[layer_idx] == "hash_moe")
        self.attn_norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.ffn_norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.attn_hc = HyperConnection(args)
        self.ffn_hc = HyperConnection(args)

    def unfreeze(self, **kwargs) -> nn.Module:
        super().unfreeze(**kwargs)
        _freeze_hash_tables(self)
        return self

    def __call__(
        self,
        h: mx.array,
        input_ids: mx.array,
        cache: WindowCompressorCache,
    ) -> mx.array:
        pre, post, comb = self.attn_hc(h)
        x = self.attn(self.attn_norm(_collapse(h, pre)), cache)
        h = _expand(x, h, post, comb)
        pre, post, comb = self.ffn_hc(h)
        x = self.ffn(self.ffn_norm(_collapse(h, pre)), input_ids)
        return _expand(x, h, post, comb)


class HyperHead(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.eps = args.hc_eps
        self.norm_eps = args.rms_norm_eps
        self.fn = mx.zeros((args.hc_mult, args.hc_mult * args.hidden_size))
        self.base = mx.zeros((args.hc_mult,))
        self.scale = mx.ones((1,))

    def __call__(self, h: mx.array) -> mx.array:
        flat = h.reshape(*h.shape[:2], -1).astype(mx.float32)
        flat = mx.fast.rms_norm(flat, None, self.norm_eps)
        pre = mx.sigmoid((flat @ self.fn.T) * self.scale + self.base) + self.eps
        return _collapse(h, pre)


def _cache_arrays(cache: List[WindowCompressorCache]) -> List[mx.array]:
    return [
        v
        for layer_cache in cache
        for c in layer_cache.caches
        for v in vars(c).values()
        if isinstance(v, mx.array)
    ]


class DeepseekV4Model(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.hc_mult = args.hc_mult
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [DecoderLayer(args, i) for i in range(args.num_hidden_layers)]
        self.hc_head = HyperHead(args)
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)

    def __call__(
        self, inputs: mx.array, cache: List[WindowCompressorCache]
    ) -> mx.array:
        h = self.embed_tokens(inputs)
        batch, length, dims = h.shape
        h = mx.broadcast_to(h[:, :, None], (batch, length, self.hc_mult, dims))
        for layer, layer_cache in zip(self.layers, cache):
            h = layer(h, inputs, layer_cache)
        out = self.norm(self.hc_head(h))
        # Evaluating the output also materializes every cache array, so no
        # cache field keeps a growing lazy graph, without a host sync.
        return mx.depends(out, _cache_arrays(cache))


# Checkpoint names (DeepSeek's release, transformers' save_pretrained, early
# MLX uploads) and this model's.
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
        (r"\.ffn\.experts\.(w[123]\.)", r".ffn.switch_mlp.\1"),
        (r"\.w1\.", ".gate_proj."),
        (r"\.w2\.", ".down_proj."),
        (r"\.w3\.", ".up_proj."),
    )
)
# Weights stored one per expert or one per output group.
_EXPERT_KEY = re.compile(r"(.+\.ffn)\.experts\.(\d+)\.(\w+)\.(\w+)")
_WO_A_KEY = re.compile(r"(.+\.attn\.wo_a)\.(\d+)\.(\w+)")
_MTP_KEY = re.compile(r"(^|\.)mtp\.")
_MX_MODES = {"mxfp4": (4, 32), "mxfp8": (8, 32), "nvfp4": (4, 16)}


def _check_quantization(args: "ModelArgs") -> None:
    """Raise for a quantization config this model cannot load."""
    problems = []
    if args.quantization is not None:
        entries = [("quantization", args.quantization)]
        entries += [
            (f"quantization.{k}", v)
            for k, v in args.quantization.items()
            if isinstance(v, dict)
        ]
        for field, entry in entries:
            mode = entry.get("mode", "affine")
            bits, group_size = entry.get("bits"), entry.get("group_size")
            if mode != "affine" and mode not in _MX_MODES:
                problems.append(f"`{field}.mode` {mode!r} is not a quantization mode")
            elif mode in _MX_MODES and (bits, group_size) != _MX_MODES[mode]:
                problems.append(
                    f"`{field}` {mode} needs bits {_MX_MODES[mode][0]} and "
                    f"group_size {_MX_MODES[mode][1]}, not {bits} and {group_size}"
                )
            elif mode == "affine" and (
                bits not in (2, 3, 4, 5, 6, 8) or group_size not in (32, 64, 128)
            ):
                problems.append(
                    f"`{field}` affine bits {bits} or group_size {group_size} "
                    "is not supported"
                )
    elif (config := args.quantization_config) is not None:
        method = config.get("quant_method")
        if method != "fp8":
            problems.append(
                f"`quantization_config.quant_method` {method!r}: DeepSeek-V4 "
                "checkpoints are 'fp8' or converted by mlx_lm.convert"
            )
        else:
            block = config.get("weight_block_size", [128, 128])
            expected = {"fmt": "e4m3", "scale_fmt": "ue8m0"}
            for field, value in expected.items():
                if config.get(field, value) != value:
                    problems.append(
                        f"`quantization_config.{field}` is "
                        f"{config[field]!r}, not {value!r}"
                    )
            if config.get("expert_dtype", "fp8") not in ("fp4", "fp8"):
                problems.append(
                    "`quantization_config.expert_dtype` "
                    f"{config['expert_dtype']!r} is not 'fp4' or 'fp8'"
                )
            if (
                len(block) != 2
                or not all(isinstance(b, int) and b > 0 for b in block)
                or block[1] % 32
            ):
                problems.append(
                    f"`quantization_config.weight_block_size` {block} is not "
                    "two positive sizes with columns a multiple of 32"
                )
    if problems:
        raise ValueError("Invalid DeepSeek-V4 config:\n  " + "\n  ".join(problems))


def _ue8m0(scale: mx.array) -> mx.array:
    """Power-of-two scales as biased exponents, the scales of MLX's mx modes."""
    if scale.dtype == mx.uint8:
        return scale
    exponent = mx.log2(scale.astype(mx.float32))
    if not mx.array_equal(exponent, mx.round(exponent)):
        raise ValueError("its scales are not powers of two")
    return (exponent + 127).astype(mx.uint8)


def _to_mx_format(weight: mx.array, scale: mx.array, block) -> tuple:
    """Put a DeepSeek fp8 or fp4 weight and its scale in MLX's mxfp8 or mxfp4
    layout, without dequantizing.

    fp8 (uint8 e4m3) has one scale per block of rows x columns, repeated here
    to one per row and 32 columns. fp4 (int8, two e2m1 values per byte, the
    low nibble first) already has one scale per row and 32 columns.
    """
    *lead, rows, cols = weight.shape
    if weight.dtype == mx.int8:
        cols, block = 2 * cols, (1, 32)
    grid = (*lead, -(-rows // block[0]), -(-cols // block[1]))
    if tuple(scale.shape) != grid:
        raise ValueError(
            f"its scale has shape {tuple(scale.shape)}, not {grid} for "
            f"{block[0]}x{block[1]} blocks of a {tuple(weight.shape)} weight"
        )
    if cols % 32:
        raise ValueError(f"its {cols} columns are not a multiple of 32")
    scale = mx.repeat(_ue8m0(scale), block[0], axis=-2)[..., :rows, :]
    scale = mx.repeat(scale, block[1] // 32, axis=-1)[..., : cols // 32]
    return weight.view(mx.uint32), scale


class Model(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        self.model = DeepseekV4Model(args)
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    def __call__(
        self, inputs: mx.array, cache: Optional[List[WindowCompressorCache]] = None
    ) -> mx.array:
        if cache is None:
            cache = self.make_cache()
        return self.lm_head(self.model(inputs, cache))

    @property
    def layers(self):
        return self.model.layers

    def unfreeze(self, **kwargs) -> nn.Module:
        super().unfreeze(**kwargs)
        _freeze_hash_tables(self)
        return self

    def make_cache(self) -> List[WindowCompressorCache]:
        caches = []
        for kind in self.args.layer_types:
            ratio = self.args.compress_rates.get(kind)
            caches.append(
                WindowCompressorCache(
                    SharedWindowCache(self.args.sliding_window),
                    compressor=CompressorCache(ratio) if kind != SLIDING else None,
                    indexer=CompressorCache(ratio) if kind == CSA else None,
                )
            )
        return caches

    def shard(self, group: Optional[mx.distributed.Group] = None) -> None:
        """Split attention heads, by whole output groups, and the hidden units
        of every expert over the ranks of group."""
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

        # The axis of each parameter that ranks split: wo_a's groups and the
        # sinks of their heads; the experts' hidden units.
        attn_axes = {"wo_a": 0, "attn_sink": 0}
        ffn_axes = {"gate_proj": -2, "up_proj": -2, "down_proj": -1}

        def split_axis(path, weight):
            parts = path.split(".")
            if parts[0] == "attn":
                return attn_axes.get(parts[1])
            return ffn_axes.get(parts[-2]) if parts[0] == "ffn" else None

        for layer in self.layers:
            attn = layer.attn
            # The projections into and out of the heads communicate.
            attn.wq_b = shard_linear(attn.wq_b, "all-to-sharded", group=group)
            attn.wo_b = shard_linear(attn.wo_b, "sharded-to-all", group=group)
            shard_inplace(layer, split_axis, group=group)
            attn.n_heads //= n
            attn.o_groups //= n
            attn._group_ids = mx.arange(attn.o_groups)[None]
            layer.ffn.sharding_group = group

    def sanitize(self, weights: Dict[str, mx.array]) -> Dict[str, mx.array]:
        """Map every known checkpoint layout onto this model's names.

        DeepSeek's fp8 and fp4 weights stay packed, as mxfp8 and mxfp4. Raises
        one error naming every key it cannot map.
        """
        args = self.args
        config = args.quantization_config or {}
        block = tuple(config.get("weight_block_size", (128, 128)))
        problems = {}
        # MLX name -> (checkpoint key, array)
        clean, parts = {}, {}
        for key, value in weights.items():
            # The MTP block is only used for speculative decoding.
            if _MTP_KEY.search(key):
                continue
            name = key
            for old, new in _RENAMES:
                name = old.sub(new, name)
            if match := _EXPERT_KEY.fullmatch(name):
                prefix, index, proj, kind = match.groups()
                group = f"{prefix}.switch_mlp.{proj}", args.n_routed_experts
            elif match := _WO_A_KEY.fullmatch(name):
                prefix, index, kind = match.groups()
                group = prefix, args.o_groups
            else:
                clean[name] = (key, value)
                continue
            members = parts.setdefault(group, {}).setdefault(kind, {})
            members[int(index)] = (key, value)
        for (prefix, count), kinds in parts.items():
            complete = True
            for members in kinds.values():
                missing = sorted(set(range(count)) - set(members))
                extra = sorted(set(members) - set(range(count)))
                if missing or extra:
                    key = members[min(members)][0]
                    problems[key] = f"parts missing {missing}, unexpected {extra}"
                    complete = False
            for kind, members in kinds.items() if complete else ():
                value = mx.stack([members[i][1] for i in range(count)])
                clean[f"{prefix}.{kind}"] = (members[0][0], value)

        # fp8 (uint8) and fp4 (int8) weights with one ue8m0 scale per block.
        for name in [n for n in clean if n.endswith(".scale")]:
            prefix = name.removesuffix(".scale")
            key, weight = clean.get(f"{prefix}.weight", (None, None))
            if weight is None or weight.dtype not in (mx.uint8, mx.int8):
                continue
            try:
                weight, scales = _to_mx_format(weight, clean.pop(name)[1], block)
            except ValueError as e:
                problems[key] = str(e)
                del clean[f"{prefix}.weight"]
                continue
            clean[f"{prefix}.weight"] = (key, weight)
            clean[f"{prefix}.scales"] = (key, scales)

        params = tree_flatten(self.parameters(), destination={})
        out = {}
        for name, (key, value) in clean.items():
            prefix, _, kind = name.rpartition(".")
            if (
                prefix.endswith(".attn.wo_a")
                and value.ndim == 2
                and value.shape[0] % args.o_groups == 0
            ):
                # One 2-D weight holds all the output groups.
                value = value.reshape(args.o_groups, -1, value.shape[-1])
            if kind == "tid2eid":
                value = value.astype(mx.int32)
            if kind == "weight" and value.dtype in (mx.uint8, mx.int8):
                problems[key] = f"an fp8 or fp4 weight needs {key[:-6]}scale"
            elif kind in ("scales", "biases"):
                if f"{prefix}.weight" not in params:
                    problems[key] = "no parameter of the model takes it"
            elif name not in params:
                problems[key] = "no parameter of the model takes it"
            elif f"{prefix}.scales" not in clean and value.shape != params[name].shape:
                shape = tuple(params[name].shape)
                problems[key] = f"has shape {tuple(value.shape)}, not {shape}"
            out[name] = value
        if problems:
            raise ValueError(
                f"Cannot load {len(problems)} DeepSeek-V4 checkpoint keys:\n"
                + "\n".join(f"  {k}: {why}" for k, why in sorted(problems.items()))
            )
        if args.quantization is None:
            # No MLX quantization config names the layers that DeepSeek ships
            # packed (and convert keeps packed), so their scales do.
            def packed(path, module):
                scales = out.get(f"{path}.scales")
                if scales is None or not hasattr(module, "to_quantized"):
                    return False
                return infer_quant_config(path, module, out)

            nn.quantize(self, class_predicate=packed)
        return out

    @property
    def cast_predicate(self) -> Callable[[str], bool]:
        # DeepSeek keeps these in float32.
        keep = ("attn_hc.", "ffn_hc.", "hc_head.", "attn_sink", "correction_bias")

        def predicate(k: str) -> bool:
            return not any(s in k for s in keep) and not k.endswith(".ape")

        return predicate
