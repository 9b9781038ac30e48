# Copyright © 2026 Apple Inc.

import copy
import http.client
import json
import os
import sys
import tempfile
import threading
import time
import unittest
from http.server import ThreadingHTTPServer
from pathlib import Path
from unittest import mock

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten
from test_deepseek_v4 import SPECIAL_TOKENS as special_tokens

from mlx_lm import server
from mlx_lm.chat_templates.deepseek_v4 import (
    bos_token,
    eos_token,
)
from mlx_lm.generate import speculative_generate_step, stream_generate
from mlx_lm.models import deepseek_v4
from mlx_lm.models.cache import (
    TRIM_HISTORY,
    BatchWindowCompressorCache,
    LRUPromptCache,
    make_prompt_cache,
    trim_prompt_cache,
)
from mlx_lm.utils import load

# A window layer, a CSA and an HCA layer (hashed experts first).
CONFIG = {
    "model_type": "deepseek_v4",
    "vocab_size": 300,
    "hidden_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "head_dim": 32,
    "qk_rope_head_dim": 8,
    "q_lora_rank": 24,
    "o_groups": 2,
    "o_lora_rank": 16,
    "sliding_window": 32,
    "moe_intermediate_size": 16,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "index_n_heads": 8,
    "index_head_dim": 16,
    "index_topk": 8,
    "layer_types": [
        "sliding_attention",
        "compressed_sparse_attention",
        "heavily_compressed_attention",
    ],
    "compress_rates": {
        "compressed_sparse_attention": 4,
        "heavily_compressed_attention": 16,
    },
    "mlp_layer_types": ["hash_moe", "moe", "moe"],
    "max_position_embeddings": 256,
    "bos_token_id": 0,
    "eos_token_id": 1,
}


def make_tiny_model(seed=0):
    """The model with random weights (the defaults are mostly zeros)."""
    model = deepseek_v4.Model(deepseek_v4.ModelArgs.from_dict(CONFIG))
    mx.random.seed(seed)
    params = []
    for k, v in tree_flatten(model.parameters()):
        if k.endswith("tid2eid"):
            v = mx.random.randint(0, 8, v.shape).astype(v.dtype)
        elif k.endswith("norm.weight"):
            v = 1.0 + 0.1 * mx.random.normal(v.shape)
        else:
            v = 0.2 * mx.random.normal(v.shape)
        params.append((k, v))
    model.update(tree_unflatten(params))
    mx.eval(model.parameters())
    return model


def make_tiny_model_folder(path, seed=0):
    """A model folder: config, weights, tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model = make_tiny_model(seed)
    # Zero logits for BOS and EOS, so greedy decoding runs to the token limit.
    model.lm_head.weight[:2] = 0.0
    mx.save_safetensors(
        str(path / "model.safetensors"), dict(tree_flatten(model.parameters()))
    )
    with open(path / "config.json", "w") as f:
        json.dump(CONFIG, f)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=CONFIG["vocab_size"],
        # The chat format's tokens, checked at load (BOS and EOS first).
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(["The quick brown fox jumps over. " * 4], trainer)
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=bos_token, eos_token=eos_token
    ).save_pretrained(path)
    return path


def max_diff(a, b):
    return mx.abs(a.astype(mx.float32) - b.astype(mx.float32)).max().item()


def join_generation_thread(generator):
    """Stop the server's generation thread and wait until it has exited: its
    thread-local MLX compile cache is freed after Python's join returns, and a
    process that exits meanwhile can abort ("terminate called without an
    active exception")."""
    generator.stop_and_join()
    task = f"/proc/self/task/{generator._generation_thread.native_id}"
    while os.path.exists(task):
        time.sleep(0.01)


class ServerThread:
    """`mlx_lm.server` on a free loopback port, in this process."""

    def __init__(self, model_path, *args):
        argv = ["mlx_lm.server", "--model", str(model_path), "--log-level", "ERROR"]
        with mock.patch.object(server, "run") as run:
            with mock.patch.object(sys, "argv", argv + list(args)):
                server.main()
        provider = run.call_args.args[2]
        cache = server.LRUPromptCache(provider.cli_args.prompt_cache_size)
        self.generator = server.ResponseGenerator(provider, cache)
        self.httpd = ThreadingHTTPServer(
            ("127.0.0.1", 0),
            lambda *a, **kw: server.APIHandler(self.generator, *a, **kw),
        )
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        join_generation_thread(self.generator)

    def post(self, path, body):
        """Send ``body`` as JSON; return the status and the JSON answer."""
        conn = http.client.HTTPConnection(*self.httpd.server_address, timeout=300)
        conn.request("POST", path, json.dumps(body))
        response = conn.getresponse()
        answer = json.loads(response.read())
        conn.close()
        return response.status, answer

    def complete(self, body):
        return self.post("/v1/completions", body)


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
                        status, answer = thread.complete(body)
                        self.assertEqual(status, 200, answer)
                        self.assertEqual(answer["usage"]["completion_tokens"], 24)
                        texts.append(answer["choices"][0]["text"])
                finally:
                    thread.close()
        self.assertEqual(texts, texts[:1] * 4)
