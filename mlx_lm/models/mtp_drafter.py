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
    Once the target verified a round, the block reads every position of it
    with the target's tokens after them (a row's accepted drafts and its
    next input), before the host knows how many each row kept: the loop's
    trim drops the positions a row did not keep, and the block's output at
    a row's last kept position (``MTPCache.ahead``) gives its first draft
    of the next round. Where the block has not read a row's last position
    yet (after the prompt, or a prompt cache's: the block one position
    behind the target), a round's first block call reads it with the next
    input. The next calls run on the block's own streams and are trimmed
    after, so the block's cache only holds what the target's streams
    give."""

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

    @staticmethod
    def _behind(mtp_cache):
        """Forget the block's read of each row's last position (its next
        input is not the cache's): the block one position behind."""
        if mtp_cache.ahead is not None:
            trim_rows([mtp_cache.cache], [1] * len(mtp_cache.valid))
            mtp_cache.ahead = None

    def prefill(self, cache, tokens, hidden, lengths):
        mtp_cache = cache[0]
        # The last position the block read again, with the chunk's first
        # token (the single loop's last token given).
        self._behind(mtp_cache)
        # A row with no positions yet starts with the chunk's second token.
        fresh = [int(v == 0) for v in mtp_cache.valid]
        if mtp_cache.empty():
            last = mx.zeros_like(hidden[:, :1])
        else:
            last = mtp_cache.last([1] * len(lengths))
        h = mx.concatenate([last, hidden[:, :-1]], axis=1)
        counts = [max(n - f, 0) for n, f in zip(lengths, fresh)]
        if max(counts) > 0:
            self._read(mtp_cache, h, tokens, fresh, counts)
        mtp_cache.push(hidden, lengths)

    def draft(self, cache, inputs, num_draft, sample):
        B, N = inputs.shape[0], num_draft
        mtp_cache = cache[0]
        self._drafts = mx.zeros((B, 0), mx.uint32)
        if mtp_cache.ahead is not None:
            # The block read every row's last position last round.
            if N <= 0:
                return self._drafts, None
            fresh = [0] * B
            logits, hidden = mtp_cache.ahead
        else:
            # A row without the target's streams yet (a one-token prompt)
            # drafts from zeros; its block forgets that position.
            fresh = [int(v == 0) for v in mtp_cache.valid]
            if all(fresh):
                return self._drafts, None
            # Each row's last position, with its next input.
            hidden = mtp_cache.last([1] * B)
            if any(fresh):
                mask = mx.array(fresh, mx.bool_).reshape(-1, *(1,) * (hidden.ndim - 1))
                hidden = mx.where(mask, mx.zeros_like(hidden), hidden)
            tokens = inputs.astype(mx.uint32)[:, None]
            logits, hidden = self.model.mtp_draft(hidden, tokens, [mtp_cache.cache])
            if N <= 0:
                trim_rows([mtp_cache.cache], fresh)
                return self._drafts, None
            logits, hidden = logits[:, -1], hidden[:, -1:]

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

    def accept(self, cache, accepted, hidden, tokens):
        # The target's streams of every position of the round, and the
        # block's read of them with the target's tokens after them; the
        # loop's trim drops what a row did not keep.
        mtp_cache = cache[0]
        B, L = tokens.shape
        mtp_cache.push(hidden)
        tokens = tokens.astype(mx.uint32)
        logits, out = self._read(mtp_cache, hidden, tokens, [0] * B, [L] * B)
        index = mx.arange(B)
        mtp_cache.ahead = (logits[index, accepted], out[index, accepted][:, None])
        mx.async_eval(mtp_cache.hidden, *mtp_cache.ahead)

    def finish(self, cache):
        # The block reads what the target kept, but the last position (one
        # row: the single loop's cache or a finished row's).
        mtp_cache = cache[0]
        self._behind(mtp_cache)
        mx.eval([c.state for c in cache])
