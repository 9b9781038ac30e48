# Copyright © 2026 Apple Inc.

import importlib.util
import unittest

import server_soak

HAS_CLIENT = all(importlib.util.find_spec(m) for m in ("openai", "psutil"))
MODEL_TYPES = ("deepseek_v4", "qwen3_5")


@unittest.skipUnless(HAS_CLIENT, "the soak needs the openai and psutil packages")
class TestServerSoak(unittest.TestCase):
    """The short form of benchmarks/server_soak.py."""

    @classmethod
    def setUpClass(cls):
        cls.results = {
            model_type: server_soak.soak(
                model_type,
                requests=100,
                max_prompt=300,
                max_answer=48,
                warmup=8,
                verbose=False,
                report_every=25,
            )
            for model_type in MODEL_TYPES
        }

    def test_server_holds_under_load(self):
        for model_type, r in self.results.items():
            with self.subTest(model_type=model_type):
                self.assertEqual(r["errors"], [])
                self.assertEqual(r["completed"] + r["cancelled"], 100)
                self.assertGreater(r["cancelled"], 0)
                self.assertGreater(r["cached_tokens"], 0)
                self.assertTrue(r["server_alive"])

    def test_memory_is_flat_over_the_last_requests(self):
        # The last reading against the highest of those 50 or more requests
        # before it: a leak over the last 50 requests shows, the heap's
        # swings (a few MiB on a server of about 100 MiB) do not.
        for model_type, r in self.results.items():
            with self.subTest(model_type=model_type):
                self.assertEqual(len(r["rss"]), 4)
                self.assertLessEqual(server_soak.rss_growth(r["rss"], 50), 0.05)


if __name__ == "__main__":
    unittest.main()
