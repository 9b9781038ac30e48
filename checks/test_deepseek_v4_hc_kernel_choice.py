# Copyright © 2026 Apple Inc.

"""DeepSeek-V4's hyper-connection kernels (PR hc-kernels) are chosen at each
call: in eval mode on a GPU, never in training mode or on the CPU. A choice
made inside a compiled function would be kept by its trace for every later
call of the same shapes (MLX keys a trace on the shapes, the dtypes, the
constants and the real default stream; not on the module's mode, nor on
the stand-ins' device here). Stand-in kernels count the launches; the GPU
path is forced."""

import unittest
from unittest.mock import patch

import mlx.core as mx
from dsv4_fixtures import make_tiny_model

from mlx_lm.models import deepseek_v4, deepseek_v41


def _collapse_kernel(launches):
    def kernel(streams, mix, scale, base, eps, *, iters):
        launches.add("collapse")
        hc = streams.shape[-2]
        mix = mix.reshape(*streams.shape[:-2], -1)
        mix = mix * scale[mx.array([0] * hc + [1] * hc + [2] * hc**2)] + base
        pre = mx.sigmoid(mix[..., :hc]) + eps
        # Off by half from the ops: logits tell which path ran, even where a
        # trace replays it without calling the stand-in.
        post = 3 * mx.sigmoid(mix[..., hc : 2 * hc])
        comb = mx.softmax(mix[..., 2 * hc :].reshape(*mix.shape[:-1], hc, hc), -1)
        comb = deepseek_v41._sinkhorn(
            comb + eps, iters=iters, eps=eps, use_kernel=False
        )
        return deepseek_v41.collapse(streams, pre), post, comb

    return kernel


def _expand_kernel(launches):
    def kernel(x, residual, post, comb):
        launches.add("expand")
        return deepseek_v41.expand(x, residual, post, comb)

    return kernel


class TestHyperConnectionKernelChoice(unittest.TestCase):
    def test_each_call_chooses_by_mode_and_device(self):
        mx.random.seed(0)
        model = make_tiny_model()
        # Three rows: shapes no other check traces with a forced device.
        tokens = mx.random.randint(0, 64, (3, 16))
        launches = set()
        stand_ins = (
            patch.object(deepseek_v4, "_HC_KERNELS", True),
            patch.object(mx.cuda, "is_available", return_value=True),
            patch.object(deepseek_v4, "hc_collapse", _collapse_kernel(launches)),
            patch.object(deepseek_v4, "hc_expand", _expand_kernel(launches)),
        )
        for stand_in in stand_ins:
            stand_in.start()
            self.addCleanup(stand_in.stop)

        # A prompt of 16 tokens and one of 4 (the decode step's compiled
        # calls), through the ops and through the kernels.
        lengths = (16, 4)
        model.eval()
        with patch.object(deepseek_v4, "_HC_KERNELS", False):
            ops = {n: model(tokens[:, :n]) for n in lengths}
        with patch.object(deepseek_v4, "_use_hc_kernels", return_value=True):
            kernels = {n: model(tokens[:, :n]) for n in lengths}
        for n in lengths:
            # Equal where a trace kept the ops' path for the kernels' call.
            self.assertGreater(mx.abs(kernels[n] - ops[n]).max().item(), 1e-2)

        # The same shapes again, in each mode and on each device.
        rounds = [
            ("training, GPU", True, mx.gpu, False),
            ("eval, GPU", False, mx.gpu, True),
            ("eval, CPU", False, mx.cpu, False),
            ("eval, GPU again", False, mx.gpu, True),
            ("training again", True, mx.gpu, False),
        ]
        for name, training, device, by_kernels in rounds:
            model.train(training)
            for n in lengths:
                with self.subTest(name, tokens=n), patch.object(
                    mx, "default_device", return_value=device
                ):
                    launches.clear()
                    logits = model(tokens[:, :n])
                    want = kernels[n] if by_kernels else ops[n]
                    self.assertTrue(mx.allclose(logits, want, atol=1e-5))
                    launched = {"collapse", "expand"} if by_kernels else set()
                    self.assertEqual(launches, launched)


if __name__ == "__main__":
    unittest.main()
