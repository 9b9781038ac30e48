# Copyright © 2026 Apple Inc.
"""A count of the host's waits on the device, for the speculative loops'
tests (speculative-drafters, mtp, dspark): a round should sync once."""

from unittest import mock

import mlx.core as mx


class HostSyncs:
    """Counts the calls that wait on the device (``mx.eval``, an array's
    ``tolist``, ``item`` or conversion to a Python number) made while
    ``active``."""

    NAMES = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__")

    def __init__(self):
        self.count, self.active = 0, False

    def _counted(self, fn):
        def call(*args, **kwargs):
            self.count += self.active
            return fn(*args, **kwargs)

        return call

    def __enter__(self):
        self._patches = [mock.patch.object(mx, "eval", self._counted(mx.eval))]
        for name in self.NAMES:
            counted = self._counted(getattr(mx.array, name))
            self._patches.append(mock.patch.object(mx.array, name, counted))
        for p in self._patches:
            p.start()
        return self

    def __exit__(self, *exc):
        for p in reversed(self._patches):
            p.stop()

    def rounds(self, steps):
        """The syncs of each round of ``speculative_generate_step``'s
        ``steps`` (a round ends with the target's own token) but the first
        (with the prompt's) and the end's."""
        counts, steps = [], iter(steps)
        while True:
            self.active = True
            try:
                item = next(steps)
            except StopIteration:
                return counts[1:]
            finally:
                self.active = False
            if not item[2]:
                counts.append(self.count)
                self.count = 0

    def batch_rounds(self, generator, rows, n):
        """The syncs of each of ``n`` rounds of ``generator``'s batch once
        its ``rows`` are all in it (no row finishing)."""
        while len(generator._generation_batch) < rows:
            generator.next()
        counts = []
        for _ in range(n):
            self.active = True
            responses = generator._generation_batch.next()
            self.active = False
            assert all(r.finish_reason is None for r in responses)
            counts.append(self.count)
            self.count = 0
        return counts
