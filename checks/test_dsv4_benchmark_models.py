# Copyright © 2026 Apple Inc.

"""The benchmarks time DeepSeek-V4 models in eval mode, as load() leaves
them: in training mode the hyper-connections run the Sinkhorn loop of ops in
place of its GPU kernel, so a target built otherwise costs more launches a
forward than the plain one it is compared with."""

import argparse
import unittest

import dsv4_verify


class TestBenchmarkModelsInEvalMode(unittest.TestCase):

    def test_the_mtp_and_dspark_targets_are_in_eval_mode(self):
        args = argparse.Namespace(
            layers=4, experts=8, tiny=True, dtype="float32", seed=0
        )
        args.mtp_ratio, args.markov_rank = 4, 8
        config, model = dsv4_verify.build(args)
        _, dmodel = dsv4_verify.build_dspark(args, config, model)
        for name, m in (("MTP", model), ("DSpark", dmodel)):
            training = [k or "(the model)" for k, v in m.named_modules() if v.training]
            self.assertFalse(
                training,
                f"{name}: {len(training)} modules in training mode, {training[:3]}",
            )


if __name__ == "__main__":
    unittest.main()
