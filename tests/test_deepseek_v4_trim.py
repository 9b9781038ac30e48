# Copyright © 2026 Apple Inc.

import copy
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import speculative_generate_step, stream_generate
from mlx_lm.utils import load
from test_deepseek_v4 import (
    GRAPH_BOUND,
    make_tiny_model,
    make_tiny_model_folder,
    max_cache_graph,
    max_diff,
)
from test_server_requests import ServerThread

from mlx_lm.models.cache import (
    TRIM_HISTORY,
    BatchWindowCompressorCache,
    LRUPromptCache,
    load_prompt_cache,
    make_prompt_cache,
    trim_prompt_cache,
)

# Decoded tokens before the trims: the window (32) wraps and the trims below
# cross CSA (4) and HCA (16) window boundaries: the caches sit at 100 tokens.
PROMPT = 40
DECODED = 60
AFTER = 5
TRIMS = (1, 3, 4, 5, 15, 16, 17, 21, 31, TRIM_HISTORY)


def decode(model, cache, tokens):
    """Logits of each token [B, T, V], fed one at a time."""
    out = []
    for t in range(tokens.shape[1]):
        out.append(model(tokens[:, t : t + 1], cache=cache))
        mx.eval(out[-1])
    return mx.concatenate(out, axis=1)


class TestDeepseekV4Trim(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.model = make_tiny_model()
        mx.random.seed(11)
        cls.prompts = [mx.random.randint(2, 300, (1, n)) for n in (PROMPT, PROMPT - 13)]
        cls.tokens = mx.random.randint(2, 300, (2, DECODED + AFTER))

    def prefilled(self, batched):
        caches = []
        for prompt in self.prompts[: 2 if batched else 1]:
            cache = make_prompt_cache(self.model)
            mx.eval(self.model(prompt, cache=cache))
            caches.append(cache)
        if not batched:
            return caches[0]
        return [BatchWindowCompressorCache.merge(c) for c in zip(*caches)]

    def check_trims_are_exact(self, batched):
        model = self.model
        tokens = self.tokens[: 2 if batched else 1]
        reference = decode(model, self.prefilled(batched), tokens)
        cache = self.prefilled(batched)
        decode(model, cache, tokens[:, :DECODED])
        for n in TRIMS:
            with self.subTest(n=n):
                trimmed = copy.deepcopy(cache)
                self.assertEqual(trim_prompt_cache(trimmed, n), n)
                again = decode(model, trimmed, tokens[:, DECODED - n :])
                diff = max_diff(again, reference[:, DECODED - n :])
                self.assertLess(diff, 1e-6)

        # The trimmed tokens again as one forward, as speculative decoding
        # verifies drafts, against a cache that never had them.
        for n in (5, 17):
            with self.subTest(chunk=n):
                expected = self.prefilled(batched)
                decode(model, expected, tokens[:, : DECODED - n])
                chunk = tokens[:, DECODED - n : DECODED + 1]
                expected = model(chunk, cache=expected)
                trimmed = copy.deepcopy(cache)
                self.assertEqual(trim_prompt_cache(trimmed, n), n)
                diff = max_diff(model(chunk, cache=trimmed), expected)
                self.assertLess(diff, 1e-6)

    def test_trimmed_tokens_decode_as_if_never_decoded(self):
        self.check_trims_are_exact(batched=False)

    def test_trimmed_tokens_decode_as_if_never_decoded_batched(self):
        self.check_trims_are_exact(batched=True)


class TestDeepseekV4SpeculativeAndPromptCache(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        cls.model, cls.tokenizer = load(make_tiny_model_folder(cls.dir.name))
        # The model with noise in its head drafts, so some drafts are rejected.
        cls.draft, _ = load(cls.dir.name)
        mx.random.seed(12)
        head = cls.draft.lm_head
        head.weight = head.weight + 0.1 * mx.random.normal(head.weight.shape)
        cls.prompt = mx.random.randint(2, 300, (37,)).tolist()

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def generate(self, **kwargs):
        steps = stream_generate(
            self.model, self.tokenizer, self.prompt, max_tokens=40, **kwargs
        )
        return [(r.token, r.from_draft) for r in steps]

    def test_speculative_decoding_gives_the_greedy_tokens(self):
        expected = [t for t, _ in self.generate()]
        for draft, k in ((self.draft, 3), (self.draft, 16), (self.model, 16)):
            with self.subTest(same=draft is self.model, k=k):
                out = self.generate(draft_model=draft, num_draft_tokens=k)
                self.assertEqual([t for t, _ in out], expected)
                drafted = sum(d for _, d in out)
                self.assertGreater(drafted, 0)
                if draft is self.draft:
                    self.assertLess(drafted, len(out) - 1)

    def test_speculative_decoding_past_the_history_raises(self):
        with self.assertRaisesRegex(ValueError, "fewer draft tokens"):
            self.generate(draft_model=self.draft, num_draft_tokens=40)

    def test_cache_graph_stays_bounded_in_speculative_decoding(self):
        cache = make_prompt_cache(self.model) + make_prompt_cache(self.draft)
        steps = speculative_generate_step(
            mx.array(self.prompt),
            self.model,
            self.draft,
            num_draft_tokens=5,
            max_tokens=200,
            prompt_cache=cache,
        )
        worst = []
        for n, _ in enumerate(steps, 1):
            if n % 10 == 0:
                worst.append(max_cache_graph(cache))
        self.assertEqual(len(worst), 20)
        self.assertLessEqual(max(worst), GRAPH_BOUND)

    def test_prompt_cache_holds_every_token_given(self):
        # As after plain decoding, the target and the draft model in step,
        # whether the last token given was a draft or the target's own.
        expected = [t for t, _ in self.generate()]
        ends = set()
        for max_tokens in range(9, 17):
            cache = make_prompt_cache(self.model) + make_prompt_cache(self.draft)
            steps = speculative_generate_step(
                mx.array(self.prompt),
                self.model,
                self.draft,
                num_draft_tokens=3,
                max_tokens=max_tokens,
                prompt_cache=cache,
            )
            steps = list(steps)
            ends.add(steps[-1][2])
            self.assertEqual([t for t, *_ in steps], expected[:max_tokens])
            size = len(self.prompt) + max_tokens
            self.assertEqual([c.size() for c in cache], [size] * len(cache))
            rest = speculative_generate_step(
                mx.array(expected[max_tokens : max_tokens + 1]),
                self.model,
                self.draft,
                max_tokens=4,
                prompt_cache=cache,
            )
            want = expected[max_tokens + 1 : max_tokens + 5]
            self.assertEqual([t for t, *_ in rest], want)
        self.assertEqual(ends, {False, True})

    def test_prompt_cache_reuses_the_common_prefix_of_an_edited_prompt(self):
        model = self.model
        mx.random.seed(13)
        stored = mx.random.randint(2, 300, (53,)).tolist()

        def prefilled(tokens, chunk=None):
            cache = make_prompt_cache(model)
            chunk = chunk or len(tokens)
            for i in range(0, len(tokens), chunk):
                mx.eval(model(mx.array(tokens[i : i + chunk])[None], cache=cache))
            return cache

        lru = LRUPromptCache()
        lru.insert_cache("m", stored[:10], prefilled(stored[:10]))
        # Prefilled 33 tokens at a time: the trimmed cache then holds what a
        # prefill of the 33 shared tokens does, bit for bit.
        lru.insert_cache("m", stored, prefilled(stored, 33))
        # The stored entry cannot trim back to the 10-token prefix.
        self.assertEqual(len(lru), 2)
        for shared, reused in ((33, 33), (15, 10)):
            with self.subTest(shared=shared):
                edited = stored[:shared] + [1 + t for t in stored[shared:]]
                cache, rest = lru.fetch_nearest_cache("m", edited)
                self.assertEqual(cache[0].size(), reused)
                self.assertEqual(rest, edited[reused:])
                logits = model(mx.array(rest)[None], cache=cache)
                expected = model(mx.array(rest)[None], cache=prefilled(edited[:reused]))
                self.assertLess(max_diff(logits, expected), 1e-6)

    def test_cache_prompt_then_generate_continues_the_prompt(self):
        # mlx_lm.cache_prompt leaves the user's turn open; generate then
        # adds the rest of that turn and the assistant's prompt.
        path, out = Path(self.dir.name), Path(self.dir.name) / "prompt.safetensors"
        start, rest = "The quick brown fox", " jumps over the lazy dog"
        cmd = [sys.executable, "-m", "mlx_lm", "cache_prompt", "--model", path]
        run = subprocess.run(
            cmd + ["--prompt", start, "--prompt-cache-file", out],
            capture_output=True,
            text=True,
            timeout=300,
        )
        self.assertEqual(run.returncode, 0, run.stderr)
        cached = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": start}], continue_final_message=True
        )
        cache = load_prompt_cache(str(out))
        self.assertEqual(cache[0].size(), len(cached))

        cmd = [sys.executable, "-m", "mlx_lm", "generate", "--prompt-cache-file"]
        run = subprocess.run(
            cmd + [out, "--prompt", rest, "--max-tokens", "12", "--verbose", "T"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        self.assertEqual(run.returncode, 0, run.stderr)
        # The cache holds the start of the whole conversation's tokens.
        full = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": start + rest}], add_generation_prompt=True
        )
        self.assertEqual(full[: len(cached)], cached)
        steps = stream_generate(self.model, self.tokenizer, full, max_tokens=12)
        expected = "".join(r.text for r in steps)
        self.assertIn(f"==========\n{expected}\n==========", run.stdout)


class TestDeepseekV4ServerDraftModel(unittest.TestCase):

    def test_server_with_a_draft_model_gives_the_greedy_text(self):
        body = {"prompt": "The quick brown fox", "max_tokens": 24, "temperature": 0}
        with tempfile.TemporaryDirectory() as tmp:
            target = make_tiny_model_folder(Path(tmp) / "target")
            # Other weights, so the target rejects some drafts and trims.
            draft = make_tiny_model_folder(Path(tmp) / "draft", seed=1)
            texts = []
            for args in ((), ("--draft-model", str(draft), "--num-draft-tokens", "4")):
                thread = ServerThread(target, *args)
                try:
                    # Again: through the prompt cache the first one left.
                    for _ in range(2):
                        status, answer = thread.request("POST", "/v1/completions", body)
                        self.assertEqual(status, 200, answer)
                        self.assertEqual(answer["usage"]["completion_tokens"], 24)
                        texts.append(answer["choices"][0]["text"])
                finally:
                    thread.close()
        self.assertEqual(texts, texts[:1] * 4)
