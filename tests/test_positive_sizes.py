# Copyright © 2026 Apple Inc.

import contextlib
import io
import sys
import unittest
from unittest import mock

from mlx_lm.chat import main as chat_main
from mlx_lm.generate import main as generate_main
from mlx_lm.generate import setup_arg_parser
from mlx_lm.server import main as server_main


class TestPositiveSizes(unittest.TestCase):
    """A prefill step or a prompt concurrency below 1 stops the command in
    one line naming the option (before: a server that never answers, or an
    error from inside MLX at the first prompt)."""

    def assertRefused(self, main, argv, option, value):
        err = io.StringIO()
        argv = [main.__module__, "--model", "unused", *argv, option, value]
        with mock.patch.object(sys, "argv", argv):
            with contextlib.redirect_stderr(err):
                with self.assertRaises(SystemExit) as stop:
                    main()
        self.assertEqual(stop.exception.code, 2)
        line = err.getvalue().strip().splitlines()[-1]
        self.assertIn(f"argument {option}: must be at least 1 (got {value})", line)

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
                    self.assertRefused(main, argv, option, value)

    def test_sizes_that_do_not_parse_are_refused(self):
        for value in ("-5", "5XB", "1.2.3G"):
            with self.subTest(value=value):
                err = io.StringIO()
                argv = ["mlx_lm.server", "--model", "unused"]
                argv += ["--prompt-cache-bytes", value]
                with mock.patch.object(sys, "argv", argv):
                    with contextlib.redirect_stderr(err):
                        with self.assertRaises(SystemExit) as stop:
                            server_main()
                self.assertEqual(stop.exception.code, 2)
                self.assertIn(
                    f"argument --prompt-cache-bytes: must be a size such as 512MB "
                    f"or 8GB (got {value})",
                    err.getvalue(),
                )

    def test_one_is_taken(self):
        args = setup_arg_parser().parse_args(["--prefill-step-size", "1"])
        self.assertEqual(args.prefill_step_size, 1)


if __name__ == "__main__":
    unittest.main()
