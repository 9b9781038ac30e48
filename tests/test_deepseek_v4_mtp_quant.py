# Copyright © 2026 Apple Inc.

import contextlib
import io
import json
import os
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import mlx.core as mx
from test_deepseek_v4_mtp import CONFIG, check_drafts_give_plain_text, make_model_folder

from mlx_lm.quant import dynamic_quant, gptq
from mlx_lm.utils import load

# Every projection's input a multiple of 32 columns, the group size below.
WIDE = {**CONFIG, "q_lora_rank": 32, "o_lora_rank": 32, "moe_intermediate_size": 32}


class TestQuantizersKeepTheBlock(unittest.TestCase):

    def check(self, module, options):
        # The command writes the block, quantized, and --mtp drafts from it.
        with tempfile.TemporaryDirectory() as tmp:
            path = make_model_folder(Path(tmp) / "mtp", WIDE)
            out = Path(tmp) / "quantized"
            argv = ["quant", "--model", str(path), "--mlx-path", str(out)]
            data = mx.random.randint(2, WIDE["vocab_size"], (4, 64))
            quiet = io.StringIO()
            cwd = os.getcwd()
            # dynamic_quant writes its sensitivities in the working folder.
            os.chdir(tmp)
            try:
                with mock.patch.object(sys, "argv", argv + options):
                    with mock.patch.object(module, "load_data", return_value=data):
                        with contextlib.redirect_stdout(quiet):
                            with contextlib.redirect_stderr(quiet):
                                module.main()
            finally:
                os.chdir(cwd)
            with open(out / "config.json") as f:
                self.assertNotIn("mtp", json.load(f))
            model, tokenizer = load(str(out), model_config={"mtp": True})
        self.assertEqual(len(model.mtp), 1)
        self.assertTrue(hasattr(model.mtp[0].attn.wq_a, "scales"))
        check_drafts_give_plain_text(self, model, tokenizer, 12, 3)

    def test_gptq(self):
        self.check(gptq, ["--group-size", "32", "--fallback-group-size", "32"])

    def test_dynamic_quant(self):
        self.check(dynamic_quant, ["--low-group-size", "32", "--high-group-size", "32"])


if __name__ == "__main__":
    unittest.main()
