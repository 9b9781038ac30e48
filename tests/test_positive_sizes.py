# Copyright © 2026 Apple Inc.

import contextlib
import io
import sys
import unittest
from unittest import mock

import mlx.core as mx

from mlx_lm.cache_prompt import main as cache_prompt_main
from mlx_lm.chat import main as chat_main
from mlx_lm.generate import main as generate_main
from mlx_lm.generate import setup_arg_parser
from mlx_lm.server import main as server_main
from mlx_lm.utils import _parse_size


class TestPositiveSizes(unittest.TestCase):
    """A prefill step or a prompt concurrency below 1, or a byte size that
    does not parse, stops the command in one line naming the option (before:
    a server that never answers, an error from inside MLX at the first
    prompt, or a traceback)."""

    def assertRefused(self, main, argv, option, value, reason):
        err = io.StringIO()
        argv = [main.__module__, "--model", "unused", *argv, option, value]
        with mock.patch.object(sys, "argv", argv):
            with contextlib.redirect_stderr(err):
                with self.assertRaises(SystemExit) as stop:
                    main()
        self.assertEqual(stop.exception.code, 2)
        line = err.getvalue().strip().splitlines()[-1]
        self.assertIn(f"argument {option}: {reason} (got {value})", line)

    def test_below_one_is_refused(self):
        commands = (
            (generate_main, ["--prompt", "Hi"], "--prefill-step-size"),
            (chat_main, [], "--prefill-step-size"),
            (server_main, [], "--prefill-step-size"),
            (server_main, [], "--prompt-concurrency"),
        )
        for main, argv, option in commands:
            for value in ("0", "-2"):
                with self.subTest(command=main.__module__, option=option, value=value):
                    self.assertRefused(main, argv, option, value, "must be at least 1")

    def test_sizes_that_do_not_parse_are_refused(self):
        reason = "must be a size such as 512MB or 8GB"
        for value in ("-5", "5XB", "1.2.3G"):
            with self.subTest(value=value):
                self.assertRefused(
                    server_main, [], "--prompt-cache-bytes", value, reason
                )

    def test_kv_quantization_mlx_cannot_take_is_refused(self):
        # Before: a server that answers every request with a 500, or an error
        # from inside MLX once the cache reaches --quantized-kv-start.
        commands = (
            (generate_main, ["--prompt", "Hi"]),
            (cache_prompt_main, ["--prompt", "Hi"]),
            (server_main, []),
        )
        for option, value, group_size, bits in (
            ("--kv-bits", "7", 64, 7),
            ("--kv-group-size", "16", 16, 4),
        ):
            with self.assertRaises(ValueError) as mlx_error:
                mx.quantize(mx.zeros((1, 64)), group_size=group_size, bits=bits)
            reason = str(mlx_error.exception).removeprefix("[quantize] ")
            for main, argv in commands:
                with self.subTest(command=main.__module__, option=option):
                    self.assertRefused(main, argv, option, value, reason)

    def test_valid_values_are_taken(self):
        args = setup_arg_parser().parse_args(
            ["--prefill-step-size", "1", "--kv-bits", "3", "--kv-group-size", "32"]
        )
        self.assertEqual(args.prefill_step_size, 1)
        self.assertEqual((args.kv_bits, args.kv_group_size), (3, 32))
        self.assertEqual(_parse_size("1.5G"), 1_500_000_000)
        self.assertEqual(_parse_size("512MB"), 512_000_000)
        self.assertEqual(_parse_size("100"), 100)


if __name__ == "__main__":
    unittest.main()
