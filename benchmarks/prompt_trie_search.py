# Copyright © 2026 Apple Inc.
"""PromptTrie.search on a long stored prompt, fork against 0.32.2.

The server's prompt cache looks up every request in a ``PromptTrie``. A
request that shares only the start of a long stored prompt makes ``search``
walk the rest of it to find the stored entry ("longer"); 0.32.2 copied the
path at each token of that walk. Prints the best of ``--repeat`` searches per
length and variant, in the same process.

    python benchmarks/prompt_trie_search.py
    python benchmarks/prompt_trie_search.py --lengths 25000,50000,100000
"""

import argparse
import time

from arrays_cache_decode import load_pristine_cache_module, pristine_cache_path

from mlx_lm.models.cache import PromptTrie


def best_seconds(trie_class, n, repeat):
    trie = trie_class()
    trie.add("model", list(range(n)), "entry")
    query = [0, 1, 2, -1]
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        result = trie.search("model", query)
        best = min(best, time.perf_counter() - start)
    assert len(result.longer) == n
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="25000,50000,100000")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    variants = {
        "0.32.2": load_pristine_cache_module(pristine_cache_path()).PromptTrie,
        "fork": PromptTrie,
    }
    print("| stored tokens | " + " | ".join(f"{v} (s)" for v in variants) + " |")
    print("| ---: |" + " ---: |" * len(variants))
    for n in map(int, args.lengths.split(",")):
        times = [best_seconds(c, n, args.repeat) for c in variants.values()]
        print(f"| {n:,} | " + " | ".join(f"{t:.4f}" for t in times) + " |")


if __name__ == "__main__":
    main()
