# Copyright © 2026 Apple Inc.

import importlib.util
import unittest
from unittest import mock

from server_fixture import CHAT_TEMPLATE, ServerTestCase, user

from mlx_lm.models import llama

HAS_OPENAI = importlib.util.find_spec("openai") is not None

# A template that reads reasoning_effort and rejects values it does not know
# (as DeepSeek-V4's does).
EFFORT_TEMPLATE = (
    "{% if reasoning_effort is defined and reasoning_effort not in "
    "['low', 'medium', 'high'] %}"
    "{{ raise_exception('Unknown reasoning_effort: ' + reasoning_effort) }}"
    "{% endif %}" + CHAT_TEMPLATE
)


@unittest.skipUnless(HAS_OPENAI, "the openai client")
class TestServerOpenAIErrors(ServerTestCase):

    def setUp(self):
        import openai

        self.openai = openai
        self.client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{self.server.port}/v1",
            api_key="none",
            max_retries=0,
        )

    def create(self, **fields):
        fields = {"model": "default_model", "messages": user(), **fields}
        return self.client.chat.completions.create(max_tokens=3, **fields)

    def test_a_rejected_request_is_the_clients_error_with_the_message(self):
        with self.assertRaises(self.openai.BadRequestError) as e:
            self.create(messages=[])
        self.assertEqual(e.exception.status_code, 400)
        self.assertIn("messages must hold at least one message", e.exception.message)
        self.assertEqual(e.exception.param, "messages")
        self.assertEqual(e.exception.type, "invalid_request_error")
        with self.assertRaises(self.openai.BadRequestError) as e:
            self.create(temperature=-1)
        self.assertIn("temperature must be at least 0", e.exception.message)
        self.assertEqual(e.exception.param, "temperature")

    def test_an_unknown_model_is_the_clients_not_found_error(self):
        with self.assertRaises(self.openai.NotFoundError) as e:
            self.create(model="nobody/no-such-model")
        self.assertIn("nobody/no-such-model", e.exception.message)
        self.assertEqual(e.exception.code, "model_not_found")
        self.assertEqual(e.exception.param, "model")

    def test_a_generation_failure_is_the_clients_server_error(self):
        def fail(*args, **kwargs):
            raise RuntimeError("the forward pass broke")

        with mock.patch.object(llama.Model, "__call__", fail):
            with self.assertRaises(self.openai.InternalServerError) as e:
                self.create()
            self.assertIn("the forward pass broke", e.exception.message)
            self.assertEqual(e.exception.type, "server_error")
            # A stream has begun: its error event is the client's error.
            with self.assertRaises(self.openai.APIError) as e:
                list(self.create(stream=True))
            self.assertIn("the forward pass broke", e.exception.message)
        self.assertEqual(self.create().usage.completion_tokens, 3)


@unittest.skipUnless(HAS_OPENAI, "the openai client")
class TestServerOpenAIErrorsOfTheTemplate(ServerTestCase):
    tokenizer_args = {"chat_template": EFFORT_TEMPLATE}
    setUp = TestServerOpenAIErrors.setUp
    create = TestServerOpenAIErrors.create

    def test_a_reasoning_effort_the_template_rejects_is_named(self):
        def effort(value):
            return {"chat_template_kwargs": {"reasoning_effort": value}}

        with self.assertRaises(self.openai.BadRequestError) as e:
            self.create(extra_body=effort("lowest"))
        self.assertIn("Unknown reasoning_effort: lowest", e.exception.message)
        self.assertEqual(e.exception.param, "reasoning_effort")
        # Rejected without it too (a role it does not know), it is not named.
        with self.assertRaises(self.openai.BadRequestError) as e:
            bot = [{"role": "bot", "content": "Hi"}]
            self.create(messages=bot, extra_body=effort("lowest"))
        self.assertIsNone(e.exception.param)
        response = self.create(extra_body=effort("high"))
        self.assertEqual(response.usage.completion_tokens, 3)


if __name__ == "__main__":
    unittest.main()
