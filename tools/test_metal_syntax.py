# Copyright © 2026 Apple Inc.

import shutil
import subprocess
import sys
import unittest
from pathlib import Path

TOOLS = Path(__file__).resolve().parent


@unittest.skipIf(shutil.which("g++") is None, "no g++ to parse the sources with")
class TestMetalSyntax(unittest.TestCase):
    def test_the_kernels_metal_sources_parse(self):
        # No machine here compiles Metal: g++ parses what metal_kernel gets.
        run = subprocess.run(
            [sys.executable, str(TOOLS / "metal_syntax.py")],
            capture_output=True,
            text=True,
        )
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        for kernel in ("sinkhorn", "hc_collapse", "hc_expand"):
            self.assertIn(f"deepseek_v41_{kernel} (float): ok", run.stdout)


if __name__ == "__main__":
    unittest.main()
