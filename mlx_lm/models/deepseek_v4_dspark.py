# Copyright © 2026 Apple Inc.

"""DeepSeek-V4-Flash-0731's (and V4-Pro-0813's) DSpark drafter: its stages
(``DSparkStage``, the checkpoint's ``mtp.0..2``, loaded as
``Model.dspark``), the round's two forwards (``dspark_context``,
``dspark_block``) and the drafter of ``speculative_generate_step``
(``DSparkDrafter``).

A round: the target's streams after each of ``dspark_target_layer_ids``,
averaged over the hyper-connection copies and concatenated, go through
``main_proj`` and ``main_norm``; each stage's ``wkv``, ``kv_norm`` and RoPE at
their positions make that stage's context keys (also its values), of which
the drafter keeps a sliding window (``DSparkCache``). The query block is the
target's next input (the anchor) and ``dspark_block_size - 1`` noise tokens,
at the positions after the context, embedded into every stream; each stage
attends over [window context, the block's own keys] with no mask inside the
block, with its sinks. The last stage's head mix and norm and the target's
head give every position's base logits at once; drafts are then taken one by
one, draft i from ``base_i + markov_w2(markov_w1[prev])`` (prev: the anchor,
then the draft before). The block's position i predicts draft i (the anchor's
position the first draft): ``dspark_block_size`` drafts a round at most.
"""

from typing import Any, List, Optional

import mlx.core as mx
import mlx.nn as nn

from .drafters import Drafter
from .dspark_cache import DSparkCache
from .switch_layers import SwitchLinear


def is_dspark(args) -> bool:
    """Whether the checkpoint's config describes a DSpark drafter."""
    return bool(getattr(args, "dspark_target_layer_ids", None))


def dspark_stages(args) -> int:
    """The drafter's stage count: one trailing `compress_ratios` entry per
    stage (0731: three zeros; `num_nextn_predict_layers` still reads 1)."""
    extra = len(args.compress_ratios or ()) - args.num_hidden_layers
    return extra if extra > 0 else 3


def _rope_periods(args) -> mx.array:
    """RoPE periods of a window-only layer's whole head (rope_theta, no YaRN;
    RoPE on the last ``qk_rope_head_dim`` channels, the others unrotated)."""
    rope = args.qk_rope_head_dim
    periods = args.rope_theta ** (mx.arange(0, rope, 2, dtype=mx.float32) / rope)
    unrotated = mx.full(((args.head_dim - rope) // 2,), mx.inf)
    return mx.concatenate([unrotated, periods])


def _rope(x, periods, offset):
    return mx.fast.rope(
        x,
        x.shape[-1],
        traditional=True,
        base=None,
        scale=1.0,
        offset=offset,
        freqs=periods,
    )


class DSparkAttention(nn.Module):
    """A window-only DeepSeek-V4 attention (the checkpoint's names) whose
    keys are the context's, from the target's projected states, and the
    block's own."""

    def __init__(self, args):
        super().__init__()
        self.n_heads = args.num_attention_heads
        self.head_dim = args.head_dim
        self.o_groups = args.o_groups
        self.eps = args.rms_norm_eps
        self.scale = args.head_dim**-0.5
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
        self._periods = _rope_periods(args)

    def keys(self, x: mx.array, offset) -> mx.array:
        """The keys [B, L, head_dim] of states x [B, L, D] from ``offset``."""
        return _rope(self.kv_norm(self.wkv(x)), self._periods, offset)

    def __call__(self, x: mx.array, context: mx.array, offset, mask=None) -> mx.array:
        """The block x [B, L, D] at positions ``offset`` on, over the
        ``context`` keys [B, W, head_dim] and its own, with no mask inside
        the block (``mask``: the context keys each row has)."""
        B, L, _ = x.shape
        q = self.wq_b(self.q_norm(self.wq_a(x)))
        q = q.reshape(B, L, self.n_heads, self.head_dim)
        q = mx.fast.rms_norm(q, None, self.eps).transpose(0, 2, 1, 3)
        q = _rope(q, self._periods, offset)
        keys = mx.concatenate([context, self.keys(x, offset)], axis=1)[:, None]
        out = mx.fast.scaled_dot_product_attention(
            q,
            keys,
            keys,
            scale=self.scale,
            mask=mask,
            sinks=self.attn_sink.astype(q.dtype),
        )
        # Undo the keys' rotation at the query positions.
        out = _rope(out, -self._periods, offset)
        out = out.transpose(0, 2, 1, 3).reshape(B, L, self.o_groups, -1)
        out = out.swapaxes(1, 2)
        if isinstance(self.wo_a, SwitchLinear):
            out = out @ self.wo_a.weight.swapaxes(-1, -2)
        else:
            out = self.wo_a(out, mx.arange(self.o_groups)[None])
        return self.wo_b(out.swapaxes(1, 2).reshape(B, L, -1))


class MarkovHead(nn.Module):
    """The low-rank bigram correction: ``markov_w2(markov_w1[prev])``."""

    def __init__(self, vocab_size: int, rank: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)

    def __call__(self, prev: mx.array):
        e = self.markov_w1(prev)
        return self.markov_w2(e), e


class ConfidenceHead(nn.Module):
    """The probability that a draft is accepted, from the block's state
    after the head mix and the Markov embedding of the token before it."""

    def __init__(self, dims: int):
        super().__init__()
        self.proj = nn.Linear(dims, 1, bias=True)

    def __call__(self, x: mx.array, markov: mx.array) -> mx.array:
        features = mx.concatenate([x, markov.astype(x.dtype)], axis=-1)
        return mx.sigmoid(self.proj(features.astype(mx.float32))[..., 0])


class DSparkStage(nn.Module):
    """One DSpark stage: a window-only decoder layer with routed experts;
    the first also projects the target's states (``main_proj``,
    ``main_norm``), the last has the head mix, norm, Markov and confidence
    heads."""

    def __init__(self, args, first: bool, last: bool, layers):
        # The target's MoE, HyperConnection and HyperHead (deepseek_v4.py's).
        MoE, HyperConnection, HyperHead = layers
        super().__init__()
        dims, eps = args.hidden_size, args.rms_norm_eps
        self.attn = DSparkAttention(args)
        self.ffn = MoE(args, hashed=False)
        self.attn_norm = nn.RMSNorm(dims, eps=eps)
        self.ffn_norm = nn.RMSNorm(dims, eps=eps)
        self.attn_hc = HyperConnection(args)
        self.ffn_hc = HyperConnection(args)
        if first:
            taps = len(args.dspark_target_layer_ids)
            self.main_proj = nn.Linear(taps * dims, dims, bias=False)
            self.main_norm = nn.RMSNorm(dims, eps=eps)
        if last:
            rank = args.dspark_markov_rank
            self.hc_head = HyperHead(args)
            self.norm = nn.RMSNorm(dims, eps=eps)
            self.markov_head = MarkovHead(args.vocab_size, rank)
            self.confidence_head = ConfidenceHead(dims + rank)

    def __call__(self, h, context, offset, input_ids, mask=None):
        x, post, comb = self.attn_hc.collapse(h)
        x = self.attn(self.attn_norm(x), context, offset, mask)
        h = self.attn_hc.expand(x, h, post, comb)
        x, post, comb = self.ffn_hc.collapse(h)
        x = self.ffn(self.ffn_norm(x), input_ids)
        return self.ffn_hc.expand(x, h, post, comb)


def make_dspark(args, layers) -> List[DSparkStage]:
    n = dspark_stages(args)
    return [DSparkStage(args, i == 0, i == n - 1, layers) for i in range(n)]


def dspark_taps(streams: List[mx.array]) -> mx.array:
    """The drafter's input from the target's streams [B, L, hc, D] after
    each target layer: their mean over the copies, concatenated."""
    return mx.concatenate([h.mean(axis=2) for h in streams], axis=-1)


def dspark_context(model, taps: mx.array, offset) -> mx.array:
    """Every stage's context keys [stages, B, L, head_dim] of the target's
    ``taps`` [B, L, n * D] at positions ``offset`` on (an int, or each
    row's [B])."""
    first = model.dspark[0]
    main_x = first.main_norm(first.main_proj(taps))
    return mx.stack([s.attn.keys(main_x, offset) for s in model.dspark])


def dspark_block(
    model, block: mx.array, context: mx.array, offset, mask: Optional[mx.array] = None
):
    """The base logits [B, L, V] of the query ``block`` [B, L] at positions
    ``offset`` on (an int, or each row's [B]) over each stage's ``context``
    keys [stages, B, W, D] (``mask`` [B, W]: the ones each row has; None:
    all), and the last stage's mixed state [B, L, D] (the confidence
    head's)."""
    embeds = model.model.embed_tokens(block)
    B, L, D = embeds.shape
    if mask is not None:
        own = mx.ones((B, L), mx.bool_)
        mask = mx.concatenate([mask, own], axis=1)[:, None, None]
    hc = model.args.hc_mult
    h = mx.broadcast_to(embeds[:, :, None], (B, L, hc, D))
    for stage, keys in zip(model.dspark, context):
        h = stage(h, keys, offset, block, mask)
    last = model.dspark[-1]
    x = last.hc_head(h)
    return model.lm_head(last.norm(x)), x


def check_dspark(model: nn.Module):
    if not getattr(model, "dspark", None):
        raise ValueError(
            f"The model ({type(model).__module__}) has no DSpark drafter: its "
            "checkpoint has none, or it was loaded without it "
            '(load(..., model_config={"mtp": True}) loads it).'
        )


def make_dspark_prompt_cache(model: nn.Module) -> List[Any]:
    """The prompt cache entries of the model's DSpark drafter, to follow the
    model's own in a prompt cache."""
    return [DSparkCache(model.args.sliding_window)]


def check_dspark_cache(model_cache: List[Any], cache: List[Any]):
    if not (
        len(cache) == 1
        and isinstance(cache[0], DSparkCache)
        and cache[0].size() == model_cache[0].size()
    ):
        raise ValueError(
            "Drafting with DSpark needs the prompt cache's DSpark entry in "
            "step with the model's: make_prompt_cache(model) + "
            "make_drafter(model).make_cache() (mlx_lm.generate) makes one, "
            "filled by mtp=True; mlx_lm.cache_prompt --mtp saves one."
        )


class DSparkDrafter(Drafter):
    """Drafts with the target's DSpark drafter (``model.dspark``) for the
    rows of its cache (one ``DSparkCache``, in step with the target's
    caches): up to ``dspark_block_size`` drafts a row from one forward of
    the stages over each row's query block, then the Markov head draft by
    draft. Each row's context extends with the target's states of every
    position of a round, before the host knows how many drafts it kept; the
    loop's trim leaves those it keeps (its input and its own count of
    accepted drafts).

    ``confidence``: stop drafting at the first draft (after the first)
    whose confidence head says below it for every row (None: the head is
    not read; where it is, each draft after the first waits on the device
    for it)."""

    return_hidden = True

    def __init__(self, model: nn.Module, confidence: Optional[float] = None):
        check_dspark(model)
        self.model = model
        self.block_size = model.args.dspark_block_size
        self.noise = model.args.dspark_noise_token_id
        self.confidence = confidence
        # Per round: the drafts' confidences [B] (for measuring the head).
        self.confidences = []

    def make_cache(self):
        return make_dspark_prompt_cache(self.model)

    def check_cache(self, model_cache, cache):
        check_dspark_cache(model_cache, cache)

    @staticmethod
    def _offset(context):
        offsets = context.offsets
        return offsets[0] if len(offsets) == 1 else mx.array(offsets)

    def _extend(self, context, hidden, counts):
        keys = dspark_context(self.model, hidden, self._offset(context))
        context.push(keys, counts)

    def prefill(self, cache, tokens, hidden, lengths):
        self._extend(cache[0], hidden, lengths)

    def draft(self, cache, inputs, num_draft, sample):
        context = cache[0]
        B = inputs.shape[0]
        n = min(num_draft, self.block_size)
        if n <= 0 or context.size() == 0:
            return mx.zeros((B, 0), mx.uint32), None
        # The block as trained: the anchor and block_size - 1 noise tokens.
        # A row with no context yet (a one-token prompt in a batch) drafts
        # from its block alone.
        y = inputs.astype(mx.uint32)
        noise = mx.full((B, self.block_size - 1), self.noise, mx.uint32)
        block = mx.concatenate([y[:, None], noise], axis=1)
        keys, mask = context.window_keys()
        base, x = dspark_block(self.model, block, keys, self._offset(context), mask)
        last = self.model.dspark[-1]
        ys, logprobs, confs, prev, tokens = [], [], [], y, y[:, None]
        for i in range(n):
            bias, e = last.markov_head(prev)
            if self.confidence is not None:
                c = last.confidence_head(x[:, i], e)
                confs.append(c)
                if i > 0 and (c < self.confidence).all().item():
                    break
            prev, lp = sample(base[:, i] + bias, tokens)
            prev = prev.astype(mx.uint32)
            tokens = mx.concatenate([tokens, prev[:, None]], axis=1)
            mx.async_eval(prev)
            ys.append(prev)
            logprobs.append(lp)
        self.confidences.append(confs)
        return mx.stack(ys, axis=1), mx.stack(logprobs, axis=1)

    def accept(self, cache, accepted, hidden, tokens):
        # The target's states of every position of the round; the loop's
        # trim drops what a row did not keep.
        context = cache[0]
        self._extend(context, hidden, None)
        mx.async_eval(context.kv)

    def finish(self, cache):
        mx.eval([c.state for c in cache])
