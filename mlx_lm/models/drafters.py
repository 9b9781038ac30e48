# Copyright © 2026 Apple Inc.

"""Drafters for speculative decoding: each proposes tokens that the target
model verifies in one forward (``speculative_generate_step``)."""

from typing import Any, Callable, List, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn

from .cache import make_prompt_cache, trim_prompt_cache

# The loop's sampling of a drafter's position: logits [1, V] and the tokens
# from the target's next input on (the processors' history after the
# target's) -> the token [1] and the log-probabilities it was drawn from.
DraftSample = Callable[[mx.array, mx.array], Tuple[mx.array, mx.array]]


def trim_exactly(cache: List[Any], n: int):
    """Trim ``n`` tokens from ``cache`` or raise a ValueError."""
    if (trimmed := trim_prompt_cache(cache, n)) < n:
        raise ValueError(
            f"Speculative decoding needs to trim {n} tokens but the "
            f"prompt cache trimmed {trimmed}: use fewer draft tokens."
        )


class Drafter:
    """Proposes draft tokens for speculative decoding. The loop calls:

    - ``prefill(tokens, hidden)`` after the target processed ``tokens`` [L]
      (a chunk of the prompt), ``hidden`` its hidden states there as
      ``return_hidden`` asks for them (None where it asks for none);
    - ``draft(y, num_draft, sample)`` with ``y`` [1] the target's next
      input: up to ``num_draft`` drafts [n] and, where they were drawn from
      them, their log-probabilities [n, V] (None: the target's own samples
      decide which drafts stay);
    - ``accept(num_accept, hidden)`` once the target kept ``y`` and the
      first ``num_accept`` drafts (``hidden``: its states over ``y`` and
      every draft);
    - ``finish()`` at the end, so that ``cache`` is in step with the
      target's for a later call with the same prompt cache.

    ``cache`` is the drafter's part of the prompt cache, after the target's.
    """

    # What the target's forward returns besides the logits for the drafter
    # (its ``return_hidden``); None for nothing.
    return_hidden = None
    cache: List[Any] = []

    def prefill(self, tokens: mx.array, hidden: Optional[mx.array]):
        raise NotImplementedError

    def draft(
        self, y: mx.array, num_draft: int, sample: DraftSample
    ) -> Tuple[mx.array, Optional[mx.array]]:
        raise NotImplementedError

    def accept(self, num_accept: int, hidden: Optional[mx.array]):
        raise NotImplementedError

    def finish(self):
        pass


class DraftModelDrafter(Drafter):
    """Drafts with a smaller model of the same tokenizer, token by token.
    It gives no log-probabilities: the target's samples decide, as in
    mlx-lm 0.32.2."""

    def __init__(
        self,
        model: nn.Module,
        cache: Optional[List[Any]] = None,
        quantize: Optional[Callable[[List[Any]], None]] = None,
    ):
        self.model = model
        self.cache = make_prompt_cache(model) if cache is None else cache
        self.quantize = quantize or (lambda cache: None)
        # The tokens the target has and the draft model has not processed.
        self._pending = mx.array([], mx.uint32)
        self._num_draft = 0

    def _forward(self, tokens):
        logits = self.model(tokens[None], cache=self.cache)
        self.quantize(self.cache)
        return logits[:, -1, :]

    def prefill(self, tokens, hidden=None):
        self._forward(mx.concatenate([self._pending, tokens]))
        self._pending = mx.array([], mx.uint32)

    def draft(self, y, num_draft, sample):
        self._num_draft = max(num_draft, 0)
        if num_draft <= 0:
            return mx.array([], mx.uint32), None
        inputs, context, ys = mx.concatenate([self._pending, y]), y, []
        for _ in range(num_draft):
            inputs, _ = sample(self._forward(inputs), context)
            context = mx.concatenate([context, inputs])
            mx.async_eval(inputs)
            ys.append(inputs)
        self._drafts = mx.concatenate(ys)
        return self._drafts, None

    def accept(self, num_accept, hidden=None):
        # The model has processed y and every draft but the last.
        trim_exactly(self.cache, max(self._num_draft - num_accept - 1, 0))
        self._pending = mx.array([], mx.uint32)
        if num_accept == self._num_draft > 0:
            self._pending = self._drafts[-1:]
        self._num_draft = 0

    def finish(self):
        if self._pending.size > 0:
            self.prefill(mx.array([], mx.uint32))
        mx.eval([c.state for c in self.cache])
