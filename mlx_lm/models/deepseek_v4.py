# Copyright © 2026 Apple Inc.

import copy
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx.nn.layers.distributed import shard_inplace, shard_linear, sum_gradients

from . import deepseek_v41
from .base import BaseModelArgs
from .cache import (
    CompressorCache,
    SharedWindowCache,
    WindowCompressorCache,
    WindowRows,
)
from .deepseek_v41 import DeepseekV41SwiGLU, SharedMLP, _collapse, _expand
from .pipeline import PipelineMixin
from .rope_utils import YarnRoPE
from .switch_layers import SwitchGLU, SwitchLinear

SLIDING = "sliding_attention"
CSA = "compressed_sparse_attention"
HCA = "heavily_compressed_attention"
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
    num_experts_per_tok: int = 6
    scoring_func: str = "sqrtsoftplus"
    routed_scaling_factor: float = 1.5
    norm_topk_prob: bool = True
    gate_temp: float = 1.0
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
    # The checkpoint's MTP blocks (`mtp.*`), for speculative decoding.
    num_nextn_predict_layers: int = 0
    # Whether they load (load(..., model_config={"mtp": True}), --mtp):
    # without it they cost no memory.
    mtp: bool = False
    # DeepSeek's schema
    compress_ratios: Optional[List[int]] = None
    num_hash_layers: Optional[int] = None
    # The transformers schema
    layer_types: Optional[List[str]] = None
    compress_rates: Optional[Dict[str, int]] = None
    mlp_layer_types: Optional[List[str]] = None
    # DeepSeek's fp8 and fp4 weights
    quantization_config: Optional[Dict[str, Any]] = None

    def __post_init__(self):
        n = self.num_hidden_layers
        rates = {CSA: 4, HCA: 128}
        ratios = self.compress_ratios
        if ratios is not None:
            # DeepSeek's list may end with the MTP layer's ratio; ratio 4 is
            # overlapped and indexed, any other heavily compressed.
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
    """The RoPE of a layer: YaRN on the compress theta for compressed layers,
    the base theta alone for window-only ones."""
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
    """The frequencies of all ``dims`` features: infinite periods leave the
    leading ones unrotated, so one rope call covers a whole head."""
    freqs = make_rope(args, compressed).freqs
    return mx.concatenate([mx.full((dims // 2 - freqs.size,), mx.inf), freqs])


def _rope(x, freqs, offset, scale=1.0):
    """Rotate x [..., L, D] from positions ``offset`` ([B]) on."""
    dims = x.shape[-1]
    return mx.fast.rope(
        x, dims, traditional=True, base=None, scale=scale, offset=offset, freqs=freqs
    )


class Compressor(nn.Module):
    def __init__(self, args: ModelArgs, ratio: int, head_dim: int, overlap: bool):
        super().__init__()
        self.ratio = ratio
        self.head_dim = head_dim
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
        """The pool after x (entry w of a row in its slot w), or None: each
        window of ratio rows that x closes pooled into one entry."""
        return cache.update_and_fetch(self.wkv(x), self.wgate(x), rows, self._pool)

    def _pool(self, kv, gate, idx, pos, first):
        args = self.ape, self.norm.weight, self._freqs, self.ratio, self.overlap
        return _pool(kv, gate, idx, pos, first, *args, self.norm.eps)


def _pool(
    buf_kv, buf_gate, idx, pos, first, ape, norm_weight, freqs, ratio, overlap, eps
):
    idx = mx.stop_gradient(idx)
    batch, n, _ = idx.shape
    shape = (batch, n // ratio, ratio, buf_kv.shape[-1])
    kv = mx.take_along_axis(buf_kv, idx, axis=1).reshape(shape)
    gate = mx.take_along_axis(buf_gate, idx, axis=1).reshape(shape) + ape
    if overlap:
        # Entry w pools the first half of window w - 1 and the second
        # half of window w; nothing comes before position 0.
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
        """The entries each query attends to [B, L, k], or None where every
        visible entry is picked."""
        keys = self.compressor(x, cache, rows)
        n, visible = rows.entries(self.ratio)
        if n <= self.index_topk:
            return None
        batch, length, _ = x.shape
        q = self.wq_b(qr).reshape(batch, length, self.n_heads, self.head_dim)
        q = _rope(q.transpose(0, 2, 1, 3), self._freqs, rows.shift)
        # [B, L, heads, n], in the keys' dtype (DeepSeek's code even rounds
        # these to fp4); the heads' positive scores summed in float32.
        q, keys = q.swapaxes(1, 2).astype(keys.dtype), keys[:, None, :n]
        scores = q @ keys.swapaxes(-1, -2)
        weights = self.weights_proj(x).astype(mx.float32)[..., None]
        weights = weights * (self.n_heads * self.head_dim) ** -0.5
        scores = mx.sum(mx.maximum(scores, 0).astype(mx.float32) * weights, axis=-2)
        scores = mx.where(mx.arange(n) < visible[..., None], scores, -mx.inf)
        k = self.index_topk
        return mx.stop_gradient(mx.argpartition(-scores, k - 1, axis=-1)[..., :k])


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

        # One attention over the window's keys and the compressed keys, each
        # query masked to what it sees, with the sink in the softmax: every
        # visible entry of an HCA pool, a CSA query's top-k entries.
        keys = cache.update_and_fetch(kv, rows)
        mask = rows.window_mask((self.window, keys.shape[1] - 1 - length))
        if self.kind != SLIDING:
            pool = self.compressor(x, cache.compressor, rows)
            n, visible = rows.entries(self.compressor.ratio)
            seen = mx.arange(n) < visible[..., None]
            if self.kind == CSA:
                chosen = self.indexer(x, qr, cache.indexer, rows)
                if chosen is not None:
                    picked = mx.zeros(seen.shape, mx.bool_)
                    picked = mx.put_along_axis(picked, chosen, mx.array(True), -1)
                    seen = seen & picked
            if n > 0:
                keys = mx.concatenate([keys, pool[:, :n]], axis=1)
                mask = mx.concatenate([mask, seen], axis=-1)
        keys = keys[:, None]
        out = mx.fast.scaled_dot_product_attention(
            q,
            keys,
            keys,
            scale=self.scale,
            mask=mask[:, None],
            sinks=self.attn_sink.astype(q.dtype),
        )
        return self._output(out, rows)

    def _output(self, out: mx.array, rows: WindowRows) -> mx.array:
        batch, _, length, _ = out.shape
        # Undo the keys' rotation at the query position.
        out = _rope(out, self._inverse_freqs, rows.shift)
        # Each group of heads has its own projection: [B, groups, L, dims].
        out = out.swapaxes(1, 2).reshape(batch, length, self.o_groups, -1)
        out = out.swapaxes(1, 2)
        # Plain weights as one batched matmul: gather_mm of whole groups
        # needs a JIT-compiled kernel on CUDA; quantized ones go through
        # gather_qmm (and LoRA through its own call).
        if isinstance(self.wo_a, SwitchLinear):
            out = out @ self.wo_a.weight.swapaxes(-1, -2)
        else:
            out = self.wo_a(out, self._group_ids)
        return self.wo_b(out.swapaxes(1, 2).reshape(batch, length, -1))


class Router(nn.Module):
    def __init__(self, args: ModelArgs, hashed: bool = False):
        super().__init__()
        self.weight = mx.zeros(
            (args.n_routed_experts, args.hidden_size), dtype=mx.float32
        )
        self.top_k = args.num_experts_per_tok
        if hashed:
            # Hash layers pick their experts by token id.
            self.tid2eid = mx.zeros((args.vocab_size, self.top_k), dtype=mx.int32)
            self.freeze(recurse=False, keys="tid2eid")
        else:
            self.e_score_correction_bias = mx.zeros(
                (args.n_routed_experts,), dtype=mx.float32
            )
        self.gate_temp = args.gate_temp
        self.norm_topk_prob = args.norm_topk_prob
        self.route_scale = args.routed_scaling_factor

    def __call__(
        self, x: mx.array, input_ids: Optional[mx.array] = None
    ) -> tuple[mx.array, mx.array]:
        hashed = "tid2eid" in self
        choice = self.tid2eid[input_ids] if hashed else self.e_score_correction_bias
        args = self.top_k, self.gate_temp, self.norm_topk_prob, self.route_scale
        return _route(x, self.weight, choice, hashed, *args)


def _route(x, weight, choice, hashed, top_k, temp, norm, scale):
    logits = x.astype(mx.float32) @ weight.astype(mx.float32).T
    # ModelArgs takes sqrtsoftplus scores only.
    scores = mx.sqrt(nn.softplus(logits / temp))
    if hashed:
        chosen = choice
    else:
        # The bias only selects the experts.
        biased = scores + choice
        chosen = mx.argpartition(-biased, top_k - 1, axis=-1)[..., :top_k]
    chosen = mx.stop_gradient(chosen)
    weights = mx.take_along_axis(scores, chosen, axis=-1)
    if norm and top_k > 1:
        weights = weights / (mx.sum(weights, axis=-1, keepdims=True) + 1e-20)
    return chosen, weights * scale


class HashTablesFrozen:
    """Unfreezing leaves the hash layers' expert tables frozen: integer
    lookups, never trained."""

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
        """The streams mixed into one, and the post and comb mixes."""
        pre, post, comb = self(streams)
        return _collapse(streams, pre), post, comb

    def expand(self, x: mx.array, streams: mx.array, post: mx.array, comb: mx.array):
        """The layer's output x written back into the streams."""
        return _expand(x, streams, post, comb)


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
        flat = h.reshape(*h.shape[:2], -1).astype(mx.float32)
        flat = mx.fast.rms_norm(flat, None, self.norm_eps)
        pre = mx.sigmoid((flat @ self.fn.T) * self.scale + self.base) + self.eps
        return _collapse(h, pre)


def _mtp_args(args: ModelArgs, layer_idx: int) -> ModelArgs:
    """The args of MTP block ``layer_idx`` (after the model's layers): its
    attention from DeepSeek's `compress_ratios` entry (none: window only),
    its experts routed, not hashed."""
    ratios = args.compress_ratios or ()
    ratio = ratios[layer_idx] if layer_idx < len(ratios) else 0
    extra = layer_idx + 1 - len(args.layer_types)
    mtp_args = copy.copy(args)
    kind = SLIDING if not ratio else CSA if ratio == 4 else HCA
    mtp_args.layer_types = args.layer_types + [kind] * extra
    mtp_args.mlp_layer_types = args.mlp_layer_types + ["moe"] * extra
    return mtp_args


class MTPBlock(DecoderLayer):
    """DeepSeek's multi-token prediction block: a decoder layer over the
    target's last streams and the next token's embedding, with its own head
    mix and norm before the target's head."""

    def __init__(self, args: ModelArgs, layer_idx: int):
        super().__init__(_mtp_args(args, layer_idx), layer_idx)
        dims, eps = args.hidden_size, args.rms_norm_eps
        self.enorm = nn.RMSNorm(dims, eps=eps)
        self.hnorm = nn.RMSNorm(dims, eps=eps)
        self.e_proj = nn.Linear(dims, dims, bias=False)
        self.h_proj = nn.Linear(dims, dims, bias=False)
        self.hc_head = HyperHead(args)
        self.norm = nn.RMSNorm(dims, eps=eps)

    def __call__(self, h, embeds, input_ids, cache, rows):
        # The embedding goes into every stream of the target's.
        e = self.e_proj(self.enorm(embeds))[:, :, None]
        h = super().__call__(e + self.h_proj(self.hnorm(h)), input_ids, cache, rows)
        return self.norm(self.hc_head(h)), h


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
        return_hidden: bool = False,
    ) -> mx.array:
        h = self.embed_tokens(inputs)
        batch, length, dims = h.shape
        h = mx.broadcast_to(h[:, :, None], (batch, length, self.hc_mult, dims))
        # Every layer's cache holds the same rows.
        rows = cache[0].make_mask(length, batch)
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
        # Evaluating the output also materializes every cache array, so no
        # cache field keeps a growing lazy graph, without a host sync.
        out = mx.depends(out, _cache_arrays(cache))
        # The last layer's streams feed the MTP block.
        return (out, h) if return_hidden else out


def _ue8m0(scale: mx.array) -> mx.array:
    """Power-of-two scales as biased exponents, the scales of MLX's mx modes."""
    if scale.dtype == mx.uint8:
        return scale
    exponent = mx.log2(scale.astype(mx.float32))
    if not mx.array_equal(exponent, mx.round(exponent)):
        raise ValueError("its scales are not powers of two")
    return (exponent + 127).astype(mx.uint8)


def _repack(weight: mx.array, scale: mx.array, block=(32, 32)) -> tuple:
    """Put an fp8 or fp4 weight and its ue8m0 scale in MLX's mxfp8 or mxfp4
    layout, without dequantizing.

    fp8 (uint8 e4m3) has one scale per ``block`` of rows x columns, repeated
    here to one per row and 32 columns. fp4 (int8, two e2m1 values per byte,
    the low nibble first) already has one scale per row and 32 columns.
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
    if cols % 32 or block[1] % 32:
        raise ValueError(
            f"its {cols} columns or {block[1]}-column blocks are not a multiple of 32"
        )
    scale = mx.repeat(_ue8m0(scale), block[0], axis=-2)[..., :rows, :]
    scale = mx.repeat(scale, block[1] // 32, axis=-1)[..., : cols // 32]
    return weight.view(mx.uint32), scale


# Checkpoint names (DeepSeek's release, transformers' save_pretrained, early
# MLX uploads) and this model's.
_RENAMES = tuple(
    (re.compile(old), new)
    for old, new in (
        (r"^model\.mtp\.", "mtp."),
        (r"^mtp\.(\d+)\.hc_head_(fn|base|scale)$", r"mtp.\1.hc_head.\2"),
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
# DeepSeek-V4's MTP block, not another kind of drafter (V4.1's DSpark).
_MTP_BLOCK_KEY = re.compile(r"(^|\.)mtp\.0\.enorm\.weight$")


class Model(HashTablesFrozen, nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        self.model = DeepseekV4Model(args)
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        n, blocks = args.num_hidden_layers, args.num_nextn_predict_layers
        self.mtp = [MTPBlock(args, n + i) for i in range(blocks if args.mtp else 0)]

    def __call__(
        self,
        inputs: mx.array,
        cache: Optional[List[WindowCompressorCache]] = None,
        return_hidden: bool = False,
    ) -> mx.array:
        """The logits, and with ``return_hidden`` the last layer's streams
        [B, L, hc, D] that ``mtp_draft`` takes."""
        if cache is None:
            cache = self.make_cache()
        out = self.model(inputs, cache, return_hidden)
        if return_hidden:
            return self.lm_head(out[0]), out[1]
        return self.lm_head(out)

    def make_mtp_cache(self) -> List[WindowCompressorCache]:
        return [self._layer_cache(self.mtp[0].attn.kind)] if self.mtp else []

    def mtp_draft(
        self, hidden: mx.array, inputs: mx.array, cache: List[WindowCompressorCache]
    ):
        """The MTP block's logits for the tokens after ``inputs`` [B, L],
        given the target's streams ``hidden`` at the positions before them;
        and the block's streams, the ``hidden`` of its next step."""
        block = self.mtp[0]
        rows = cache[0].make_mask(inputs.shape[1], inputs.shape[0])
        embeds = self.model.embed_tokens(inputs)
        out, h = block(hidden, embeds, inputs, cache[0], rows)
        return self.lm_head(mx.depends(out, _cache_arrays(cache))), h

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

        for layer in [*self.layers, *self.mtp]:
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
        """Map every known checkpoint layout onto this model's names, keeping
        DeepSeek's fp8 and fp4 weights packed (mxfp8 and mxfp4 scales)."""
        args = self.args
        block = (args.quantization_config or {}).get("weight_block_size", (128, 128))
        mtp = self._keep_mtp(weights)
        out, parts, problems = {}, {}, {}
        for key, value in weights.items():
            # The MTP block is only used for speculative decoding.
            if _MTP_KEY.search(key) and not mtp:
                continue
            name = key
            for old, new in _RENAMES:
                name = old.sub(new, name)
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
                out[name], out[f"{prefix}.scales"] = _repack(out[name], scale, block)
            except ValueError as e:
                problems[name] = str(e)
        if problems:
            raise ValueError(
                f"Cannot load {len(problems)} DeepSeek-V4 checkpoint weights:\n"
                + "\n".join(f"  {k}: {why}" for k, why in sorted(problems.items()))
            )
        for name, value in out.items():
            if ".attn.wo_a." in name and value.ndim == 2:
                # One 2-D weight holds all the output groups.
                out[name] = value.reshape(args.o_groups, -1, value.shape[-1])
            elif name.endswith(".tid2eid"):
                out[name] = value.astype(mx.int32)
        return out

    def _keep_mtp(self, weights: Dict[str, mx.array]) -> bool:
        """Whether the MTP blocks load: where asked for (``args.mtp``) and the
        checkpoint has them."""
        keys = [k for k in weights if _MTP_KEY.search(k)] if self.mtp else []
        if keys and not any(_MTP_BLOCK_KEY.search(k) for k in keys):
            print(
                "[WARNING] The checkpoint's mtp.* weights are not a DeepSeek-V4 "
                "MTP block (no mtp.0.enorm): loading without it."
            )
            keys = []
        if not keys:
            self.mtp = []
        return bool(self.mtp)

    @property
    def cast_predicate(self) -> Callable[[str], bool]:
        # DeepSeek keeps these in float32.
        keep = ("attn_hc.", "ffn_hc.", "hc_head.", "attn_sink", "correction_bias")

        def predicate(k: str) -> bool:
            return not any(s in k for s in keep) and not k.endswith(".ape")

        return predicate
