# Copyright © 2026 Apple Inc.

"""A hyper-connection's mixes after their matmul, and the collapse of its
streams, in one kernel."""

import math

import mlx.core as mx

from ._common import SINKHORN_LOOP, make_kernel, stream_grid

# Thread (d, n) writes feature d of token n's collapsed stream; thread (0, n)
# also writes the token's post and comb mixes.
_COLLAPSE_SOURCE = (
    """
    unsigned int d = gx;
    unsigned int n = gy;
    if (d >= D) {
        return;
    }
    const int M = (2 + HC) * HC;
    float e = eps[0];
    float acc = 0.0f;
    for (int i = 0; i < HC; i++) {
        float v = mix[n * M + i] * scale[0] + base[i];
        float pre = 1.0f / (1.0f + exp(-v)) + e;
        acc += pre * static_cast<float>(streams[(n * HC + i) * D + d]);
    }
    x[n * D + d] = static_cast<T>(acc);
    if (d != 0) {
        return;
    }
    for (int i = 0; i < HC; i++) {
        float v = mix[n * M + HC + i] * scale[1] + base[HC + i];
        post[n * HC + i] = 2.0f / (1.0f + exp(-v));
    }
    float m[HC * HC];
    for (int a = 0; a < HC; a++) {
        for (int b = 0; b < HC; b++) {
            int k = a * HC + b;
            m[k] = mix[n * M + 2 * HC + k] * scale[2] + base[2 * HC + k];
        }
        float top = m[a * HC];
        for (int b = 1; b < HC; b++) {
            top = m[a * HC + b] > top ? m[a * HC + b] : top;
        }
        float s = 0.0f;
        for (int b = 0; b < HC; b++) {
            m[a * HC + b] = exp(m[a * HC + b] - top);
            s += m[a * HC + b];
        }
        for (int b = 0; b < HC; b++) {
            m[a * HC + b] = m[a * HC + b] / s + e;
        }
    }
"""
    + SINKHORN_LOOP
    + """
    for (int k = 0; k < HC * HC; k++) {
        comb[n * HC * HC + k] = m[k];
    }
"""
)

_collapse_kernel = make_kernel(
    name="hc_collapse",
    input_names=["streams", "mix", "scale", "base", "eps"],
    output_names=["x", "post", "comb"],
    source=_COLLAPSE_SOURCE,
)


def hc_collapse(
    streams: mx.array,
    mix: mx.array,
    scale: mx.array,
    base: mx.array,
    eps: mx.array,
    *,
    iters: int,
) -> list[mx.array]:
    """The streams [..., hc, D] mixed into one, and the post and comb mixes,
    from the mix logits [tokens, (2 + hc) * hc] (the normed streams times the
    mix weights): the sigmoid pre and post mixes, the comb mix's softmax and
    its ``iters`` Sinkhorn steps, in float32. ``scale`` ([3]), ``base`` and
    ``eps`` ([1]) are float32."""
    *lead, hc, dims = streams.shape
    return _collapse_kernel(
        inputs=[streams, mix, scale, base, eps],
        template=[("HC", hc), ("D", dims), ("T", streams.dtype), ("ITERS", iters)],
        **stream_grid(math.prod(lead), dims),
        output_shapes=[(*lead, dims), (*lead, hc), (*lead, hc, hc)],
        output_dtypes=[streams.dtype, mx.float32, mx.float32],
    )
