# Copyright © 2026 Apple Inc.

"""Drafters for speculative decoding: each proposes tokens for the rows of a
batch that the target model verifies in one forward
(``speculative_generate_step``: one row; ``BatchGenerator``: many)."""

from typing import Any, Callable, List, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn

from .cache import make_prompt_cache, trim_prompt_cache

# The loop's sampling of a drafted position: logits [B, V] and each row's
# tokens from its input on [B, i + 1] -> the tokens [B] and the
# log-probabilities [B, V] they were drawn from.
DraftSample = Callable[[mx.array, mx.array], Tuple[mx.array, mx.array]]


def trim_rows(cache: List[Any], counts: List[int]):
    """Rewind row b of every cache by ``counts[b]`` tokens, or raise a
    ValueError where a cache cannot."""
    if not any(counts):
        return
    if len(counts) == 1:
        # Each cache's own trim: a sliding window takes back what its last
        # update added though it cannot trim back to any prefix.
        n = counts[0]
        trimmed = [c.trim(n) if hasattr(c, "trim") else 0 for c in cache]
        if min(trimmed, default=n) == n:
            return
        raise ValueError(
            f"The prompt cache took back {min(trimmed)} of the {n} rejected "
            "draft tokens: use fewer draft tokens."
        )
    elif all(
        hasattr(c, "trim_rows") and all(map(int.__le__, counts, c.row_max_trim))
        for c in cache
    ):
        for c in cache:
            c.trim_rows(counts)
        return
    raise ValueError(
        f"The prompt cache cannot take back {max(counts)} rejected draft "
        "tokens: use fewer draft tokens."
    )


class Drafter:
    """Proposes draft tokens for speculative decoding, for B rows at once.
    Its state is in its part of the prompt cache (``make_cache``: the
    entries after the target's), which the loop hands to every call; the
    loop calls:

    - ``prefill(cache, tokens, hidden, lengths)`` after the target processed
      ``tokens`` [B, L] (row b's first ``lengths[b]``; a chunk of the
      prompt), ``hidden`` its hidden states there as ``return_hidden`` asks
      for them (None where it asks for none);
    - ``draft(cache, inputs, num_draft, sample)`` with ``inputs`` [B] each
      row's next input to the target: up to ``num_draft`` drafts a row
      [B, N] and, where they were drawn from them, their log-probabilities
      [B, N, V] (None: the target's own samples decide which drafts stay);
    - ``accept(cache, accepted, hidden, tokens)`` once the target verified
      each row's input and its N drafts, before the host has the outcome:
      ``accepted`` [B] (an array the device has not computed yet) counts the
      drafts each row keeps, ``hidden`` the target's states over the inputs
      and every draft, ``tokens`` [B, N + 1] its tokens after each of them
      (a row's are its accepted drafts, then its next input). It starts the
      device work of the next round that needs no host decision, and waits
      on nothing;
    - ``trim(cache, counts)`` after the round's one host sync, with
      ``counts[b] = N - accepted[b]`` (ints), as the loop trims the target's
      caches by them;
    - ``check_cache(model_cache, cache)`` on a prompt cache it is given;
    - ``finish(cache)`` at the end (the single loop) or on a finished row's
      cache (the batch), so that ``cache`` is in step with the target's for
      a later call with the same prompt cache.
    """

    # What the target's forward returns besides the logits for the drafter
    # (its ``return_hidden``); None for nothing.
    return_hidden = None

    def make_cache(self) -> List[Any]:
        raise NotImplementedError

    def check_cache(self, model_cache: List[Any], cache: List[Any]):
        """Raise a ValueError where a given prompt cache's ``cache`` is not
        in step with the target's ``model_cache``."""

    def prefill(
        self,
        cache: List[Any],
        tokens: mx.array,
        hidden: Optional[mx.array],
        lengths: List[int],
    ):
        raise NotImplementedError

    def draft(
        self, cache: List[Any], inputs: mx.array, num_draft: int, sample: DraftSample
    ) -> Tuple[mx.array, Optional[mx.array]]:
        raise NotImplementedError

    def accept(
        self,
        cache: List[Any],
        accepted: mx.array,
        hidden: Optional[mx.array],
        tokens: mx.array,
    ):
        pass

    def trim(self, cache: List[Any], counts: List[int]):
        """Drop row b's last ``counts[b]`` positions of what ``accept`` left
        in ``cache`` (there: every position of the round)."""
        trim_rows(cache, counts)

    def finish(self, cache: List[Any]):
        pass


class DraftModelDrafter(Drafter):
    """Drafts with a smaller model of the same tokenizer, token by token, for
    one row (its caches cannot rewind rows by their own counts). It gives
    no log-probabilities: the target's samples decide, as in mlx-lm
    0.32.2."""

    def __init__(
        self,
        model: nn.Module,
        quantize: Optional[Callable[[List[Any]], None]] = None,
    ):
        self.model = model
        self.quantize = quantize or (lambda cache: None)
        # The tokens the target has and the draft model has not processed.
        self._pending = mx.array([], mx.uint32)
        self._drafts = mx.zeros((1, 0), mx.uint32)

    def make_cache(self):
        return make_prompt_cache(self.model)

    def check_cache(self, model_cache, cache):
        entries = len(self.make_cache())
        if len(cache) != entries:
            raise ValueError(
                f"The prompt cache holds {len(cache)} entries after the model's "
                f"{len(model_cache)}, where the draft model takes {entries}: make "
                "it with make_prompt_cache(model) + make_prompt_cache(draft_model)."
            )

    def _forward(self, cache, tokens):
        if tokens.shape[0] != 1:
            raise ValueError("A draft model drafts for one sequence at a time.")
        logits = self.model(tokens, cache=cache)
        self.quantize(cache)
        return logits[:, -1, :]

    def prefill(self, cache, tokens, hidden=None, lengths=None):
        self._forward(cache, mx.concatenate([self._pending, tokens[0]])[None])
        self._pending = mx.array([], mx.uint32)

    def draft(self, cache, inputs, num_draft, sample):
        self._drafts = mx.zeros((1, 0), mx.uint32)
        if num_draft <= 0:
            return self._drafts, None
        y = mx.concatenate([self._pending, inputs])[None]
        context, ys = inputs[None], []
        for _ in range(num_draft):
            y, _ = sample(self._forward(cache, y), context)
            y = y[:, None]
            context = mx.concatenate([context, y], axis=1)
            mx.async_eval(y)
            ys.append(y)
        self._drafts = mx.concatenate(ys, axis=1)
        return self._drafts, None

    def accept(self, cache, accepted, hidden=None, tokens=None):
        # Its cache is rewound by the host's counts (``trim``).
        pass

    def trim(self, cache, counts):
        # The model has processed the input and every draft but the last.
        num_draft, rejected = self._drafts.shape[1], counts[0]
        # A draft model's cache that trims less only drafts worse.
        trim_prompt_cache(cache, max(rejected - 1, 0))
        self._pending = mx.array([], mx.uint32)
        if rejected == 0 and num_draft > 0:
            self._pending = self._drafts[0, -1:]

    def finish(self, cache):
        if self._pending.size > 0:
            self.prefill(cache, mx.zeros((1, 0), mx.uint32))
        mx.eval([c.state for c in cache])
