# Copyright © 2026 Apple Inc.
"""server-logprobs through the server (tests/server_fixture.py): both serve
paths (batched, and seeded one at a time) and both endpoints name the
sampled token, the top tokens best first."""

import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from server_fixture import ServerTestCase  # noqa: E402


class TestServerLogprobs(ServerTestCase):
    # The tokenizer holds 298 tokens. Of 320 ids, seed 3's samples at
    # temperature 10 are all tokens; of 384, one is none (the tokenizer's
    # decode drops it, the server's detokenizer does not).
    config = {"vocab_size": 320}

    def post(self, path, **body):
        status, answer = self.server.request("POST", path, body)
        self.assertEqual(status, 200, answer)
        return answer

    def logprobs(self, path, temperature, seed=0):
        body = {"max_tokens": 8, "temperature": temperature, "seed": seed}
        body.update(logprobs=True, top_logprobs=5)
        if path == "/v1/completions":
            body["prompt"] = "The quick brown fox"
        else:
            body["messages"] = [{"role": "user", "content": "The quick brown fox"}]
        content = self.post(path, **body)["choices"][0]["logprobs"]["content"]
        self.assertEqual(len(content), 8)
        for entry in content:
            tops = entry["top_logprobs"]
            self.assertEqual(len(tops), 5)
            values = [t["logprob"] for t in tops]
            self.assertEqual(values, sorted(values, reverse=True))
            self.assertLessEqual(entry["logprob"], values[0])
            for top in tops:
                if top["id"] == entry["id"]:
                    self.assertEqual(top, {k: entry[k] for k in top})
        return content

    def test_greedy_logprobs_name_the_argmax_and_sort_the_tops(self):
        for path in ("/v1/chat/completions", "/v1/completions"):
            with self.subTest(path=path):
                for entry in self.logprobs(path, temperature=0.0):
                    best = entry["top_logprobs"][0]
                    self.assertEqual(entry["id"], best["id"])
                    self.assertEqual(entry["token"], best["token"])
                    self.assertEqual(entry["logprob"], best["logprob"])

    def test_sampled_logprobs_name_the_sampled_token(self):
        # At temperature 10 some tokens are not the argmax; each entry still
        # names the token generated: its text is the completion's.
        body = {"prompt": "The quick brown fox", "max_tokens": 8, "seed": 3}
        body["temperature"] = 10.0
        text = self.post("/v1/completions", **body)["choices"][0]["text"]
        content = self.logprobs("/v1/completions", temperature=10.0, seed=3)
        tokenizer = self.server.generator.model_provider.tokenizer
        ids = [entry["id"] for entry in content]
        self.assertEqual(tokenizer.decode(ids), text)
        self.assertTrue(any(e["id"] != e["top_logprobs"][0]["id"] for e in content))


if __name__ == "__main__":
    unittest.main()
