# Copyright © 2026 Apple Inc.

"""DeepSeek-V4's multi-token prediction block as a drafter, for
``speculative_generate_step`` (one row) and ``BatchGenerator`` (many): what
``mtp=True`` drafts with (``deepseek_v4.Model.make_drafter``), and its
prompt cache entry (``MTPCache``, ``BatchMTPCache``)."""

from typing import Any, List, Optional

import mlx.core as mx
import mlx.nn as nn

from .cache import (
    TRIM_HISTORY,
    BatchWindowCompressorCache,
    DrafterCache,
    WindowCompressorCache,
    _batch_index,
    _cat_rows,
    _take_rows,
)
from .drafters import Drafter, trim_rows


def _cat_ahead(aheads):
    """The rows of ``MTPCache.ahead`` of several caches: all or none set."""
    if all(a is None for a in aheads):
        return None
    if any(a is None for a in aheads):
        raise ValueError("MTP caches a round apart cannot batch.")
    return tuple(mx.concatenate(parts) for parts in zip(*aheads))


class MTPCache(DrafterCache):
    """A multi-token-prediction block's cache beside the target's caches in a
    prompt cache. Where the target holds T positions, the block has seen the
    first T - 1, each with the token after it, and ``hidden`` keeps the
    target's streams of its last ``keep`` positions (the block's input for
    position T - 1 with the next token): trimming every cache of the prompt
    cache by the same count keeps the two in step."""

    # The block's cache: one DeepSeek-V4 attention layer's.
    cache_type = WindowCompressorCache
    # One position behind the target's, it takes back one token fewer.
    trim_history = TRIM_HISTORY - 1

    def __init__(self, cache, keep=TRIM_HISTORY + 1):
        self.cache = cache
        self.keep = keep
        self.hidden = None
        # A drafter's, between its rounds: the block's output (logits [B, V],
        # streams [B, 1, ...]) at each row's last position, read with the
        # row's next input (None: the block one position behind).
        self.ahead = None

    @property
    def valid(self):
        """How many positions' streams each row holds."""
        return [0 if self.hidden is None else self.hidden.shape[1]]

    def push(self, hidden, counts=None):
        """Keep the first ``counts[0]`` (all by default) of the target's
        streams [1, L, ...] as its next positions."""
        if counts is not None:
            hidden = hidden[:, : counts[0]]
        if self.hidden is not None:
            hidden = mx.concatenate([self.hidden, hidden], axis=1)
        self.hidden = hidden[:, -self.keep :]

    def last(self, counts):
        """The streams of the last ``counts[0]`` positions."""
        return self.hidden[:, self.hidden.shape[1] - counts[0] :]

    @property
    def state(self):
        return self.cache.state, self.hidden, self.keep

    @state.setter
    def state(self, v):
        # (Caches saved with a fourth field held no tokens in it.)
        state, self.hidden, self.keep = v[:3]
        self.cache = self.cache_type.from_state(state)
        self.ahead = None

    def is_trimmable(self):
        return self.cache.is_trimmable()

    @property
    def max_trim(self):
        rows = 0 if self.hidden is None else self.hidden.shape[1] - 1
        return min(rows, getattr(self.cache, "max_trim", rows))

    def trim(self, n):
        n = min(n, self.max_trim)
        if n <= 0 or self.cache.trim(n) != n:
            return 0
        self.hidden = self.hidden[:, :-n]
        return n

    def size(self):
        return self.cache.size() + (self.hidden is not None)

    def empty(self):
        return self.hidden is None

    @property
    def nbytes(self):
        rows = 0 if self.hidden is None else self.hidden.nbytes
        return self.cache.nbytes + rows

    @classmethod
    def merge(cls, caches):
        """One ``BatchMTPCache`` of the rows of ``caches`` (copies)."""
        rings = [BatchMTPCache._ring(c) for c in caches]
        merged = BatchMTPCache(
            BatchWindowCompressorCache.merge([c.cache for c in caches]),
            caches[0].keep,
            [e for r in rings for e in r.ends],
            [v for r in rings for v in r.valid],
            _cat_rows([r.hidden for r in rings], [len(r.ends) for r in rings]),
        )
        merged.ahead = _cat_ahead([c.ahead for c in caches])
        return merged


class BatchMTPCache(MTPCache):
    """An ``MTPCache`` of rows at their own positions. ``hidden`` is a ring of
    ``keep`` slots per row (one more takes what is not kept): a row's stream
    of its position p sits in slot p % keep. ``ends`` counts each row's
    positions, ``valid`` how many of its last ones the ring holds."""

    cache_type = BatchWindowCompressorCache

    def __init__(self, cache, keep, ends=(), valid=(), hidden=None):
        self.cache = cache
        self.keep = keep
        self.ends = list(ends)
        self.valid = list(valid)
        self.hidden = hidden
        self.ahead = None

    @classmethod
    def _ring(cls, c):
        """``c``'s streams as a ring (``c`` itself where it is one)."""
        if isinstance(c, BatchMTPCache):
            return c
        ring = cls(None, c.keep, [0], [0])
        if c.hidden is not None:
            ring.push(c.hidden)
        return ring

    def _slots(self, starts, counts, length):
        """The slots of positions ``starts[b] + j`` for j < ``counts[b]``, and
        the extra slot past them [B, length]."""
        j = mx.arange(length)
        starts, counts = mx.array(starts)[:, None], mx.array(counts)[:, None]
        return mx.where(j < counts, (starts + j) % self.keep, self.keep)

    def push(self, hidden, counts=None):
        """Keep the first ``counts[b]`` of each row's streams [B, L, ...] (all
        L by default) as its next positions."""
        B, L = hidden.shape[:2]
        counts = [L] * B if counts is None else list(counts)
        if self.hidden is None:
            shape = (B, self.keep + 1, *hidden.shape[2:])
            self.hidden = mx.zeros(shape, hidden.dtype)
        # Only the last ``keep`` of each row get a slot of their own.
        skip = [max(c - self.keep, 0) for c in counts]
        slots = self._slots(self.ends, counts, L)
        slots = mx.where(mx.arange(L) < mx.array(skip)[:, None], self.keep, slots)
        self.hidden[_batch_index(B), slots] = hidden
        self.ends = [e + c for e, c in zip(self.ends, counts)]
        self.valid = [min(v + c, self.keep) for v, c in zip(self.valid, counts)]

    def last(self, counts):
        """Each row's streams of its last ``counts[b]`` positions, in order
        and padded on the right [B, max(counts), ...]."""
        starts = [e - c for e, c in zip(self.ends, counts)]
        slots = self._slots(starts, counts, max(counts))
        return self.hidden[_batch_index(len(counts)), slots]

    @property
    def row_max_trim(self):
        return [
            min(max(v - 1, 0), m) for v, m in zip(self.valid, self.cache.row_max_trim)
        ]

    @property
    def max_trim(self):
        return min(self.row_max_trim, default=0)

    def trim_rows(self, counts):
        """Drop each row's last ``counts[b]`` positions and return True, or
        drop nothing and return False where it cannot."""
        counts = list(counts)
        if any(n > m for n, m in zip(counts, self.row_max_trim)):
            return False
        if not self.cache.trim_rows(counts):
            return False
        self.ends = [e - n for e, n in zip(self.ends, counts)]
        self.valid = [v - n for v, n in zip(self.valid, counts)]
        return True

    def trim(self, n):
        n = min(n, self.max_trim)
        if n <= 0 or not self.trim_rows([n] * len(self.ends)):
            return 0
        return n

    def size(self):
        return max(
            (o + (v > 0) for o, v in zip(self.cache.offsets, self.valid)), default=0
        )

    @property
    def state(self):
        return (*super().state, self.ends, self.valid)

    @state.setter
    def state(self, v):
        *v, ends, valid = v
        MTPCache.state.fset(self, v)
        self.ends, self.valid = list(ends), list(valid)

    @property
    def valid(self):
        return self._valid

    @valid.setter
    def valid(self, v):
        self._valid = v

    def filter(self, batch_indices):
        batch_indices = list(batch_indices)
        self.cache.filter(batch_indices)
        self.hidden = _take_rows(self.hidden, batch_indices)
        self.ends = [self.ends[i] for i in batch_indices]
        self.valid = [self.valid[i] for i in batch_indices]
        if self.ahead is not None:
            index = mx.array(batch_indices, mx.int32)
            self.ahead = tuple(a[index] for a in self.ahead)

    def extend(self, other):
        sizes = [len(self.ends), len(other.ends)]
        self.cache.extend(other.cache)
        self.hidden = _cat_rows([self.hidden, other.hidden], sizes)
        self.ends = self.ends + other.ends
        self.valid = self.valid + other.valid
        self.ahead = _cat_ahead([self.ahead, other.ahead])

    def extract(self, idx):
        cache = MTPCache(self.cache.extract(idx), self.keep)
        if self.ahead is not None:
            cache.ahead = tuple(a[idx : idx + 1] for a in self.ahead)
        if (v := self.valid[idx]) > 0:
            slots = self._slots([self.ends[idx] - v], [v], v)
            cache.hidden = self.hidden[idx : idx + 1][_batch_index(1), slots]
        return cache


def check_mtp(model: nn.Module, draft_model: Optional[nn.Module] = None):
    """Raise a ValueError where the model cannot draft with its own MTP
    block."""
    if draft_model is not None:
        raise ValueError("Drafting with MTP and a draft model are exclusive.")
    if hasattr(model, "mtp_draft") and getattr(model, "mtp", None):
        return
    if not getattr(getattr(model, "args", None), "mtp", False):
        raise ValueError(
            f"The model ({type(model).__module__}) was loaded without its "
            'drafter: load(..., model_config={"mtp": True}) loads it.'
        )
    raise ValueError(
        "This DeepSeek-V4 checkpoint has no drafter for --mtp (mtp=True): "
        "DeepSeek's releases carry an MTP block, V4-Flash-0731 and "
        "V4-Pro-0813 a DSpark drafter."
    )


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
            "with the model's: make_prompt_cache(model) + "
            "make_drafter(model).make_cache() (mlx_lm.generate) makes one, "
            "filled by mtp=True; mlx_lm.cache_prompt --mtp saves one."
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
