# Copyright © 2026 Apple Inc.

import json
import os
import shutil
import subprocess
import sys
import unittest
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))

import fork  # noqa: E402

# What deepseek_v41 gives metal_kernel for the Sinkhorn kernel, and how
# _sinkhorn launches it, on a Metal machine (the backend stubbed).
SINKHORN_CALLS = """
import json
from unittest import mock

import mlx.core as mx

made, calls = [], []


def kernel(**kwargs):
    made.append(kwargs)

    def launch(inputs, **kwargs):
        calls.append([[a.shape, str(a.dtype)] for a in inputs])
        calls.append({k: v if k != "output_dtypes" else str(v) for k, v in kwargs.items()})
        return [mx.zeros(s, d) for s, d in zip(kwargs["output_shapes"], kwargs["output_dtypes"])]

    return launch


with mock.patch.object(mx.metal, "is_available", return_value=True), mock.patch(
    "mlx.core.fast.metal_kernel", side_effect=kernel
):
    from mlx_lm.models import deepseek_v41 as v41

    with mock.patch.object(mx, "default_device", return_value=mx.gpu):
        v41._sinkhorn(mx.ones((2, 3, 4, 4)), iters=20, eps=mx.array([1e-6]))
sinkhorn = [k for k in made if k["name"] == "deepseek_v41_sinkhorn"]
print(json.dumps({"made": sinkhorn, "calls": calls, "file": v41.__file__}))
"""


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
        for kernel in ("deepseek_v41_sinkhorn", "hc_collapse", "hc_expand"):
            self.assertIn(f"{kernel} (float): ok", run.stdout)


class TestMetalSinkhorn(unittest.TestCase):
    def test_the_metal_sinkhorn_kernel_is_upstreams(self):
        # Upstream's Metal Sinkhorn kernel has run on Metal: the fork gives
        # metal_kernel the same source and launches it the same way.
        def calls(path=None):
            env = None if path is None else {**os.environ, "PYTHONPATH": path}
            run = subprocess.run(
                [sys.executable, "-c", SINKHORN_CALLS],
                capture_output=True,
                text=True,
                env=env,
                cwd=path,
            )
            self.assertEqual(run.returncode, 0, run.stderr)
            out = json.loads(run.stdout.splitlines()[-1])
            if path is not None:
                self.assertTrue(out["file"].startswith(path), out["file"])
            return {k: v for k, v in out.items() if k != "file"}

        fork_calls, upstream = calls(), calls(str(fork.fetch_upstream()))
        self.assertEqual(len(upstream["made"]), 1)
        self.assertIn("thread_position_in_grid", upstream["made"][0]["source"])
        self.assertEqual(len(upstream["calls"]), 2)
        self.assertEqual(fork_calls, upstream)


if __name__ == "__main__":
    unittest.main()
