# Copyright © 2026 Apple Inc.

import unittest
from unittest import mock

from server_fixture import TINY_CONFIGS, ServerTestCase, user

from mlx_lm.models import llama


class TestServerRequests(ServerTestCase):

    def test_empty_messages_name_the_field(self):
        self.assertRejected({"messages": []}, 400, "messages")

    def test_messages_that_are_not_a_list_name_the_field(self):
        for messages in ("Hi", {"role": "user", "content": "Hi"}, None, ["Hi"]):
            with self.subTest(messages=messages):
                self.assertRejected({"messages": messages}, 400, "messages")
        self.assertRejected({"max_tokens": 3}, 400, "messages")

    def test_a_role_the_chat_template_takes_is_served(self):
        # Llama 3.1's templates take ipython, the role of tool results.
        messages = user() + [{"role": "ipython", "content": "42"}]
        status, answer = self.server.chat({"messages": messages, "max_tokens": 3})
        self.assertEqual(status, 200, answer)

    def test_a_role_the_chat_template_rejects_is_a_400_with_its_message(self):
        body = {"messages": [{"role": "bogus", "content": "Hi"}], "max_tokens": 3}
        self.assertRejected(body, 400, "chat template", "Unknown role: bogus")
        body = {"messages": [{"content": "Hi"}], "max_tokens": 3}
        self.assertRejected(body, 400, "messages[0].role")

    def test_wrong_types_name_the_field(self):
        cases = [
            ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
            ({"messages": user(), "max_tokens": True}, "max_tokens"),
            ({"messages": user(), "max_tokens": "8"}, "max_tokens"),
            ({"messages": user(), "temperature": "hot"}, "temperature"),
            ({"messages": user(), "stop": 5}, "stop"),
            ({"messages": user(), "tools": "get_weather"}, "tools"),
            ({"messages": user(), "stream": True, "stream_options": 1}, "include"),
        ]
        for body, field in cases:
            with self.subTest(field=field):
                self.assertRejected(body, 400, field)
        path = "/v1/completions"
        self.assertRejected({"prompt": [1, 2]}, 400, "prompt", path=path)

    def test_values_out_of_range_name_the_field(self):
        cases = [
            ({"max_tokens": 0}, "max_tokens"),
            ({"max_tokens": -5}, "max_tokens"),
            ({"temperature": -1}, "temperature"),
            ({"top_p": 1.5}, "top_p"),
            ({"top_p": -0.1}, "top_p"),
            ({"seed": -1}, "seed"),
            ({"seed": 2**64}, "seed"),
        ]
        for fields, field in cases:
            with self.subTest(**fields):
                self.assertRejected({"messages": user(), **fields}, 400, field)
        # json.loads reads NaN, which no range check catches.
        body = '{"messages": [{"role": "user", "content": "Hi"}], "temperature": NaN}'
        self.assertRejected(body, 400, "temperature")

    def test_more_than_one_choice_is_rejected(self):
        self.assertRejected({"messages": user(), "n": 2}, 400, "n must be 1")

    def test_a_rope_scaled_model_serves_prompts_past_its_max_positions(self):
        text = "The quick brown fox jumps over the lazy dog. " * 20
        status, answer = self.server.chat({"messages": user(text), "max_tokens": 3})
        self.assertEqual(status, 200, answer)
        limit = TINY_CONFIGS["llama"]["max_position_embeddings"]
        self.assertGreater(answer["usage"]["prompt_tokens"], limit)
        body = {"prompt": text, "max_tokens": 3}
        status, answer = self.server.request("POST", "/v1/completions", body)
        self.assertEqual(status, 200, answer)

    def test_unknown_model_is_a_404_naming_it(self):
        body = {"model": "nobody/no-such-model", "messages": user(), "max_tokens": 3}
        self.assertRejected(body, 404, "nobody/no-such-model")

    def test_generation_error_is_a_500_and_the_server_goes_on(self):
        def fail(*args, **kwargs):
            raise RuntimeError("the forward pass broke")

        for stream in (False, True):
            with self.subTest(stream=stream):
                body = {"messages": user(), "max_tokens": 3, "stream": stream}
                with mock.patch.object(llama.Model, "__call__", fail):
                    path = "/v1/chat/completions"
                    status, data = self.server.send("POST", path, body)
                if stream:
                    # The stream began before the model ran: the error is an event.
                    self.assertIn('"error"', data)
                else:
                    self.assertEqual(status, 500, data)
                self.assertIn("the forward pass broke", data)
                self.assertServes()


if __name__ == "__main__":
    unittest.main()
