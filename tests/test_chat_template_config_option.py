# Copyright © 2026 Apple Inc.

import contextlib
import io
import unittest

from mlx_lm.chat import setup_arg_parser as chat_parser
from mlx_lm.generate import setup_arg_parser as generate_parser


class TestChatTemplateConfigOption(unittest.TestCase):
    """--chat-template-config is read as JSON by argparse, as the server's
    --chat-template-args is: a value that is not JSON stops the command
    before the model loads, naming the option."""

    def test_the_option_is_json(self):
        for command, setup_arg_parser in (
            ("generate", generate_parser),
            ("chat", chat_parser),
        ):
            with self.subTest(command=command):
                parser = setup_arg_parser()
                args = parser.parse_args(
                    ["--chat-template-config", '{"enable_thinking": false}']
                )
                self.assertEqual(args.chat_template_config, {"enable_thinking": False})
                err = io.StringIO()
                with contextlib.redirect_stderr(err), self.assertRaises(SystemExit):
                    parser.parse_args(["--chat-template-config", "notjson"])
                self.assertIn("argument --chat-template-config", err.getvalue())


if __name__ == "__main__":
    unittest.main()
