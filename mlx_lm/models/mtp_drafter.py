# Copyright © 2026 Apple Inc.

"""DeepSeek-V4's multi-token prediction block as a drafter, for
``speculative_generate_step`` (one row) and ``BatchGenerator`` (many), and
``make_drafter``: what ``mtp=True`` drafts with."""

from typing import Any, List, Optional

import mlx.core as mx
import mlx.nn as nn

from .cache import MTPCache
from .drafters import Drafter, trim_rows


def check_mtp(model: nn.Module, draft_model: Optional[nn.Module] = None):
    """Raise a ValueError where the model cannot draft with its own MTP
    block."""
    if draft_model is not None:
        raise ValueError("Drafting with MTP and a draft model are exclusive.")
    if not (hasattr(model, "mtp_draft") and getattr(model, "mtp", None)):
        raise ValueError(
            f"The model ({type(model).__module__}) has no MTP block to draft "
            "with: its checkpoint has none, or it was loaded without it "
            '(load(..., model_config={"mtp": True}) loads it).'
        )


def make_drafter(model: nn.Module, draft_model: Optional[nn.Module] = None) -> Drafter:
    """What ``mtp=True`` drafts with: the drafting block the model's
    checkpoint carries, loaded with ``load(..., model_config={"mtp":
    True})``: the class the model names (``model.drafter_class``;
    DeepSeek-V4: its MTP block's, or on V4-Flash-0731 / V4-Pro-0813 its
    DSpark drafter's), else the MTP block's (``MTPDrafter``), made of
    ``model``. Raises a ValueError where there is none."""
    if draft_model is not None:
        raise ValueError("Drafting with MTP and a draft model are exclusive.")
    return getattr(model, "drafter_class", MTPDrafter)(model)


def make_mtp_prompt_cache(model: nn.Module) -> List[Any]:
    """The prompt cache entries of the model's MTP block, to follow the
    model's own in a prompt cache for ``mtp=True``."""
    return [MTPCache(c) for c in model.make_mtp_cache()]


def check_mtp_cache(model_cache: List[Any], cache: List[Any]):
    """Raise a ValueError where ``cache`` is not an MTP entry in step with
    the model's caches."""
    size = model_cache[0].size()
    mtp_cache = cache[0] if len(cache) == 1 else None
    if not isinstance(mtp_cache, MTPCache) or (
        mtp_cache.cache.size() != max(size - 1, 0) or mtp_cache.empty() != (size == 0)
    ):
        raise ValueError(
            "Drafting with MTP needs the prompt cache's MTP entry in step "
            "with the model's (make_mtp_prompt_cache, filled by mtp=True)."
        )


class MTPDrafter(Drafter):
    """Drafts with the target's own multi-token prediction block
    (``model.mtp_draft``) for the rows of its cache: one ``MTPCache`` (one
    row) or ``BatchMTPCache``, which keeps the target's last streams of
    each row. The block reads position p's streams with the token after it.
    A row's block lags: it has not read the positions it accepted last
    round (``pending``: the tokens after them); a round's first block call
    reads them with the row's last position and next input, the next
    calls run on the block's own streams and are trimmed after, so the
    block's cache only holds what the target's streams give."""

    return_hidden = True

    def __init__(self, model: nn.Module):
        check_mtp(model)
        self.model = model

    def make_cache(self):
        return make_mtp_prompt_cache(self.model)

    def check_cache(self, model_cache, cache):
        check_mtp_cache(model_cache, cache)

    def _read(self, cache, hidden, tokens, skip, lengths):
        """The block over row b's positions ``skip[b]`` to ``skip[b] +
        lengths[b]`` of ``hidden``/``tokens`` [B, L] (right-padded)."""
        block = cache.cache
        if tokens.shape[0] == 1:
            s, n = skip[0], lengths[0]
            return self.model.mtp_draft(
                hidden[:, s : s + n], tokens[:, s : s + n], [block]
            )
        padded = any(skip) or min(lengths) < tokens.shape[1]
        if padded:
            block.prepare(left_padding=skip, lengths=lengths)
        out = self.model.mtp_draft(hidden, tokens, [block])
        if padded:
            block.finalize()
        return out

    def prefill(self, cache, tokens, hidden, lengths):
        mtp_cache = cache[0]
        # The positions a row accepted and its block has not read (the
        # single loop's last token given) go first.
        P = max(len(p) for p in mtp_cache.pending)
        if P > 0:
            if tokens.shape[0] > 1:
                raise ValueError("A batch's rows are prefilled with no lag.")
            tokens = mx.concatenate([mx.array(mtp_cache.pending, mx.uint32), tokens], 1)
            mtp_cache.pending = [[]]
        # A row with no positions yet starts with the chunk's second token.
        fresh = [int(v == 0) for v in mtp_cache.valid]
        if mtp_cache.empty():
            last = mx.zeros_like(hidden[:, :1])
        else:
            last = mtp_cache.last([P + 1] * len(lengths))
        h = mx.concatenate([last, hidden[:, :-1]], axis=1)
        counts = [max(n + P - f, 0) for n, f in zip(lengths, fresh)]
        if max(counts) > 0:
            self._read(mtp_cache, h, tokens, fresh, counts)
        mtp_cache.push(hidden, lengths)

    def draft(self, cache, inputs, num_draft, sample):
        B, N = inputs.shape[0], num_draft
        mtp_cache = cache[0]
        self._drafts = mx.zeros((B, 0), mx.uint32)
        # A row without the target's streams yet (a one-token prompt) drafts
        # from zeros; its block forgets that position.
        fresh = [int(v == 0) for v in mtp_cache.valid]
        if all(fresh):
            return self._drafts, None

        # The positions each row's block has not read, with the token after
        # each, then the drafts.
        pending = mtp_cache.pending
        counts = [len(p) + 1 for p in pending]
        L = max(counts)
        hidden = mtp_cache.last(counts)
        if any(fresh):
            mask = mx.array(fresh, mx.bool_).reshape(-1, *(1,) * (hidden.ndim - 1))
            hidden = mx.where(mask, mx.zeros_like(hidden), hidden)
        rows = [
            p + [y] + [0] * (L - len(p) - 1) for p, y in zip(pending, inputs.tolist())
        ]
        tokens = mx.array(rows, mx.uint32)
        logits, hidden = self._read(mtp_cache, hidden, tokens, [0] * B, counts)
        mtp_cache.pending = [[] for _ in range(B)]
        if N <= 0:
            trim_rows([mtp_cache.cache], fresh)
            return self._drafts, None
        index, last = mx.arange(B), mx.array(counts) - 1
        logits, hidden = logits[index, last], hidden[index, last][:, None]

        drafts, dists, context = [], [], inputs[:, None]
        for i in range(N):
            if i > 0:
                logits, hidden = self.model.mtp_draft(
                    hidden, drafts[-1][:, None], [mtp_cache.cache]
                )
                logits = logits[:, -1]
            y, logprobs = sample(logits, context)
            y = y.astype(mx.uint32)
            context = mx.concatenate([context, y[:, None]], axis=1)
            mx.async_eval(y)
            drafts.append(y)
            dists.append(logprobs)
        # Only the target's streams stay in the block's cache.
        trim_rows([mtp_cache.cache], [N - 1 + f for f in fresh])
        self._drafts = mx.stack(drafts, axis=1)
        return self._drafts, mx.stack(dists, axis=1)

    def accept(self, cache, accepted, hidden):
        # The target's streams of each row's kept positions; the block reads
        # them next round, with the tokens after them.
        mtp_cache = cache[0]
        mtp_cache.push(hidden, [m + 1 for m in accepted])
        drafts = self._drafts.tolist()
        mtp_cache.pending = [d[:m] for d, m in zip(drafts, accepted)]
        mx.async_eval(mtp_cache.hidden)

    def finish(self, cache):
        # The block reads what the target kept, but the last position (one
        # row: the single loop's cache or a finished row's).
        mtp_cache = cache[0]
        if pending := mtp_cache.pending[0]:
            n = len(pending)
            hidden = mtp_cache.last([n + 1])[:, :n]
            self.model.mtp_draft(hidden, mx.array([pending]), [mtp_cache.cache])
            mtp_cache.pending = [[]]
        mx.eval([c.state for c in cache])
