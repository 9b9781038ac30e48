# Copyright © 2026 Apple Inc.

"""The prompt cache entry of DeepSeek-V4's DSpark drafter (``DSparkCache``).

It lives in its own module, imported at the end of ``cache.py``, so that
``load_prompt_cache`` finds the class by name without importing the model.
"""

import mlx.core as mx

from .cache import TRIM_HISTORY, _BaseCache


class DSparkCache(_BaseCache):
    """The DSpark drafter's context: for every stage, the keys (also the
    values) of the target's positions, rotated at their positions. It holds
    the last ``window`` rows the drafter attends to and ``history`` rows
    before them, so that the last ``history`` positions trim exactly; it is
    in step with the target's caches (``offset`` counts the same
    positions), so trimming every cache of a prompt cache by the same count
    keeps the two in step.

    ``kv`` is one array [stages, B, rows, head_dim], rows <= window +
    history; each ``push`` is one concatenation and one slice of it.
    """

    def __init__(self, window: int, history: int = TRIM_HISTORY):
        self.window = window
        self.history = history
        self.kv = None
        self.offset = 0

    def push(self, kv: mx.array):
        """Append the keys [stages, B, L, D] of the next L positions."""
        length = kv.shape[2]
        if self.kv is not None:
            kv = mx.concatenate([self.kv, kv], axis=2)
        self.kv = kv[:, :, -(self.window + self.history) :]
        self.offset += length

    def window_keys(self) -> mx.array:
        """The keys [stages, B, min(window, offset), D] the drafter sees."""
        return self.kv[:, :, -self.window :]

    @property
    def rows(self) -> int:
        return 0 if self.kv is None else self.kv.shape[2]

    def is_trimmable(self):
        return True

    @property
    def max_trim(self) -> int:
        # Every position still held, or enough rows left for the window.
        if self.rows == self.offset:
            return self.offset
        return max(self.rows - self.window, 0)

    def trim(self, n: int) -> int:
        n = min(n, self.offset)
        if n <= 0 or n > self.max_trim:
            return 0
        rows = self.rows - n
        self.kv = self.kv[:, :, :rows] if rows > 0 else None
        self.offset -= n
        return n

    def size(self):
        return self.offset

    def empty(self):
        return self.kv is None

    @property
    def state(self):
        return self.kv, self.offset, self.window, self.history

    @state.setter
    def state(self, v):
        self.kv, self.offset, self.window, self.history = v

    @property
    def nbytes(self):
        return 0 if self.kv is None else self.kv.nbytes
