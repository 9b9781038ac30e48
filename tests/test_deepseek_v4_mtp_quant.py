# Copyright © 2026 Apple Inc.

import contextlib
import io
import json
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import mlx.core as mx
from test_deepseek_v4_mtp import CONFIG, check_drafts_give_plain_text, make_model_folder

from mlx_lm.quant import gptq
from mlx_lm.utils import load

# Every projection's input a multiple of 32 columns, the group size below.
WIDE = {**CONFIG, "q_lora_rank": 32, "o_lora_rank": 32, "moe_intermediate_size": 32}


class TestGPTQKeepsTheBlock(unittest.TestCase):

    def test_the_block_is_quantized_and_drafts(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = make_model_folder(Path(tmp) / "mtp", WIDE)
            out = Path(tmp) / "quantized"
            argv = ["gptq", "--model", str(path), "--mlx-path", str(out)]
            argv += ["--group-size", "32", "--fallback-group-size", "32"]
            data = mx.random.randint(2, WIDE["vocab_size"], (4, 64))
            quiet = io.StringIO()
            with mock.patch.object(sys, "argv", argv):
                with mock.patch.object(gptq, "load_data", return_value=data):
                    with contextlib.redirect_stdout(quiet):
                        with contextlib.redirect_stderr(quiet):
                            gptq.main()
            with open(out / "config.json") as f:
                self.assertNotIn("mtp", json.load(f))
            model, tokenizer = load(str(out), model_config={"mtp": True})
        self.assertEqual(len(model.mtp), 1)
        # No calibration reaches the block: the fallback quantization.
        self.assertEqual(model.mtp[0].attn.wq_a.bits, 6)
        check_drafts_give_plain_text(self, model, tokenizer, 12, 3)


if __name__ == "__main__":
    unittest.main()
