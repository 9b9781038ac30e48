# Copyright © 2026 Apple Inc.

"""DeepSeek-V4's multi-token prediction block as a drafter, for
``speculative_generate_step`` (``MTPDrafter``) and ``BatchGenerator``
(``BatchMTPDrafter``)."""

from typing import Any, List, Optional

import mlx.core as mx
import mlx.nn as nn

from .cache import MTPCache
from .drafters import Drafter, trim_exactly


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


def make_mtp_prompt_cache(model: nn.Module) -> List[Any]:
    """The prompt cache entries of the model's MTP block, to follow the
    model's own in a prompt cache for ``mtp=True``."""
    return [MTPCache(c) for c in model.make_mtp_cache()]


def check_mtp_cache(model_cache: List[Any], mtp_cache: Any):
    """Raise a ValueError where ``mtp_cache`` is not an MTP entry in step
    with the model's caches."""
    size = model_cache[0].size()
    if not isinstance(mtp_cache, MTPCache) or (
        mtp_cache.cache.size() != max(size - 1, 0) or mtp_cache.empty() != (size == 0)
    ):
        raise ValueError(
            "Drafting with MTP needs the prompt cache's MTP entry in step "
            "with the model's (make_mtp_prompt_cache, filled by mtp=True)."
        )


class MTPDrafter(Drafter):
    """Drafts with the target's own multi-token prediction block
    (``model.mtp_draft``). A round's first block call reads the target's
    streams of the positions it kept last round, each with the token after
    it; the next calls run on the block's own streams, and those entries
    are trimmed after, so the block's cache only holds what the target's
    streams give. ``cache`` is one ``MTPCache``: the block's cache, one
    position behind the target's, and the target's last streams."""

    return_hidden = True

    def __init__(
        self,
        model: nn.Module,
        cache: Optional[List[Any]] = None,
        model_cache: Optional[List[Any]] = None,
    ):
        check_mtp(model)
        self.model = model
        self.cache = make_mtp_prompt_cache(model) if cache is None else cache
        if model_cache is not None:
            check_mtp_cache(
                model_cache, self.cache[0] if len(self.cache) == 1 else None
            )
        self.mtp_cache = self.cache[0]
        self._block = [self.mtp_cache.cache]
        # The target's streams of the positions the block has not read, and
        # the tokens after them but the last's (the target's next input).
        self._hidden = None
        if not self.mtp_cache.empty():
            self._hidden = self.mtp_cache.hidden[:, -1:]
        self._tokens = mx.array([], mx.uint32)

    def _read(self, hidden, tokens):
        return self.model.mtp_draft(hidden, tokens[None], self._block)

    def prefill(self, tokens, hidden):
        if self._hidden is not None:
            h = mx.concatenate([self._hidden, hidden[:, :-1]], axis=1)
            t = mx.concatenate([self._tokens, tokens])
        else:
            h, t = hidden[:, :-1], tokens[1:]
        if t.size > 0:
            self._read(h, t)
        self._hidden, self._tokens = hidden[:, -1:], mx.array([], mx.uint32)
        self.mtp_cache.push(hidden)

    def draft(self, y, num_draft, sample):
        self._drafts = mx.array([], mx.uint32)
        # Nothing to draft from before the target's first step.
        if self._hidden is None:
            return self._drafts, None
        h, t = self._hidden, mx.concatenate([self._tokens, y])
        self._hidden = None
        if num_draft <= 0:
            # The block still reads the positions, as a round's first call.
            self._read(h, t)
            return self._drafts, None
        ys, logprobs, context = [], [], y
        for _ in range(num_draft):
            logits, h = self._read(h, t)
            t, lp = sample(logits[0, -1:], context)
            h = h[:, -1:]
            context = mx.concatenate([context, t])
            mx.async_eval(t)
            ys.append(t)
            logprobs.append(lp)
        # Only the target's streams are kept: the block's own come out.
        trim_exactly(self._block, num_draft - 1)
        self._drafts = mx.concatenate(ys)
        return self._drafts, mx.concatenate(logprobs)

    def accept(self, num_accept, hidden):
        # The target's streams of the kept positions, each with the token
        # after it (the last one's is the target's next input).
        self._hidden = hidden[:, : num_accept + 1]
        self._tokens = self._drafts[:num_accept]
        self.mtp_cache.push(self._hidden)
        mx.eval(self.mtp_cache.hidden)

    def finish(self):
        # The block reads what the target kept, but the last position.
        if self._hidden is not None and self._tokens.size > 0:
            self._read(self._hidden[:, :-1], self._tokens)
            self._hidden = self._hidden[:, -1:]
            self._tokens = mx.array([], mx.uint32)
        mx.eval([c.state for c in self.cache])


def trim_rows(cache: List[Any], counts: List[int]):
    """Rewind each batch row b of every cache by ``counts[b]`` tokens."""
    if not any(counts):
        return
    for c in cache:
        if any(n > m for n, m in zip(counts, c.row_max_trim)):
            raise ValueError(
                f"Speculative decoding needs to trim {max(counts)} tokens but "
                "the prompt cache cannot: use fewer draft tokens."
            )
    for c in cache:
        c.trim_rows(counts)


class BatchMTPDrafter:
    """``MTPDrafter`` for the rows of a ``BatchGenerator``, each at its own
    count. Its part of a batch's prompt cache (``cache`` below) is one
    ``BatchMTPCache``; a row's block has not read the positions the row
    accepted last round (``accepted``): the next ``draft`` reads them with
    the row's last one, ``extract`` on a finished row's cache."""

    return_hidden = True

    def __init__(self, model: nn.Module):
        # check_mtp(model) says whether it can draft.
        self.model = model

    def make_cache(self) -> List[Any]:
        return make_mtp_prompt_cache(self.model)

    def check_cache(self, model_cache: List[Any], cache: List[Any]):
        check_mtp_cache(model_cache, cache[0] if len(cache) == 1 else None)

    def prefill(self, cache, inputs, hidden, counts):
        """Give the block each row's first ``counts[b]`` positions of a
        chunk of ``inputs`` [B, L] with the target's streams ``hidden``, but
        the last, each with the token after it (after the last kept
        position's first, which it has not seen), and keep the streams."""
        mtp_cache = cache[0]
        # A row with no positions yet starts with the chunk's second token.
        fresh = [v == 0 for v in mtp_cache.valid]
        if mtp_cache.empty():
            last = mx.zeros_like(hidden[:, :1])
        else:
            last = mtp_cache.last([1] * len(counts))
        h = mx.concatenate([last, hidden[:, :-1]], axis=1)
        lengths = [max(c - f, 0) for c, f in zip(counts, fresh)]
        if max(lengths) > 0:
            block = mtp_cache.cache
            block.prepare(left_padding=[int(f) for f in fresh], lengths=lengths)
            self.model.mtp_draft(h, inputs, [block])
            block.finalize()
        mtp_cache.push(hidden, counts)

    def draft(self, cache, inputs, tokens, accepted, num_draft, sample):
        """Each row's ``num_draft`` drafts [B, N] after its next input
        ``inputs[b]`` (its history ``tokens[b]``) and the log-probabilities
        [B, N, V] they were drawn from (``sample(logprobs [B, V])``)."""
        B, N = len(inputs), num_draft
        mtp_cache = cache[0]
        block = [mtp_cache.cache]
        # A row without the target's streams yet (a one-token prompt) drafts
        # from zeros; its block forgets that position.
        fresh = [v == 0 for v in mtp_cache.valid]
        if N == 0 or all(fresh):
            return mx.zeros((B, 0), mx.uint32), None

        # The positions each row's block has not read, with the token after
        # each, then the drafts.
        counts = [lag + 1 for lag in accepted]
        L = max(counts)
        hidden = mtp_cache.last(counts)
        if any(fresh):
            mask = mx.array(fresh).reshape(-1, *(1,) * (hidden.ndim - 1))
            hidden = mx.where(mask, mx.zeros_like(hidden), hidden)
        rows = [
            t[len(t) - lag :] + [y] + [0] * (L - lag - 1)
            for t, lag, y in zip(tokens, accepted, inputs)
        ]
        if min(counts) < L:
            mtp_cache.cache.prepare(lengths=counts)
        logits, hidden = self.model.mtp_draft(hidden, mx.array(rows), block)
        mtp_cache.cache.finalize()
        index, last = mx.arange(B), mx.array(counts) - 1
        logits, hidden = logits[index, last], hidden[index, last][:, None]

        drafts, dists = [], []
        for i in range(N):
            if i > 0:
                y = drafts[-1][:, None]
                logits, hidden = self.model.mtp_draft(hidden, y, block)
                logits = logits[:, -1]
            logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            drafts.append(sample(logprobs).astype(mx.uint32))
            dists.append(logprobs)
        # Only the target's streams stay in the block's cache.
        trim_rows(block, [N - 1 + f for f in fresh])
        return mx.stack(drafts, axis=1), mx.stack(dists, axis=1)

    def accept(self, cache, kept, hidden):
        """Each row kept its next input and ``kept[b]`` drafts; ``hidden``
        the target's streams over them all."""
        cache[0].push(hidden, [m + 1 for m in kept])
        mx.async_eval(cache[0].hidden)

    def extract(self, cache, tokens, accepted):
        """A finished row's drafter cache (``cache``, extracted), the block
        in step with the model's: it reads the ``accepted`` positions."""
        if accepted > 0:
            mtp_cache = cache[0]
            hidden = mtp_cache.hidden[:, -accepted - 1 : -1]
            t = mx.array([tokens[-accepted:]])
            self.model.mtp_draft(hidden, t, [mtp_cache.cache])
            mx.eval(mtp_cache.state)
        return cache
