# Copyright © 2026 Apple Inc.

import os
import unittest
from unittest import mock

import mlx.core as mx

from mlx_lm.models import deepseek_v4, deepseek_v41


class TestHyperConnectionKernels(unittest.TestCase):
    """collapse and expand through mlx_lm.kernels' hc_collapse and hc_expand
    (MLX_LM_HC_KERNELS), against the ops."""

    @staticmethod
    def _hyper_connection(dims, seed=0):
        args = deepseek_v41.ModelArgs(hidden_size=dims, hc_mult=4)
        hc = deepseek_v4.HyperConnection(args)
        mx.random.seed(seed)
        hc.fn = 0.5 * mx.random.normal(hc.fn.shape)
        hc.base = mx.random.normal(hc.base.shape)
        hc.scale = mx.array([0.7, 1.3, 0.9])
        # Loaded models are in eval mode; training runs the ops.
        hc.eval()
        return hc

    @staticmethod
    def _hc_ops(hc, streams, x):
        """collapse and expand as the plain ops compute them."""
        with mock.patch.object(deepseek_v4, "_use_hc_kernels", return_value=False):
            collapsed, post, comb = hc.collapse(streams)
            out = hc.expand(x, streams, post, comb)
        return collapsed, post, comb, out

    @unittest.skipIf(
        not (mx.metal.is_available() or mx.cuda.is_available()),
        "no Metal or CUDA kernels",
    )
    def test_kernels_match_the_ops(self):
        # On Metal the kernels run only where asked for (MLX_LM_HC_KERNELS=1):
        # asked for here.
        with mock.patch.object(deepseek_v4, "_HC_KERNELS", True):
            hc = self._hyper_connection(300)
            for shape in ((2, 1, 4, 300), (1, 7, 4, 300)):
                for dtype in (mx.float32, mx.bfloat16):
                    streams = mx.random.normal(shape).astype(dtype)
                    x = mx.random.normal((*shape[:2], 300)).astype(dtype)
                    expected = self._hc_ops(hc, streams, x)
                    collapsed, post, comb = hc.collapse(streams)
                    out = hc.expand(x, streams, post, comb)
                    rtol = 1e-5 if dtype == mx.float32 else 2**-7
                    for got, want in zip((collapsed, post, comb, out), expected):
                        self.assertEqual(got.shape, want.shape)
                        self.assertEqual(got.dtype, want.dtype)
                        got, want = got.astype(mx.float32), want.astype(mx.float32)
                        self.assertTrue(mx.allclose(got, want, rtol=rtol, atol=1e-5))
            # The first layer's streams: one row broadcast to every stream.
            row = mx.random.normal((2, 5, 1, 300))
            streams = mx.broadcast_to(row, (2, 5, 4, 300))
            x = mx.random.normal((2, 5, 300))
            collapsed, post, comb = hc.collapse(streams)
            got = collapsed, post, comb, hc.expand(x, streams, post, comb)
            for got, want in zip(got, self._hc_ops(hc, streams, x)):
                self.assertTrue(mx.allclose(got, want, atol=1e-5))

    def test_kernels_only_where_asked_for(self):
        def switch(value, cuda):
            with mock.patch.dict(os.environ), mock.patch.object(
                mx.cuda, "is_available", return_value=cuda
            ):
                os.environ.pop("MLX_LM_HC_KERNELS", None)
                if value is not None:
                    os.environ["MLX_LM_HC_KERNELS"] = value
                return deepseek_v4._hc_kernels_switch()

        # Unset: the ops on CUDA and Metal; 1 or 0 decides on either.
        self.assertFalse(switch(None, cuda=True))
        self.assertFalse(switch(None, cuda=False))
        self.assertTrue(switch("1", cuda=False))
        self.assertFalse(switch("0", cuda=True))
        with self.assertRaisesRegex(ValueError, "MLX_LM_HC_KERNELS must be 0 or 1"):
            switch("yes", cuda=True)

        # collapse and expand follow the switch on a GPU, and take the ops
        # in training mode and for more tokens than a CUDA grid's second axis
        # holds.
        limit = deepseek_v4._MAX_KERNEL_TOKENS
        one, two = mx.zeros((1, limit, 4, 8)), mx.zeros((2, limit, 4, 8))
        with mock.patch.object(
            mx.cuda, "is_available", return_value=True
        ), mock.patch.object(mx, "default_device", return_value=mx.gpu):
            for on in (False, True):
                with mock.patch.object(deepseek_v4, "_HC_KERNELS", on):
                    self.assertEqual(deepseek_v4._use_hc_kernels(one, False), on)
                    self.assertFalse(deepseek_v4._use_hc_kernels(one, True))
                    self.assertFalse(deepseek_v4._use_hc_kernels(two, False))

    def test_kernels_have_the_gradient_of_the_ops(self):
        # Stand-ins with the kernels' calls and, like GPU kernels, no
        # gradient of their own.
        def collapse_kernel(streams, mix, scale, base, eps, *, iters):
            hc = streams.shape[-2]
            mix = mix.reshape(*streams.shape[:-2], -1)
            ids = mx.array([0] * hc + [1] * hc + [2] * hc**2)
            mix = mix * scale[ids] + base
            pre = mx.sigmoid(mix[..., :hc]) + eps
            post = 2 * mx.sigmoid(mix[..., hc : 2 * hc])
            comb = mx.softmax(mix[..., 2 * hc :].reshape(*mix.shape[:-1], hc, hc), -1)
            comb = deepseek_v41._sinkhorn(
                comb + eps, iters=iters, eps=eps, use_kernel=False
            )
            x = deepseek_v41.collapse(streams, pre)
            return [mx.stop_gradient(a) for a in (x, post, comb)]

        def expand_kernel(*inputs):
            return mx.stop_gradient(deepseek_v41.expand(*inputs))

        hc = self._hyper_connection(16)
        streams = mx.random.normal((2, 3, 4, 16))
        x = mx.random.normal((2, 3, 16))
        weights = [mx.random.normal(a.shape) for a in self._hc_ops(hc, streams, x)]

        def loss(streams, x, fn):
            hc.fn = fn
            outputs = hc.collapse(streams)
            outputs = (*outputs, hc.expand(x, streams, *outputs[1:]))
            return sum((a * w).sum() for a, w in zip(outputs, weights))

        grad = mx.grad(loss, argnums=(0, 1, 2))
        # The ops throughout (on a GPU the Sinkhorn kernel has no gradient).
        with mock.patch.object(
            deepseek_v4, "_use_hc_kernels", return_value=False
        ), mock.patch.object(deepseek_v41, "_sinkhorn_kernel", None):
            expected = grad(streams, x, hc.fn)
        with mock.patch.object(
            deepseek_v4, "hc_collapse", collapse_kernel
        ), mock.patch.object(
            deepseek_v4, "hc_expand", expand_kernel
        ), mock.patch.object(
            deepseek_v4, "_use_hc_kernels", return_value=True
        ):
            got = grad(streams, x, hc.fn)
        for g, e in zip(got, expected):
            self.assertGreater(mx.abs(e).max().item(), 1e-3)
            self.assertTrue(mx.allclose(g, e, atol=1e-5))

    def test_kernels_get_the_dtypes_they_read(self):
        # The kernels read their other inputs as float32 (x in the streams'
        # dtype), whatever the module's parameters are.
        seen = {}

        def recorder(name, outputs):
            def kernel(*inputs, **kwargs):
                seen[name] = [a.dtype for a in inputs]
                return outputs(*inputs)

            return kernel

        def collapse_outputs(streams, *_):
            lead, hc = streams.shape[:-2], streams.shape[-2]
            shapes = (*lead, streams.shape[-1]), (*lead, hc), (*lead, hc, hc)
            return [mx.zeros(s) for s in shapes]

        hc = self._hyper_connection(16)
        hc.set_dtype(mx.bfloat16)
        streams = mx.random.normal((1, 1, 4, 16)).astype(mx.bfloat16)
        x = mx.random.normal((1, 1, 16))
        with mock.patch.object(
            deepseek_v4, "hc_collapse", recorder("collapse", collapse_outputs)
        ), mock.patch.object(
            deepseek_v4, "hc_expand", recorder("expand", lambda x, r, p, c: r)
        ), mock.patch.object(
            deepseek_v4, "_use_hc_kernels", return_value=True
        ):
            _, post, comb = hc.collapse(streams)
            hc.expand(x, streams, post.astype(mx.bfloat16), comb)
        bf16, f32 = mx.bfloat16, mx.float32
        self.assertEqual(seen["collapse"], [bf16, f32, f32, f32, f32])
        self.assertEqual(seen["expand"], [bf16, bf16, f32, f32])


if __name__ == "__main__":
    unittest.main()
