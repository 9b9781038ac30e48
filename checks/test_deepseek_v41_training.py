# Copyright © 2026 Apple Inc.

"""DeepSeek-V4.1 trains (PR deepseek-v41-training), beyond its tests in
tests/test_deepseek_v41.py: where a Sinkhorn kernel runs (a stand-in
kernel, the GPU path forced), training runs the loop of ops and inference
the kernel, in V4.1 and in DeepSeek-V4's hyper-connections; and two steps
of ``tuner.trainer.train``, LoRA and full."""

import math
import tempfile
import unittest
from pathlib import Path
from unittest.mock import patch

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as opt
from dsv4_fixtures import make_tiny_model
from mlx.utils import tree_flatten

from mlx_lm import tuner
from mlx_lm.models import deepseek_v41
from mlx_lm.tuner.callbacks import TrainingCallback


def tiny_args():
    return deepseek_v41.ModelArgs(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        head_dim=16,
        q_lora_rank=16,
        qk_rope_head_dim=8,
        o_groups=2,
        o_lora_rank=8,
        moe_intermediate_size=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        sliding_window=4,
        compress_ratios=(0, 2, 2),
        kv_source_layer_ids=(1,),
        index_source_layer_ids=(1, 2),
        index_n_heads=2,
        index_head_dim=16,
        index_topk=2,
        candidate_source_layer_id=1,
        candidate_topk_blocks=1,
        candidate_block_size=2,
    )


class TestDeepseekV41Training(unittest.TestCase):
    def test_training_runs_the_sinkhorn_loop_and_inference_the_kernel(self):
        # A stand-in with the kernel's call, counting its launches; like a
        # GPU kernel, it has no gradient. The GPU path is forced.
        launches = []

        def kernel(inputs, template, **kwargs):
            comb, eps = inputs
            iters = dict(template)["ITERS"]
            launches.append(comb.shape)
            out = deepseek_v41._sinkhorn(comb, iters=iters, eps=eps, use_kernel=False)
            return [mx.stop_gradient(out)]

        def loss(model, tokens):
            return model(tokens).astype(mx.float32).mean()

        mx.random.seed(0)
        v41 = deepseek_v41.Model(tiny_args())
        v4 = make_tiny_model()
        tokens = mx.random.randint(0, 64, (1, 16))
        for name, model in (("v4.1", v41), ("v4", v4)):
            # 16 tokens, and 4: the decode step's compiled call in V4.
            for length in (16, 4):
                with self.subTest(model=name, tokens=length), patch.object(
                    deepseek_v41, "_sinkhorn_kernel", kernel
                ), patch.object(mx, "default_device", return_value=mx.gpu):
                    inputs = tokens[:, :length]
                    model.train()
                    value, grads = nn.value_and_grad(model, loss)(model, inputs)
                    mx.eval(value, grads)
                    self.assertEqual(launches, [])
                    grad = grads["model"]["layers"][0]["attn_hc"]["fn"]
                    self.assertGreater(mx.abs(grad).max().item(), 0.0)

                    model.eval()
                    self.assertTrue(mx.allclose(loss(model, inputs), value, atol=1e-6))
                    self.assertTrue(launches)
                    launches.clear()

    def test_lora_and_full_fine_tuning_train(self):
        args = tiny_args()

        class Losses(TrainingCallback):
            def __init__(self):
                self.losses = []

            def on_train_loss_report(self, info):
                self.losses.append(info["train_loss"])

        mx.random.seed(0)
        data = [(mx.random.randint(0, 64, (24,)).tolist(), 0) for _ in range(2)]
        for fine_tune_type in ("lora", "full"):
            with self.subTest(fine_tune_type=fine_tune_type):
                model = deepseek_v41.Model(args)
                model.freeze()
                if fine_tune_type == "lora":
                    tuner.utils.linear_to_lora_layers(
                        model,
                        args.num_hidden_layers,
                        {"rank": 4, "scale": 10.0, "dropout": 0.0},
                    )
                else:
                    for layer in model.layers:
                        layer.unfreeze()
                before = dict(tree_flatten(model.trainable_parameters()))
                callback = Losses()
                with tempfile.TemporaryDirectory() as tmp:
                    tuner.trainer.train(
                        model,
                        opt.Adam(learning_rate=1e-2),
                        data,
                        args=tuner.trainer.TrainingArgs(
                            batch_size=2,
                            iters=2,
                            steps_per_report=1,
                            adapter_file=str(Path(tmp) / "adapters.safetensors"),
                        ),
                        training_callback=callback,
                    )
                self.assertEqual(len(callback.losses), 2)
                self.assertTrue(all(math.isfinite(l) for l in callback.losses))
                after = dict(tree_flatten(model.trainable_parameters()))
                changed = [
                    k for k, v in after.items() if not mx.array_equal(v, before[k])
                ]
                self.assertTrue(changed)


if __name__ == "__main__":
    unittest.main()
