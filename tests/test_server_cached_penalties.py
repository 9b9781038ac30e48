# Copyright © 2026 Apple Inc.

import unittest

from server_fixture import ServerTestCase, user


class TestServerCachedPenalties(ServerTestCase):
    """A request served alone (with a seed) penalizes the tokens of its
    prompt that the prompt cache holds, as a batched request does."""

    def test_a_seed_does_not_change_a_greedy_answer(self):
        plain = {"max_tokens": 24, "temperature": 0}
        status, answer = self.server.chat({"messages": user(), **plain})
        self.assertEqual(status, 200, answer)
        # A prompt that holds what the model says next, for the penalties.
        text = "The quick brown fox " + answer["choices"][0]["message"]["content"]
        for penalty in (
            {"repetition_penalty": 2.0},
            {"presence_penalty": 2.0},
            {"frequency_penalty": 2.0},
        ):
            with self.subTest(**penalty):
                body = {"messages": user(text), **plain, **penalty}
                # Batched, then served alone from the prompt cache it left.
                status, batched = self.server.chat(body)
                self.assertEqual(status, 200, batched)
                status, alone = self.server.chat(dict(body, seed=1))
                self.assertEqual(status, 200, alone)
                cached = alone["usage"]["prompt_tokens_details"]["cached_tokens"]
                self.assertGreater(cached, 0)
                self.assertEqual(
                    alone["choices"][0]["message"]["content"],
                    batched["choices"][0]["message"]["content"],
                )


if __name__ == "__main__":
    unittest.main()
