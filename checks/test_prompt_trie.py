# Copyright © 2026 Apple Inc.

import time
import unittest

from mlx_lm.models.cache import PromptTrie


# PR prompt-trie: its test in tests/test_prompt_cache.py checks the memory of
# a search; these check its results and its time on one long stored prompt.
class TestPromptTrieSearch(unittest.TestCase):

    def test_longer_is_the_shortest_stored_extension(self):
        trie = PromptTrie()
        trie.add("m", [1, 2, 3, 4, 5], "a")
        trie.add("m", [1, 2, 3, 6], "b")
        trie.add("m", [1, 7], "c")
        result = trie.search("m", [1, 2, 9])
        self.assertEqual(result.longer, [1, 2, 3, 6])
        self.assertEqual(result.common_prefix, 2)
        self.assertIsNone(result.shorter)
        self.assertIsNone(result.exact)
        self.assertEqual(trie.search("m", [1, 2, 3, 4]).longer, [1, 2, 3, 4, 5])

    def test_search_is_linear_in_the_stored_prompt(self):
        # A request that leaves a long stored prompt early walks the rest of
        # it to find the entry; copying the path at each token made that
        # quadratic (6 s at 100K tokens). Times are compared, not bounded:
        # four times the tokens take about four times as long, not sixteen.
        def seconds(n):
            trie = PromptTrie()
            trie.add("m", list(range(n)), "v")
            best = float("inf")
            for _ in range(5):
                start = time.process_time()
                result = trie.search("m", [0, 1, 2, -1])
                best = min(best, time.process_time() - start)
            self.assertEqual(len(result.longer), n)
            return best

        ratio = seconds(20_000) / seconds(5_000)
        self.assertLess(ratio, 8, f"4x the tokens took {ratio:.1f}x the time")


if __name__ == "__main__":
    unittest.main()
