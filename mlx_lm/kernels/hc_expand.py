# Copyright © 2026 Apple Inc.

"""A layer's output written back into a hyper-connection's streams, in one
kernel."""

import math

import mlx.core as mx

from ._common import make_kernel, stream_grid

# Thread (d, n) writes feature d of token n's streams.
_EXPAND_SOURCE = """
    unsigned int d = gx;
    unsigned int n = gy;
    if (d >= D) {
        return;
    }
    float r[HC];
    for (int j = 0; j < HC; j++) {
        r[j] = static_cast<float>(residual[(n * HC + j) * D + d]);
    }
    float v = static_cast<float>(x[n * D + d]);
    for (int i = 0; i < HC; i++) {
        float acc = 0.0f;
        for (int j = 0; j < HC; j++) {
            acc += comb[(n * HC + j) * HC + i] * r[j];
        }
        out[(n * HC + i) * D + d] = static_cast<T>(post[n * HC + i] * v + acc);
    }
"""

_expand_kernel = make_kernel(
    name="hc_expand",
    input_names=["x", "residual", "post", "comb"],
    output_names=["out"],
    source=_EXPAND_SOURCE,
)


def hc_expand(
    x: mx.array, residual: mx.array, post: mx.array, comb: mx.array
) -> mx.array:
    """post * x + comb^T residual for each token: x [..., D] written into the
    streams residual [..., hc, D], in float32 with one rounding. x has the
    streams' dtype, ``post`` [..., hc] and ``comb`` [..., hc, hc] are
    float32."""
    *lead, hc, dims = residual.shape
    return _expand_kernel(
        inputs=[x, residual, post, comb],
        template=[("HC", hc), ("D", dims), ("T", residual.dtype)],
        **stream_grid(math.prod(lead), dims),
        output_shapes=[residual.shape],
        output_dtypes=[residual.dtype],
    )[0]
