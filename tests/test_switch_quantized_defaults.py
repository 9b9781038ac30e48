# Copyright © 2026 Apple Inc.

import unittest

import mlx.core as mx
import mlx.nn as nn

from mlx_lm.models.switch_layers import SwitchLinear
from mlx_lm.tuner.lora import LoRASwitchLinear


class TestQuantizedSwitchDefaults(unittest.TestCase):

    def test_a_group_size_of_none_is_the_modes_default(self):
        # mlx_lm.convert --quant-predicate mixed_* without --q-group-size
        # records "group_size": null, which loads through nn.quantize so.
        for mode, group_size, bits in (("affine", 64, 4), ("mxfp4", 32, 4)):
            with self.subTest(mode=mode):
                layer = SwitchLinear(128, 32, 4, bias=False)
                quantized = nn.Linear(128, 32, bias=False).to_quantized(
                    group_size=None, bits=None, mode=mode
                )
                switch = layer.to_quantized(group_size=None, bits=None, mode=mode)
                self.assertEqual(
                    (switch.group_size, switch.bits),
                    (quantized.group_size, quantized.bits),
                )
                self.assertEqual((switch.group_size, switch.bits), (group_size, bits))
                self.assertEqual(switch.input_dims, 128)
                # LoRA over it (mlx_lm.lora on such a folder).
                lora = LoRASwitchLinear.from_base(switch, r=2)
                x = mx.random.normal((1, 1, 128))
                indices = mx.array([[1, 3]])
                self.assertEqual(lora(x, indices).shape, switch(x, indices).shape)

    def test_given_values_are_kept(self):
        layer = SwitchLinear(128, 32, 4, bias=False)
        switch = layer.to_quantized(group_size=32, bits=8)
        self.assertEqual((switch.group_size, switch.bits), (32, 8))
        w = mx.dequantize(switch.weight, switch.scales, switch.biases, 32, 8)
        self.assertLess(mx.abs(w - layer.weight).max().item(), 1e-2)


if __name__ == "__main__":
    unittest.main()
