# Copyright © 2026 Apple Inc.

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import mlx.core as mx
from test_deepseek_v4 import TINY_CONFIG, make_tiny_model, max_diff

from mlx_lm.models import deepseek_v4

TESTS = Path(__file__).resolve().parent

# Sizes whose shards hold whole quantization groups, for the mxfp8 attention
# and mxfp4 experts of converted checkpoints.
CASES = {
    "float32": {},
    "mxfp": {"q_lora_rank": 32, "o_lora_rank": 32, "moe_intermediate_size": 64},
}

# Both ranks build the same model, run it whole, then shard it and run it
# again. The prompt wraps the window and closes CSA and HCA windows, and the
# decode steps close more.
SCRIPT = """
import json
import sys

import mlx.core as mx
import mlx.nn as nn

sys.path.insert(0, {tests!r})
from test_deepseek_v4 import TINY_CONFIG, make_tiny_model, max_diff

group = mx.distributed.init(strict=True, backend="ring")
mx.random.seed(1)
inputs = mx.random.randint(0, TINY_CONFIG["vocab_size"], (2, 52))


def mxfp(path, module):
    if not hasattr(module, "to_quantized"):
        return False
    if ".ffn." in path:
        return {{"group_size": 32, "bits": 4, "mode": "mxfp4"}}
    if path.endswith(("attn.wq_b", "attn.wo_a", "attn.wo_b")):
        return {{"group_size": 32, "bits": 8, "mode": "mxfp8"}}
    return False


def run(model):
    cache = model.make_cache()
    outs = [model(inputs[:, :40], cache)]
    for i in range(40, inputs.shape[1]):
        outs.append(model(inputs[:, i : i + 1], cache))
    return mx.concatenate(outs, axis=1)


results = {{}}
for name, overrides in json.loads({cases!r}).items():
    model = make_tiny_model({{**TINY_CONFIG, **overrides}})
    if name == "mxfp":
        nn.quantize(model, class_predicate=mxfp)
    expected = run(model)
    mx.eval(expected)
    model.shard(group)
    out = run(model)
    attn = model.layers[0].attn
    results[name] = {{
        "size": group.size(),
        "quantized": "Quantized" in type(attn.wo_b).__name__,
        "n_heads": attn.n_heads,
        "wq_b_rows": attn.wq_b.weight.shape[0],
        "expert_rows": model.layers[0].ffn.switch_mlp.gate_proj.weight.shape[1],
        "diff": max_diff(out, expected),
        "logits": out[:, -1].tolist(),
    }}
with open({out!r}.format(group.rank()), "w") as f:
    json.dump(results, f)
"""


def _launcher():
    bin_dir = os.path.dirname(sys.executable)
    launcher = shutil.which("mlx.launch", path=bin_dir) or shutil.which("mlx.launch")
    if launcher is None or not mx.distributed.is_available("ring"):
        return None
    return launcher


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeGroup:
    def __init__(self, rank, size):
        self._rank, self._size = rank, size

    def rank(self):
        return self._rank

    def size(self):
        return self._size


class TestDeepseekV4Shard(unittest.TestCase):
    def test_shard_names_the_field_that_does_not_divide(self):
        model = make_tiny_model()
        with self.assertRaisesRegex(ValueError, "`o_groups` 2") as e:
            model.shard(FakeGroup(0, 4))
        self.assertNotIn("num_attention_heads", str(e.exception))
        with self.assertRaisesRegex(
            ValueError,
            "`num_attention_heads` 4, `o_groups` 2, `moe_intermediate_size` 16",
        ):
            model.shard(FakeGroup(0, 3))

    def test_shard_on_one_rank_changes_nothing(self):
        model = make_tiny_model()
        inputs = mx.array([[3, 1, 4, 1, 5, 9, 2, 6]])
        expected = model(inputs)
        model.shard(mx.distributed.init())
        self.assertLessEqual(max_diff(model(inputs), expected), 1e-5)

    def test_two_ranks_match_the_whole_model(self):
        launcher = _launcher()
        if launcher is None:
            self.skipTest("mlx.launch with the ring backend is not available")
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "rank{}.json")
            script = Path(tmp) / "shard.py"
            script.write_text(
                SCRIPT.format(tests=str(TESTS), cases=json.dumps(CASES), out=out)
            )
            command = [
                launcher,
                "-n",
                "2",
                "--backend",
                "ring",
                "--starting-port",
                str(_free_port()),
                "--",
                sys.executable,
                str(script),
            ]
            # The launcher exits 0 even when a rank fails: read the results.
            run = subprocess.run(command, capture_output=True, text=True, timeout=120)
            results = []
            for rank in range(2):
                path = Path(out.format(rank))
                if not path.exists():
                    self.fail(f"rank {rank} wrote no result:\n{run.stderr}")
                results.append(json.loads(path.read_text()))
        for name, overrides in CASES.items():
            args = deepseek_v4.ModelArgs.from_dict({**TINY_CONFIG, **overrides})
            rows = [r[name] for r in results]
            for rank, result in enumerate(rows):
                with self.subTest(name, rank=rank):
                    self.assertEqual(result["size"], 2)
                    self.assertEqual(result["quantized"], name == "mxfp")
                    self.assertEqual(result["n_heads"], args.num_attention_heads // 2)
                    self.assertEqual(
                        result["wq_b_rows"],
                        args.num_attention_heads * args.head_dim // 2,
                    )
                    self.assertEqual(
                        result["expert_rows"], args.moe_intermediate_size // 2
                    )
                    self.assertLessEqual(result["diff"], 1e-4)
            with self.subTest(name):
                self.assertEqual(rows[0]["logits"], rows[1]["logits"])


if __name__ == "__main__":
    unittest.main()
