# Copyright © 2026 Apple Inc.

import unittest

from test_deepseek_v4_chat import EXPECTED, HI, SYS
from test_deepseek_v4_chat_checkpoints import ABSOLUTE

from mlx_lm.chat_templates.deepseek_v4 import apply_chat_template, bos_token

# OpenAI's reasoning_effort values and the DeepSeek effort each renders in
# the original format and in 0731's, as DeepSeek's API maps them
# (api-docs.deepseek.com, "Thinking Mode"; "-": chat mode, "omitted": none
# given).
OPENAI_EFFORTS = """
omitted  high  high
none     -     -
minimal  high  low
low      high  low
medium   high  high
high     high  high
xhigh    max   high
max      max   max
"""
OPENAI_EFFORTS = {
    chat_format: {
        row.split()[0]: row.split()[i].replace("-", "") or None
        for row in OPENAI_EFFORTS.strip().split("\n")
    }
    for i, chat_format in ((1, "original"), (2, "0731"))
}


class TestDeepseekV4ChatEfforts(unittest.TestCase):

    def test_openai_reasoning_efforts_map_as_deepseeks_api_maps_them(self):
        messages = [SYS, HI]
        for chat_format, efforts in OPENAI_EFFORTS.items():

            def render(**kwargs):
                return apply_chat_template(
                    messages,
                    add_generation_prompt=True,
                    chat_format=chat_format,
                    **kwargs,
                )

            for effort, native in efforts.items():
                with self.subTest(chat_format, reasoning_effort=effort):
                    want = (
                        render(enable_thinking=False)
                        if native is None
                        else render(reasoning_effort=native)
                    )
                    given = {} if effort == "omitted" else {"reasoning_effort": effort}
                    self.assertEqual(render(**given), want)
            with self.assertRaisesRegex(ValueError, "'none', 'minimal', 'low'"):
                render(reasoning_effort="lowest")
        original = apply_chat_template(messages, add_generation_prompt=True)
        self.assertEqual(original, EXPECTED["system and user"])
        # 0731: none given and "medium" ask for its "high" (Absolute maximum),
        # not the "low" of DeepSeek's encoder.
        turn = EXPECTED["system and user"].removeprefix(bos_token)
        for given in ({}, {"reasoning_effort": "medium"}):
            with self.subTest(given=given):
                out = apply_chat_template(
                    messages, add_generation_prompt=True, chat_format="0731", **given
                )
                self.assertEqual(out, bos_token + ABSOLUTE + turn)


if __name__ == "__main__":
    unittest.main()
