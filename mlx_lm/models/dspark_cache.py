# Copyright © 2026 Apple Inc.

"""The prompt cache entry of DeepSeek-V4's DSpark drafter (``DSparkCache``)."""

from typing import List, Optional

import mlx.core as mx

from .cache import TRIM_HISTORY, DrafterCache


def _ints(text: str) -> List[int]:
    return [int(t) for t in text.split(",") if t]


class DSparkCache(DrafterCache):
    """The DSpark drafter's context for the rows of a batch (one row in a
    prompt cache): for every stage, the keys (also the values) of the
    target's positions, rotated at their positions. Each row holds its last
    ``window`` positions, which the drafter attends to, and up to
    ``history`` before them, so that its last ``history`` positions trim
    exactly. A row is in step with the target's caches (``offsets[b]``
    counts the same positions), so trimming every cache of a prompt cache by
    the same count keeps the two in step.

    ``kv`` [stages, B, window + history + 1, head_dim] is a ring per row:
    position p's keys sit in slot p % (window + history) (the last slot
    takes what is not kept); ``valid[b]`` counts the positions row b holds.
    A ``push`` is one scatter into it, so its graph stays one node deep.
    """

    def __init__(self, window: int, history: int = TRIM_HISTORY, rows: int = 1):
        self.window = window
        self.history = history
        self.kv = None
        self.offsets = [0] * rows
        self.valid = [0] * rows

    @property
    def capacity(self) -> int:
        return self.window + self.history

    @property
    def offset(self) -> int:
        """The positions of a one-row cache."""
        return self.offsets[0]

    def push(self, kv: mx.array, counts: Optional[List[int]] = None):
        """Append the keys [stages, B, L, D] of row b's next ``counts[b]``
        positions (all L by default; a right-padded chunk)."""
        S, B, L, D = kv.shape
        counts = [L] * B if counts is None else list(counts)
        C = self.capacity
        if self.kv is None:
            self.kv = mx.zeros((S, B, C + 1, D), kv.dtype)
        j = mx.arange(L)[None]
        n = mx.array(counts)[:, None]
        # Only each row's last C new positions get a slot of their own.
        keep = (j < n) & (j >= n - C)
        slots = mx.where(keep, (mx.array(self.offsets)[:, None] + j) % C, C)
        self.kv[:, mx.arange(B)[:, None], slots] = kv.astype(self.kv.dtype)
        self.offsets = [o + c for o, c in zip(self.offsets, counts)]
        self.valid = [min(v + c, C) for v, c in zip(self.valid, counts)]

    def window_keys(self):
        """The keys each row attends to, [stages, B, W, D] (W: at most
        ``window``, the last positions of each row in order), and where a row
        has fewer than W positions the mask of the ones it has [B, W] (None
        where every row has W)."""
        W = min(self.window, max(self.offsets))
        pos = mx.array(self.offsets)[:, None] - W + mx.arange(W)[None]
        keys = self.kv[:, mx.arange(len(self.offsets))[:, None], pos % self.capacity]
        mask = None if min(self.offsets) >= W else pos >= 0
        return keys, mask

    @property
    def rows(self) -> int:
        """The positions a one-row cache holds."""
        return self.valid[0]

    def is_trimmable(self):
        return True

    @property
    def row_max_trim(self) -> List[int]:
        # Every position still held, or enough left for the window.
        return [
            o if v == o else max(v - self.window, 0)
            for o, v in zip(self.offsets, self.valid)
        ]

    @property
    def max_trim(self) -> int:
        return min(self.row_max_trim, default=0)

    def trim_rows(self, counts) -> bool:
        """Drop the last ``counts[b]`` positions of each row b and return
        True, or drop nothing and return False where a row cannot."""
        counts = list(counts)
        if len(counts) != len(self.offsets) or any(
            n < 0 or n > m for n, m in zip(counts, self.row_max_trim)
        ):
            return False
        self.offsets = [o - n for o, n in zip(self.offsets, counts)]
        self.valid = [v - n for v, n in zip(self.valid, counts)]
        return True

    def trim(self, n: int) -> int:
        n = min(n, min(self.offsets))
        if n <= 0 or not self.trim_rows([n] * len(self.offsets)):
            return 0
        return n

    def size(self):
        return max(self.offsets, default=0)

    def empty(self):
        return self.kv is None

    @property
    def state(self):
        offsets = ",".join(map(str, self.offsets))
        valid = ",".join(map(str, self.valid))
        return self.kv, offsets, valid, self.window, self.history

    @state.setter
    def state(self, v):
        self.kv, offsets, valid, self.window, self.history = v
        self.offsets, self.valid = _ints(offsets), _ints(valid)

    @property
    def nbytes(self):
        return 0 if self.kv is None else self.kv.nbytes

    @classmethod
    def merge(cls, caches):
        """One cache of the rows of ``caches`` (copies)."""
        first = caches[0]
        if any(c.capacity != first.capacity for c in caches):
            raise ValueError("DSpark caches of different windows cannot batch.")
        merged = cls(first.window, first.history, 0)
        merged._add(caches)
        return merged

    def _add(self, caches):
        shape = next((c.kv.shape for c in caches if c.kv is not None), None)
        if shape is not None:
            dtype = next(c.kv.dtype for c in caches if c.kv is not None)
            parts = [
                (
                    c.kv
                    if c.kv is not None
                    else mx.zeros((shape[0], len(c.offsets), *shape[2:]), dtype)
                )
                for c in caches
            ]
            self.kv = mx.concatenate(parts, axis=1)
        for c in caches:
            self.offsets += c.offsets
            self.valid += c.valid

    def filter(self, batch_indices):
        batch_indices = list(batch_indices)
        if self.kv is not None:
            self.kv = self.kv[:, mx.array(batch_indices, mx.int32)]
        self.offsets = [self.offsets[i] for i in batch_indices]
        self.valid = [self.valid[i] for i in batch_indices]

    def extend(self, other):
        rows = DSparkCache(self.window, self.history, 0)
        rows._add([self, other])
        self.kv, self.offsets, self.valid = rows.kv, rows.offsets, rows.valid

    def extract(self, idx):
        cache = DSparkCache(self.window, self.history)
        if self.kv is not None:
            cache.kv = mx.array(self.kv[:, idx : idx + 1])
        cache.offsets, cache.valid = [self.offsets[idx]], [self.valid[idx]]
        return cache
