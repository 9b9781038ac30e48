# Copyright © 2026 Apple Inc.

import contextlib
import io
import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import unittest
from pathlib import Path
from unittest import mock

import mlx.core as mx
import numpy as np
from host_syncs import HostSyncs
from mlx.utils import tree_flatten, tree_unflatten
from test_deepseek_v4 import SPECIAL_TOKENS as special_tokens
from test_deepseek_v4_trim import ServerThread

from mlx_lm import cache_prompt, server
from mlx_lm.chat_templates.deepseek_v4 import (
    bos_token,
    eos_token,
)
from mlx_lm.generate import (
    BatchGenerator,
    generate_step,
)
from mlx_lm.generate import main as generate_main
from mlx_lm.generate import (
    make_drafter,
    setup_arg_parser,
    speculative_generate_step,
    stream_generate,
)
from mlx_lm.models import deepseek_v4
from mlx_lm.models.cache import (
    BatchWindowCompressorCache,
    WindowCompressorCache,
    load_prompt_cache,
    make_prompt_cache,
    save_prompt_cache,
    trim_prompt_cache,
)
from mlx_lm.models.mtp_drafter import (
    BatchMTPCache,
    MTPCache,
    MTPDrafter,
    make_mtp_prompt_cache,
)
from mlx_lm.sample_utils import make_sampler
from mlx_lm.utils import _get_classes, load

# A CSA and an HCA layer (the first with hashed experts), in transformers'
# schema, and the MTP block (window only); "mtp" loads the block.
CONFIG = {
    "model_type": "deepseek_v4",
    "vocab_size": 300,
    "hidden_size": 32,
    "num_hidden_layers": 2,
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
    "layer_types": ["compressed_sparse_attention", "heavily_compressed_attention"],
    "compress_rates": {
        "compressed_sparse_attention": 4,
        "heavily_compressed_attention": 16,
    },
    "mlp_layer_types": ["hash_moe", "moe"],
    "max_position_embeddings": 256,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "num_nextn_predict_layers": 1,
    "mtp": True,
}
PROMPT = mx.array([5, 17, 33, 2, 61, 40, 7, 7, 12, 50, 3, 28, 44, 19, 8] * 3)
# A model that has no drafter.
LLAMA = {
    "model_type": "llama",
    "vocab_size": 300,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-5,
}


def make_model(config=CONFIG, seed=0):
    """The model with random weights (the defaults are mostly zeros)."""
    model = deepseek_v4.Model(deepseek_v4.ModelArgs.from_dict(config))
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


def make_model_folder(path, config=CONFIG):
    """A model folder (config, weights, tokenizer) with the MTP block."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    path = Path(path)
    path.mkdir(parents=True)
    model = make_model(config)
    # Zero logits for BOS and EOS, so greedy decoding runs to the token limit.
    model.lm_head.weight[:2] = 0.0
    mx.save_safetensors(
        str(path / "model.safetensors"), dict(tree_flatten(model.parameters()))
    )
    with open(path / "config.json", "w") as f:
        json.dump({k: v for k, v in config.items() if k != "mtp"}, f)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config["vocab_size"],
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


def make_llama_folder(path, tokenizer_folder):
    """A Llama folder with the tokenizer of ``tokenizer_folder``."""
    shutil.copytree(
        tokenizer_folder,
        path,
        ignore=shutil.ignore_patterns("config.json", "*.safetensors"),
    )
    model_class, args_class = _get_classes(LLAMA)
    model = model_class(args_class.from_dict(LLAMA))
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    (path / "config.json").write_text(json.dumps(LLAMA))
    return path


class Oracle:
    """The model, with an MTP block that drafts each token's successor in
    ``sequences``, but wrongly after a multiple of 5, so rounds keep all,
    some or none of their drafts; ``check`` sees each call of the real
    block."""

    def __init__(self, model, sequences, check=None):
        self.model, self.check, self.after = model, check, {}
        for s in sequences:
            for a, b in zip(s, s[1:]):
                self.after.setdefault(a, b if a % 5 else (b + 1) % 300)

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def make_drafter(self):
        # The MTP block's drafter of this model, not of the wrapped one.
        return MTPDrafter(self)

    def mtp_draft(self, h, inputs, cache):
        start = cache[0].offset if self.check else None
        logits, out = self.model.mtp_draft(h, inputs, cache)
        if self.check:
            self.check(h, inputs, start, logits)
        guess = [[self.after.get(t, 0) for t in row] for row in inputs.tolist()]
        guess = mx.arange(logits.shape[-1]) == mx.array(guess)[..., None]
        # Still through the block's logits, which evaluate its cache.
        return mx.where(guess, 10.0, -10.0) + 0.0 * logits, out


def block_checker(model, tokens, checked):
    """A check for ``Oracle``: where the block reads the target's streams,
    its logits are those of one forward over the whole sequence, whatever
    was accepted and trimmed before (over the positions up to the first
    whose streams are not the target's)."""
    _, hidden = model(tokens[None, :-1], return_hidden=True)
    reference = model.mtp_draft(hidden, tokens[None, 1:], model.make_mtp_cache())
    reference = reference[0][0]
    mx.eval(hidden, reference)

    def check(h, inputs, start, logits):
        # The positions up to the first whose streams are not the target's
        # (a round's read goes on over the drafts a row did not keep).
        target = hidden[:, start : start + inputs.shape[1]]
        n = 0
        while n < min(h.shape[1], target.shape[1]) and h.shape[0] == 1:
            if not mx.allclose(h[:, n], target[:, n], atol=1e-3).item():
                break
            n += 1
        if n > 0:
            ref = reference[start : start + n]
            checked.append(mx.allclose(logits[0, :n], ref, atol=1e-4).item())

    return check


def plain(model, prompt, max_tokens):
    steps = generate_step(prompt, model, max_tokens=max_tokens)
    return [(int(t), lp) for t, lp in steps]


def check_drafts_give_plain_text(test, model, tokenizer, max_tokens, min_drafts):
    """``mtp=True`` drafts through the block (more than ``min_drafts``
    times) and gives the text of plain decoding."""
    texts = []
    with mock.patch.object(model, "mtp_draft", wraps=model.mtp_draft) as draft:
        for mtp in (False, True):
            steps = stream_generate(
                model, tokenizer, "The quick", max_tokens=max_tokens, mtp=mtp
            )
            texts.append("".join(r.text for r in steps))
    test.assertGreater(draft.call_count, min_drafts)
    test.assertEqual(texts[0], texts[1])


class TestMTPLoading(unittest.TestCase):

    def test_loaded_only_where_asked_for(self):
        # A folder with the block: load() holds the parameters of the model
        # without it; model_config={"mtp": True} (what --mtp passes) adds it.
        def sizes(model):
            return {k: v.nbytes for k, v in tree_flatten(model.parameters())}

        with tempfile.TemporaryDirectory() as tmp:
            path = make_model_folder(Path(tmp) / "mtp")
            saved = mx.load(str(path / "model.safetensors"))
            plain_model, _ = load(str(path))
            with_block, _ = load(str(path), model_config={"mtp": True})
        expected = sizes(make_model({**CONFIG, "mtp": False}))
        self.assertEqual(sizes(plain_model), expected)
        self.assertEqual(plain_model.mtp, [])
        got = sizes(with_block)
        block = {k for k in got if k.startswith("mtp.0.")}
        self.assertEqual(block, {k for k in saved if k.startswith("mtp.0.")})
        self.assertEqual({k: got[k] for k in got.keys() - block}, expected)
        # A checkpoint without the block's weights, or a config without it.
        weights = {k: v for k, v in saved.items() if not k.startswith("mtp.")}
        for config, weights in (
            (CONFIG, weights),
            ({**CONFIG, "num_nextn_predict_layers": 0}, saved),
        ):
            model = deepseek_v4.Model(deepseek_v4.ModelArgs.from_dict(config))
            model.load_weights(list(model.sanitize(weights).items()))
            self.assertEqual(model.mtp, [])

    def test_convert_keeps_the_block(self):
        # mlx_lm.convert -q writes and quantizes the block with the model;
        # it loads where asked for and drafts.
        from mlx_lm.convert import convert

        with tempfile.TemporaryDirectory() as tmp:
            path = make_model_folder(Path(tmp) / "mtp")
            out = Path(tmp) / "converted"
            with contextlib.redirect_stdout(io.StringIO()):
                convert(str(path), mlx_path=str(out), quantize=True)
            with open(out / "config.json") as f:
                self.assertNotIn("mtp", json.load(f))
            self.assertEqual(load(str(out))[0].mtp, [])
            model, tokenizer = load(str(out), model_config={"mtp": True})
            # And with a mixed recipe (the block's paths, mtp.0..., are not
            # the layers').
            mixed = Path(tmp) / "mixed"
            with contextlib.redirect_stdout(io.StringIO()):
                convert(
                    str(path),
                    mlx_path=str(mixed),
                    quantize=True,
                    quant_predicate="mixed_3_6",
                )
            block = load(str(mixed), model_config={"mtp": True})[0].mtp[0]
        self.assertEqual(block.attn.wo_a.bits, 3)
        # The tiny block's one projection of 64-column groups.
        self.assertEqual(model.mtp[0].attn.wo_a.bits, 4)
        check_drafts_give_plain_text(self, model, tokenizer, 20, 10)

    def test_fuse_keeps_the_block(self):
        # mlx_lm.fuse after mlx_lm.lora writes the block with the fused
        # model, so --mtp drafts from the fused folder.
        from mlx_lm import fuse
        from mlx_lm.tuner.utils import linear_to_lora_layers

        with tempfile.TemporaryDirectory() as tmp:
            path = make_model_folder(Path(tmp) / "mtp")
            adapters = Path(tmp) / "adapters"
            adapters.mkdir()
            lora = {"rank": 2, "scale": 1.0, "dropout": 0.0}
            model = load(str(path))[0]
            model.freeze()
            linear_to_lora_layers(model, 2, lora)
            mx.random.seed(0)
            trained = {
                k: mx.random.normal(v.shape) * 0.1
                for k, v in tree_flatten(model.trainable_parameters())
            }
            mx.save_safetensors(str(adapters / "adapters.safetensors"), trained)
            with open(adapters / "adapter_config.json", "w") as f:
                json.dump({"num_layers": 2, "lora_parameters": lora}, f)
            out = Path(tmp) / "fused"
            argv = ["fuse", "--model", str(path), "--adapter-path", str(adapters)]
            with mock.patch.object(sys, "argv", argv + ["--save-path", str(out)]):
                with contextlib.redirect_stdout(io.StringIO()):
                    fuse.main()
            with open(out / "config.json") as f:
                self.assertNotIn("mtp", json.load(f))
            model, tokenizer = load(str(out), model_config={"mtp": True})
            adapted = load(str(path), adapter_path=str(adapters))[0]
        self.assertEqual(len(model.mtp), 1)
        prompt = mx.array(tokenizer.encode("The quick"))
        tokens = [t for t, _ in generate_step(prompt, model, max_tokens=12)]
        self.assertEqual(
            [t for t, _ in generate_step(prompt, adapted, max_tokens=12)], tokens
        )
        steps = speculative_generate_step(prompt, model, mtp=True, max_tokens=12)
        self.assertEqual([t for t, *_ in steps], tokens)


class TestMTPDecoding(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.model = make_model()
        cls.expected = plain(cls.model, PROMPT, 40)

    def spec(self, model, prompt=PROMPT, **kwargs):
        kwargs.setdefault("max_tokens", 40)
        steps = speculative_generate_step(
            prompt, model, mtp=True, prefill_step_size=16, **kwargs
        )
        return list(steps)

    def assert_plain(self, steps, expected):
        self.assertEqual([s[0] for s in steps], [t for t, _ in expected])
        for (_, logprobs, _), (_, want) in zip(steps, expected):
            self.assertTrue(mx.allclose(logprobs, want, atol=1e-5))

    def test_greedy_tokens_and_logprobs_equal_plain_decoding(self):
        for k in (1, 2, 4):
            with self.subTest(num_draft_tokens=k):
                steps = self.spec(self.model, num_draft_tokens=k)
                self.assert_plain(steps, self.expected)

    def test_accepted_drafts_and_exact_block_inputs(self):
        tokens = mx.concatenate([PROMPT, mx.array([t for t, _ in self.expected])])
        checked = []
        check = block_checker(self.model, tokens, checked)
        oracle = Oracle(self.model, [tokens.tolist()], check)
        steps = self.spec(oracle, num_draft_tokens=3)
        self.assert_plain(steps, self.expected)
        # The prompt's chunks and the first call of every round.
        self.assertGreater(len(checked), 10)
        self.assertTrue(all(checked))
        drafted = sum(s[2] for s in steps)
        self.assertGreater(drafted, 15)
        self.assertLess(drafted, 40)

    def test_verify_keeps_the_target_distribution(self):
        # One draft for each of 20,000 rows: p the target's distribution, q
        # the drafter's. Draft x stays with probability min(1, p/q), else
        # the token is a sample of max(p - q, 0): each token has p.
        p, q = mx.array([0.1, 0.2, 0.3, 0.4]), mx.array([0.4, 0.3, 0.2, 0.1])
        sampler = make_sampler(temp=1.0)
        mx.random.seed(3)
        R = 20000
        drafts = mx.random.categorical(mx.log(q), shape=(R, 1)).astype(mx.uint32)
        tokens = mx.random.categorical(mx.log(p), shape=(R, 2)).astype(mx.uint32)
        logp = mx.broadcast_to(mx.log(p), (R, 2, 4))
        logq = mx.broadcast_to(mx.log(q), (R, 1, 4))
        out = sampler.verify(logp, drafts, logq, tokens)
        self.assertTrue(mx.array_equal(out[:, 1], tokens[:, 1]))
        first, drafts = np.array(out[:, 0]), np.array(drafts[:, 0])
        # Drafts where p >= q always stay; p < q: only where they stay.
        for x in (2, 3):
            self.assertTrue((first[drafts == x] == x).all())
        for x in (0, 1):
            self.assertTrue((drafts[first == x] == x).all())
        kept = [(first[drafts == x] == x).mean() for x in (0, 1)]
        np.testing.assert_allclose(kept, [0.25, 2 / 3], atol=0.03)
        freq = [(first == x).mean() for x in range(4)]
        np.testing.assert_allclose(freq, [0.1, 0.2, 0.3, 0.4], atol=0.015)
        # The sampler's filters apply to both: top-k 2 keeps p's top 2.
        top2 = make_sampler(temp=1.0, top_k=2)
        out = top2.verify(logp, mx.array(drafts)[:, None], logq, tokens)
        self.assertTrue(mx.all(out[:, 0] >= 2).item())

    def test_prompt_cache_round_trips_trims_and_continues(self):
        model = self.model
        cache = make_prompt_cache(model) + make_mtp_prompt_cache(model)
        first = [s[0] for s in self.spec(model, max_tokens=12, prompt_cache=cache)]
        # Every token given is in the cache (as after plain decoding), the
        # block's one position behind.
        self.assertEqual(cache[0].size(), PROMPT.size + 12)
        self.assertEqual(cache[-1].cache.size(), PROMPT.size + 11)
        cache = round_trip(self, cache, {WindowCompressorCache, MTPCache})
        self.assertEqual(trim_prompt_cache(cache, 5), 5)
        self.assertEqual(cache[-1].cache.size(), PROMPT.size + 6)

        kept = mx.concatenate([PROMPT, mx.array(first[:7])])
        rest = mx.array([9, 4, 77, 31])
        expected = plain(model, mx.concatenate([kept, rest]), 20)
        tokens = mx.concatenate([kept, rest, mx.array([t for t, _ in expected])])
        checked = []
        check = block_checker(model, tokens, checked)
        oracle = Oracle(model, [tokens.tolist()], check)
        steps = self.spec(oracle, rest, num_draft_tokens=3, prompt_cache=cache)
        self.assert_plain(steps[:20], expected)
        self.assertGreater(sum(s[2] for s in steps[:20]), 5)
        self.assertGreater(len(checked), 5)
        self.assertTrue(all(checked))

    def test_a_round_syncs_the_host_once(self):
        # The round's tokens and accepted count come back in one fetch; the
        # block's read of the round and the next input start before it.
        model = self.model
        for k in (1, 3):
            reads = []

            def mtp_draft(h, inputs, cache):
                # A round's read: its input and its drafts (up to k).
                if 1 < inputs.shape[1] <= k + 1:
                    reads.append(syncs.count)
                return model.mtp_draft(h, inputs, cache)

            oracle = Oracle(model, [])
            oracle.mtp_draft = mtp_draft
            with self.subTest(num_draft_tokens=k), HostSyncs() as syncs:
                steps = speculative_generate_step(
                    PROMPT, oracle, mtp=True, num_draft_tokens=k, max_tokens=30
                )
                counts = syncs.rounds(steps)
                self.assertGreater(len(counts), 5)
                self.assertEqual(counts, [1] * len(counts))
                # Each round's read is on its way before the round's sync
                # (the first round's count has the prompt's).
                self.assertGreaterEqual(len(reads), len(counts))
                self.assertEqual(reads[1:], [0] * (len(reads) - 1))

    def test_trim_prompt_cache_trims_every_entry_or_none(self):
        # The block's entry takes back one token fewer than the model's
        # caches: past that, trim_prompt_cache leaves them all as they are.
        cache = make_prompt_cache(self.model) + make_mtp_prompt_cache(self.model)
        list(self.spec(self.model, prompt_cache=cache))
        sizes = [c.size() for c in cache]
        for n in (33, 32):
            self.assertEqual(trim_prompt_cache(cache, n), 0)
            self.assertEqual([c.size() for c in cache], sizes)
        self.assertEqual(trim_prompt_cache(cache, 31), 31)
        self.assertEqual([c.size() for c in cache], [s - 31 for s in sizes])

    def test_options_that_cannot_apply_say_so(self):
        no_block = make_model({**CONFIG, "mtp": False})
        with self.assertRaisesRegex(ValueError, "loaded without its drafter"):
            self.spec(no_block)
        none = make_model({**CONFIG, "num_nextn_predict_layers": 0})
        with self.assertRaisesRegex(ValueError, "checkpoint has no drafter"):
            self.spec(none)
        model_class, args_class = _get_classes(LLAMA)
        llama = model_class(args_class.from_dict(LLAMA))
        with self.assertRaisesRegex(ValueError, "llama models have no drafter"):
            self.spec(llama)
        # Before its cache, which cannot be trimmed, is checked.
        mamba = {**LLAMA, "model_type": "mamba", "state_size": 4}
        mamba.update(conv_kernel=3, use_bias=False, use_conv_bias=True)
        model_class, args_class = _get_classes(mamba)
        mamba = model_class(args_class.from_dict({**mamba, "time_step_rank": 4}))
        with self.assertRaisesRegex(ValueError, "mamba models have no drafter"):
            self.spec(mamba)
        with self.assertRaisesRegex(ValueError, "draft model"):
            list(speculative_generate_step(PROMPT, self.model, self.model, mtp=True))
        with self.assertRaisesRegex(ValueError, "needs a draft model"):
            list(speculative_generate_step(PROMPT, self.model))
        # A cache the block has not followed; the message's recipe drafts.
        with self.assertRaisesRegex(ValueError, "in step.* make_drafter"):
            self.spec(self.model, prompt_cache=make_prompt_cache(self.model))
        cache = make_prompt_cache(self.model) + make_drafter(self.model).make_cache()
        self.assert_plain(self.spec(self.model, prompt_cache=cache), self.expected)
        with self.assertRaisesRegex(ValueError, "loaded without its drafter"):
            BatchGenerator(no_block, mtp=True)
        # The block, a position behind the model, takes back one token fewer
        # than its caches: more drafts are refused before any token.
        for k in (32, 40):
            with self.assertRaisesRegex(ValueError, f"at most 31 .* \\(got {k}\\)"):
                self.spec(self.model, num_draft_tokens=k)
            with self.assertRaisesRegex(ValueError, f"at most 31 .* \\(got {k}\\)"):
                BatchGenerator(self.model, mtp=True, num_draft_tokens=k)
        self.assert_plain(self.spec(self.model, num_draft_tokens=31), self.expected)
        generator = BatchGenerator(self.model, mtp=True)
        with self.assertRaisesRegex(ValueError, "in step"):
            generator.insert([[1, 2, 3]], caches=[make_prompt_cache(self.model)])


def round_trip(test, cache, kinds):
    """``cache`` through save_prompt_cache and load_prompt_cache: the same
    classes and arrays."""
    with tempfile.TemporaryDirectory() as tmp:
        file = str(Path(tmp) / "cache.safetensors")
        save_prompt_cache(file, cache)
        loaded = load_prompt_cache(file)
    test.assertEqual([type(c) for c in loaded], [type(c) for c in cache])
    test.assertEqual({type(c) for c in cache}, kinds)
    for a, b in zip(cache, loaded):
        want, got = tree_flatten(a.state), tree_flatten(b.state)
        test.assertEqual([k for k, _ in got], [k for k, _ in want])
        for (k, u), (_, v) in zip(got, want):
            same = mx.array_equal(u, v) if isinstance(v, mx.array) else u == v
            test.assertTrue(same, (type(a).__name__, k))
    return loaded


class TestMTPBatch(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.model = make_model()
        mx.random.seed(4)
        lengths = {"a": 37, "b": 21, "c": 50, "d": 1}
        cls.prompts = {
            k: mx.random.randint(2, 300, (n,)).tolist() for k, n in lengths.items()
        }
        cls.expected = {
            k: plain(cls.model, mx.array(p), 40) for k, p in cls.prompts.items()
        }

    def decode(self, model, max_tokens, num_draft_tokens):
        """Each request's responses from a BatchGenerator with MTP, and the
        tokens each got in each round."""
        kwargs = {"num_draft_tokens": num_draft_tokens, "prefill_step_size": 16}
        generator = BatchGenerator(model, mtp=True, stop_tokens=set(), **kwargs)
        prompts = [self.prompts[k] for k in max_tokens]
        uids = generator.insert(prompts, max_tokens=list(max_tokens.values()))
        names = dict(zip(uids, max_tokens))
        results, rounds = {k: [] for k in max_tokens}, []
        while responses := generator.next_generated():
            counts = {}
            for r in responses:
                results[names[r.uid]].append(r)
                counts[names[r.uid]] = counts.get(names[r.uid], 0) + 1
            rounds.append(counts)
        generator.close()
        for name, responses in results.items():
            with self.subTest(request=name):
                expected = self.expected[name][: max_tokens[name]]
                self.assertEqual([r.token for r in responses], [t for t, _ in expected])
                for r, (_, logprobs) in zip(responses, expected):
                    self.assertTrue(mx.allclose(r.logprobs, logprobs, atol=1e-5))
                reasons = [r.finish_reason for r in responses]
                self.assertEqual(reasons, [None] * (len(reasons) - 1) + ["length"])
        return results, rounds

    def test_a_round_syncs_the_host_once(self):
        # Every row's tokens and accepted count in one fetch, no per-row
        # fetch (the rows of a one-token prompt and of longer ones).
        generator = BatchGenerator(
            self.model, mtp=True, num_draft_tokens=2, stop_tokens=set()
        )
        prompts = [self.prompts[k] for k in "abd"]
        generator.insert(prompts, max_tokens=[100] * 3)
        with HostSyncs() as syncs:
            counts = syncs.batch_rounds(generator, 3, 6)
        generator.close()
        self.assertEqual(counts, [1] * 6)

    def test_greedy_rows_equal_plain_decoding(self):
        max_tokens = {"a": 40, "b": 31, "c": 40, "d": 25}
        for k in (1, 2):
            with self.subTest(num_draft_tokens=k):
                self.decode(self.model, max_tokens, k)

    def test_rows_accept_their_own_counts(self):
        max_tokens = {"a": 40, "b": 33, "c": 37, "d": 25}
        sequences = [self.prompts[k] + [t for t, _ in self.expected[k]] for k in "abcd"]
        _, rounds = self.decode(Oracle(self.model, sequences), max_tokens, 3)
        # Rounds where the rows got different numbers of tokens, none past
        # its drafts and the target's token.
        full = [r for r in rounds[1:] if len(r) == 4]
        self.assertTrue(any(len(set(r.values())) > 1 for r in full), rounds)
        self.assertLessEqual(max(n for r in rounds for n in r.values()), 4)
        self.assertLess(len(rounds), 30)

    def test_rows_trim_their_own_counts(self):
        # Rows at their own positions, each trimmed by its own count, then
        # one more token, give each row's logits alone.
        model = self.model
        counts, caches = [0, 3, 7], []
        for n in (45, 38, 29):
            cache = make_prompt_cache(model)
            model(PROMPT[None, :n], cache=cache)
            caches.append(cache)
        batch = [caches[0][i].merge([c[i] for c in caches]) for i in range(2)]
        self.assertEqual(batch[0].row_max_trim, [32, 32, 29])
        self.assertFalse(batch[0].trim_rows([0, 0, 30]))
        for c in batch:
            self.assertTrue(c.trim_rows(counts))
        self.assertEqual(batch[0].offsets, [45, 35, 22])
        # A verify of four tokens (the decode step widened to its rows), then
        # one more token.
        verify = mx.array([[3, 9, 4, 7], [4, 8, 2, 6], [5, 7, 3, 9]])
        nxt = mx.array([[3], [4], [5]])
        got = [model(verify, cache=batch), model(nxt, cache=batch)]
        for b, (cache, n) in enumerate(zip(caches, counts)):
            self.assertEqual(trim_prompt_cache(cache, n), n)
            for tokens, out in zip((verify, nxt), got):
                alone = model(tokens[b : b + 1], cache=cache)[0]
                self.assertTrue(mx.allclose(out[b], alone, atol=1e-4))

    def test_batch_caches_round_trip(self):
        generator = BatchGenerator(self.model, mtp=True, stop_tokens=set())
        generator.insert([self.prompts["a"], self.prompts["b"]], max_tokens=[20, 20])
        for _ in range(3):
            generator.next_generated()
        batch = generator._generation_batch.prompt_cache
        kinds = {BatchWindowCompressorCache, BatchMTPCache}
        loaded = round_trip(self, batch, kinds)
        self.assertEqual(loaded[-1].ends, batch[-1].ends)
        self.assertEqual(loaded[-1].row_max_trim, batch[-1].row_max_trim)
        generator.close()


class TestMTPCommands(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        cls.path = make_model_folder(Path(cls.dir.name) / "mtp")
        cls.model, cls.tokenizer = load(str(cls.path), model_config={"mtp": True})

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def test_generate_and_cache_prompt_commands(self):
        # mlx_lm.generate --mtp prints the plain text.
        prompt = "The quick brown fox"
        argv = ["generate", "--model", str(self.path), "--prompt", prompt]
        argv += ["--max-tokens", "20", "--ignore-chat-template"]
        out = io.StringIO()
        with mock.patch.object(sys, "argv", argv + ["--mtp"]):
            with contextlib.redirect_stdout(out):
                generate_main()
        raw = self.tokenizer.encode(prompt, add_special_tokens=True)
        steps = stream_generate(self.model, self.tokenizer, raw, max_tokens=20)
        self.assertIn("".join(r.text for r in steps), out.getvalue())

        # mlx_lm.cache_prompt --mtp saves the block's cache after the
        # model's: drafting from it gives plain decoding's tokens.
        file = str(Path(self.dir.name) / "cache.safetensors")
        argv = ["cache_prompt", "--model", str(self.path), "--prompt", prompt]
        printed = []
        for mtp in ([], ["--mtp"]):
            out = io.StringIO()
            with mock.patch.object(
                sys, "argv", argv + ["--prompt-cache-file", file, *mtp]
            ):
                with contextlib.redirect_stdout(out):
                    cache_prompt.main()
            printed.append(out.getvalue().split("\r")[-1].split(" tokens")[0])
        # Its progress line counts the prompt's tokens, as without --mtp.
        self.assertRegex(printed[0], r"Processed +\d+$")
        self.assertEqual(printed[1], printed[0])
        rest = mx.array(self.tokenizer.encode(" jumps over", add_special_tokens=False))
        tokens = []
        for mtp in (False, True):
            cache = load_prompt_cache(file)
            self.assertIsInstance(cache[-1], MTPCache)
            if mtp:
                steps = speculative_generate_step(
                    rest, self.model, mtp=True, prompt_cache=cache, num_draft_tokens=2
                )
            else:
                # Without MTP the block's cache in the file is left out.
                steps = generate_step(rest, self.model, prompt_cache=cache)
            tokens.append([s[0] for s in zip(range(24), steps)])
        self.assertEqual(tokens[0], tokens[1])

    def test_too_many_drafts_stop_before_any_output(self):
        for n, message in (
            ("32", "use at most 31 draft tokens (got 32)"),
            ("-1", "Use at least 0 draft tokens (got -1)"),
        ):
            argv = ["generate", "--model", str(self.path), "--prompt", "Hi", "--mtp"]
            out = io.StringIO()
            with mock.patch.object(sys, "argv", argv + ["--num-draft-tokens", n]):
                with contextlib.redirect_stdout(out):
                    with self.assertRaises(SystemExit) as stop:
                        generate_main()
            self.assertIn(message, str(stop.exception.code))
            self.assertEqual(out.getvalue(), "")
            # mlx_lm.server stops as it loads the model, before any request.
            argv = ["mlx_lm.server", "--model", str(self.path), "--mtp"]
            with mock.patch.object(server, "run") as run:
                with mock.patch.object(sys, "argv", argv + ["--num-draft-tokens", n]):
                    server.main()
            with self.assertRaisesRegex(ValueError, re.escape(message)):
                run.call_args.args[2].load_default()

    def test_one_default_number_of_drafts(self):
        # What mlx_lm.generate and mlx_lm.server draft a step by default is
        # what stream_generate and BatchGenerator draft with mtp=True.
        default = setup_arg_parser().parse_args([]).num_draft_tokens
        argv = ["mlx_lm.server", "--model", str(self.path)]
        with mock.patch.object(server, "run") as run:
            with mock.patch.object(sys, "argv", argv):
                server.main()
        self.assertEqual(run.call_args.args[2].cli_args.num_draft_tokens, default)

        prompt = self.tokenizer.encode("The quick brown fox")
        steps = stream_generate(self.model, self.tokenizer, prompt, max_tokens=60)
        oracle = Oracle(self.model, [prompt + [r.token for r in steps]])
        steps = stream_generate(oracle, self.tokenizer, prompt, max_tokens=60, mtp=True)
        drafted, run = [], 0
        for r in steps:
            run = run + 1 if r.from_draft else 0
            drafted.append(run)
        self.assertEqual(max(drafted), default)

        generator = BatchGenerator(oracle, mtp=True, stop_tokens=set())
        generator.insert([prompt], max_tokens=[60])
        rounds = []
        while responses := generator.next_generated():
            rounds.append(len(responses))
        generator.close()
        self.assertEqual(max(rounds), default + 1)

    def test_server_batches_concurrent_requests(self):
        # Requests at once with --mtp decode as rows of one batch with MTP,
        # and each gets the text a plain server gives it alone; again through
        # the prompt caches the batch left.
        prompts = ["The quick brown fox", "Hello there, how", "A long time ago in"]
        sizes = []

        class Recording(server.BatchGenerator):
            def next(self):
                out = super().next()
                sizes.append((self.drafter is not None, len(self._generation_batch)))
                return out

        def complete(thread, i, texts):
            body = {"prompt": prompts[i], "max_tokens": 40 + 6 * i, "temperature": 0}
            texts[i] = thread.complete(body)

        thread, alone = ServerThread(self.path), [None] * 3
        try:
            for i in range(3):
                complete(thread, i, alone)
        finally:
            thread.close()
        runs = []
        with mock.patch.object(server, "BatchGenerator", Recording):
            thread = ServerThread(self.path, "--mtp", "--num-draft-tokens", "2")
            try:
                for _ in range(2):
                    texts = [None] * 3
                    clients = [
                        threading.Thread(target=complete, args=(thread, i, texts))
                        for i in range(3)
                    ]
                    for c in clients:
                        c.start()
                    for c in clients:
                        c.join()
                    runs.append(texts)
            finally:
                thread.close()
        for status, answer in alone + runs[0] + runs[1]:
            self.assertEqual(status, 200, answer)
        alone = [answer["choices"][0]["text"] for _, answer in alone]
        for texts in runs:
            self.assertEqual([a["choices"][0]["text"] for _, a in texts], alone)
        self.assertTrue(all(mtp for mtp, _ in sizes))
        self.assertGreaterEqual(max(n for _, n in sizes), 2)


class TestMTPWithoutADrafter(unittest.TestCase):
    """--mtp on a model without a drafter stops the command at start, in one
    line that names the checkpoints that carry one."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        tmp = Path(cls.dir.name)
        cls.no_block = make_model_folder(tmp / "no_block", {**CONFIG, "mtp": False})
        cls.llama = make_llama_folder(tmp / "llama", cls.no_block)

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def test_commands_say_what_is_missing(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        commands = {
            "generate": ["--prompt", "Hello", "--max-tokens", "2"],
            "cache_prompt": ["--prompt", "Hello"]
            + ["--prompt-cache-file", "cache.safetensors"],
            "server": ["--port", str(port)],
        }
        models = {
            self.llama: "llama models have no drafter for --mtp",
            self.no_block: "This DeepSeek-V4 checkpoint has no drafter for --mtp",
        }
        for path, missing in models.items():
            for command, options in commands.items():
                with self.subTest(model=path.name, command=command):
                    cmd = [sys.executable, "-m", "mlx_lm", command]
                    cmd += ["--model", str(path), "--mtp", *options]
                    run = subprocess.run(
                        cmd,
                        capture_output=True,
                        text=True,
                        timeout=300,
                        cwd=self.dir.name,
                    )
                    self.assertEqual(run.returncode, 1, run.stderr)
                    lines = run.stderr.strip().splitlines()
                    self.assertEqual(len(lines), 1, run.stderr)
                    self.assertIn(missing, lines[0])
                    self.assertIn("V4-Flash-0731 and V4-Pro-0813", lines[0])
                    self.assertNotIn("model_config", lines[0])
        self.assertFalse((Path(self.dir.name) / "cache.safetensors").exists())


if __name__ == "__main__":
    unittest.main()
