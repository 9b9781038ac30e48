# Copyright © 2026 Apple Inc.
"""The MTP PR's deeper checks, beside its tests in
tests/test_deepseek_v4_mtp.py: DeepSeek's release names, memory and
quantization of the block, exact block inputs with an oracle drafter,
the sampled distribution (chi-square over 600 runs, one request and a batch
of rows), sampler filters and logits processors, graphs bounded over 1,000
tokens (300 in a batch), the commands as subprocesses, the server through its
prompt cache, and the batch's long scenarios (rows joining mid-decode,
finished rows' caches, stop tokens inside a round)."""

import contextlib
import io
import json
import re
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import mlx.core as mx
from mlx.utils import tree_flatten
from mtp_fixtures import (
    GRAPH_BOUND,
    TINY_CONFIG,
    ServerThread,
    block_checker,
    graph_edges,
    make_tiny_model,
    make_tiny_model_folder,
    max_cache_graph,
)

from mlx_lm import cache_prompt
from mlx_lm.generate import (
    BatchGenerator,
    SpeculativeGenerationBatch,
    batch_generate,
    generate_step,
    speculative_generate_step,
    stream_generate,
)
from mlx_lm.models import deepseek_v4
from mlx_lm.models.cache import (
    load_prompt_cache,
)
from mlx_lm.models.mtp_drafter import MTPDrafter, make_mtp_prompt_cache
from mlx_lm.sample_utils import make_sampler
from mlx_lm.utils import load, load_model, quantize_model, save_config, save_model

# A checkpoint with an MTP block, loaded with it ("mtp"; a folder written
# from it has the block's weights and the checkpoint's config alone).
MTP_CONFIG = {**TINY_CONFIG, "num_nextn_predict_layers": 1, "mtp": True}
WITH_MTP = {"mtp": True}
PROMPT = mx.array([5, 17, 33, 2, 61, 40, 7, 7, 12, 50, 3, 28, 44, 19, 8] * 3)

# DeepSeek's release names of the MTP block, from this model's.
_RELEASE_NAMES = (
    (r"\.hc_head\.", ".hc_head_"),
    (r"\.(attn|ffn)_hc\.", r".hc_\1_"),
    (r"\.e_score_correction_bias$", ".bias"),
    (r"\.gate_proj\.", ".w1."),
    (r"\.down_proj\.", ".w2."),
    (r"\.up_proj\.", ".w3."),
)


def release_mtp_weights(model):
    """The model's MTP block under DeepSeek's names, one tensor per expert."""
    out = {}
    for name, value in tree_flatten(model.parameters()):
        if not name.startswith("mtp."):
            continue
        for old, new in _RELEASE_NAMES:
            name = re.sub(old, new, name)
        if ".switch_mlp." in name:
            for e in range(value.shape[0]):
                out[name.replace(".switch_mlp.", f".experts.{e}.")] = value[e]
        else:
            out[name] = value
    return out


def target_weights(model):
    return {k: v for k, v in tree_flatten(model.parameters()) if "mtp." not in k}


def loaded(config, weights):
    model = deepseek_v4.Model(deepseek_v4.ModelArgs.from_dict(config))
    model.load_weights(list(model.sanitize(weights).items()))
    return model


class TestMTPWeights(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.model = make_tiny_model(MTP_CONFIG)

    def test_released_names_load_into_the_block(self):
        weights = {**target_weights(self.model), **release_mtp_weights(self.model)}
        self.assertIn("mtp.0.hc_head_fn", weights)
        self.assertIn("mtp.0.ffn.experts.7.w2.weight", weights)
        model = loaded(MTP_CONFIG, weights)
        expected = dict(tree_flatten(self.model.parameters()))
        got = dict(tree_flatten(model.parameters()))
        self.assertEqual(set(got), set(expected))
        for name, value in got.items():
            self.assertTrue(mx.array_equal(value, expected[name]), name)
        # The block is a DeepSeek-V4 layer: routed (not hashed) experts, and
        # its attention from the last `compress_ratios` entry.
        self.assertIn("mtp.0.ffn.gate.e_score_correction_bias", got)
        self.assertNotIn("mtp.0.ffn.gate.tid2eid", got)
        self.assertEqual(model.mtp[0].attn.kind, deepseek_v4.SLIDING)
        config = {**MTP_CONFIG, "layer_types": None}
        config["compress_ratios"] = [0, 4, 16, 4, 16]
        model = deepseek_v4.Model(deepseek_v4.ModelArgs.from_dict(config))
        self.assertEqual(model.mtp[0].attn.kind, deepseek_v4.HCA)
        self.assertEqual(len(model.layers), 4)

    def test_counted_in_the_model_memory(self):
        def nbytes(model):
            return sum(v.nbytes for _, v in tree_flatten(model.parameters()))

        plain = make_tiny_model(TINY_CONFIG)
        block = sum(
            v.nbytes
            for k, v in tree_flatten(self.model.parameters())
            if k.startswith("mtp.0.")
        )
        self.assertGreater(block, 0)
        self.assertEqual(nbytes(self.model), nbytes(plain) + block)

    def test_skipped_where_absent_or_not_asked_for(self):
        weights = target_weights(self.model)
        # A checkpoint without the block (transformers' save_pretrained
        # drops it).
        model = loaded(MTP_CONFIG, weights)
        self.assertEqual(model.mtp, [])
        self.assertEqual(model.make_mtp_cache(), [])
        # The user does not ask for it, or the config says there is none:
        # the block's weights are not loaded.
        with_block = {**weights, **release_mtp_weights(self.model)}
        for change in ({"mtp": False}, {"num_nextn_predict_layers": 0}):
            model = loaded({**MTP_CONFIG, **change}, with_block)
            self.assertEqual(model.mtp, [])
        # Another kind of drafter under mtp.* (V4.1's) loads without it, and
        # says so in one line.
        other = {**weights, "mtp.0.blocks.0.attn.wq.weight": mx.zeros((4, 4))}
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            model = loaded(MTP_CONFIG, other)
        self.assertEqual(model.mtp, [])
        self.assertEqual(len(out.getvalue().strip().splitlines()), 1)
        self.assertIn("not a DeepSeek-V4 MTP block", out.getvalue())

    def test_quantized_with_the_model_and_saved(self):
        model = make_tiny_model(MTP_CONFIG)
        config = dict(MTP_CONFIG)
        model, config = quantize_model(model, config, 32, 8)
        self.assertEqual(model.mtp[0].e_proj.bits, 8)
        self.assertEqual(model.mtp[0].ffn.switch_mlp.gate_proj.bits, 8)
        with tempfile.TemporaryDirectory() as tmp:
            save_model(tmp, model)
            save_config(config, Path(tmp) / "config.json")
            # The config written leaves out the load switch: ask again.
            again, _ = load_model(Path(tmp), model_config={"mtp": True})
        self.assertEqual(again.mtp[0].e_proj.bits, 8)
        cache, again_cache = model.make_cache(), again.make_cache()
        logits, h = model(PROMPT[None], cache, return_hidden=True)
        out = model.mtp_draft(h, PROMPT[None], model.make_mtp_cache())[0]
        logits, h = again(PROMPT[None], again_cache, return_hidden=True)
        ref = again.mtp_draft(h, PROMPT[None], again.make_mtp_cache())[0]
        self.assertTrue(mx.array_equal(out, ref))


class Oracle:
    """The model, with an MTP block that drafts the given sequence's tokens,
    but wrongly after every fifth position, so rounds accept all, some or
    none; ``check`` sees each call of the real block."""

    def __init__(self, model, tokens, check=None):
        self.model, self.tokens, self.check = model, tokens.tolist(), check

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def make_drafter(self):
        # The MTP block's drafter of this model, not of the wrapped one.
        return MTPDrafter(self)

    def mtp_draft(self, h, inputs, cache):
        start = cache[0].offset
        logits, out = self.model.mtp_draft(h, inputs, cache)
        if self.check is not None:
            self.check(h, inputs, start, logits)
        # Each position's guess of the token two after it (none past the
        # sequence: the block's own logits there).
        vocab, guesses = logits.shape[-1], []
        for pos in range(start, start + inputs.shape[1]):
            right = self.tokens[pos + 2] if pos + 2 < len(self.tokens) else -1
            guesses.append(right if pos % 5 or right < 0 else (right + 1) % vocab)
        guesses = mx.array(guesses)[:, None]
        oracle = mx.where(mx.arange(vocab) == guesses, 10.0, -10.0)
        logits = mx.where(guesses >= 0, oracle, logits[0])[None]
        return logits, out


def plain(model, prompt, max_tokens, **kwargs):
    steps = generate_step(prompt, model, max_tokens=max_tokens, **kwargs)
    return [(t, lp) for t, lp in steps]


def second_token_marginal():
    """A one-layer model with a vocabulary of 8, a prompt, and the exact
    distribution of the second token it samples, sum_a p(a) p(b | a)."""
    config = {**MTP_CONFIG, "vocab_size": 8, "num_hidden_layers": 1}
    config.update(layer_types=["sliding_attention"], mlp_layer_types=["moe"])
    model = make_tiny_model(config, seed=3)
    prompt = PROMPT[:5] % 8
    first = mx.softmax(model(prompt[None])[0, -1])
    seconds = model(mx.concatenate([mx.tile(prompt, (8, 1)), mx.arange(8)[:, None]], 1))
    return model, prompt, first @ mx.softmax(seconds[:, -1], axis=-1)


def assert_follows(test, counts, distribution):
    """Chi-square of the counts of 8 tokens against ``distribution``."""
    expected = (distribution * sum(counts)).tolist()
    chi2 = sum((c - e) ** 2 / e for c, e in zip(counts, expected))
    # The 0.999 quantile of chi-square with 7 degrees of freedom.
    test.assertLess(chi2, 24.32, (counts, expected))


class TestMTPSpeculative(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.model = make_tiny_model(MTP_CONFIG)
        cls.expected = plain(cls.model, PROMPT, 40)

    def spec(self, model, max_tokens=40, **kwargs):
        kwargs.setdefault("prefill_step_size", 16)
        steps = speculative_generate_step(
            PROMPT, model, mtp=True, max_tokens=max_tokens, **kwargs
        )
        return list(steps)

    def assert_plain(self, steps):
        self.assertEqual([s[0] for s in steps], [t for t, _ in self.expected])
        for (_, logprobs, _), (_, expected) in zip(steps, self.expected):
            self.assertTrue(mx.allclose(logprobs, expected, atol=1e-5))

    def test_accepted_drafts_and_exact_block_inputs(self):
        tokens = mx.concatenate([PROMPT, mx.array([t for t, _ in self.expected])])
        checked = []
        check = block_checker(self.model, tokens, checked)
        oracle = Oracle(self.model, tokens, check)
        steps = self.spec(oracle, num_draft_tokens=3)
        self.assert_plain(steps)
        # The prompt's chunks and the first step of every round.
        self.assertGreater(len(checked), 15)
        self.assertTrue(all(checked))
        drafted = sum(s[2] for s in steps)
        self.assertGreater(drafted, 20)
        self.assertLess(drafted, 40)

    def test_sampled_tokens_follow_the_target_distribution(self):
        # A vocabulary of 8: the second token (drafted or not) against its
        # exact marginal.
        model, prompt, expected = second_token_marginal()
        sampler = make_sampler(temp=1.0)
        mx.random.seed(5)
        runs, counts, drafted = 600, [0] * 8, 0
        for _ in range(runs):
            steps = speculative_generate_step(
                prompt,
                model,
                mtp=True,
                num_draft_tokens=2,
                max_tokens=2,
                sampler=sampler,
            )
            steps = list(steps)
            counts[steps[1][0]] += 1
            drafted += steps[1][2]
        assert_follows(self, counts, expected)
        # Speculative sampling keeps a draft with probability min(1, p/q):
        # more often than the target's own sample equals it (sum p*q, about
        # a tenth here).
        self.assertGreater(drafted, runs // 4)

    def test_sampled_tokens_keep_to_the_sampler_filters(self):
        sampler = make_sampler(temp=1.5, top_k=2)
        mx.random.seed(6)
        steps = self.spec(self.model, num_draft_tokens=3, sampler=sampler)
        for token, logprobs, _ in steps:
            self.assertIn(token, mx.argsort(-logprobs)[:2].tolist())

    def test_logits_processors_see_what_they_see_with_a_draft_model(self):
        # A processor that depends on the history it is given: MTP drafts
        # (no processor) give what another drafter gives.
        def penalty(tokens, logits):
            seen = mx.zeros((300,)).at[tokens].add(1.0)
            return logits - 3.0 * seen

        def run(model, **kwargs):
            steps = speculative_generate_step(
                PROMPT,
                model,
                num_draft_tokens=3,
                max_tokens=30,
                logits_processors=[penalty],
                **kwargs,
            )
            return [(t, d) for t, _, d in steps]

        # The model drafting for itself accepts every draft.
        expected = run(self.model, draft_model=make_tiny_model(MTP_CONFIG))
        tokens = [t for t, _ in expected]
        self.assertNotEqual(tokens, [t for t, _ in self.expected[:30]])
        for model in (
            self.model,
            Oracle(self.model, mx.array([*PROMPT.tolist(), *tokens])),
        ):
            got = run(model, mtp=True)
            self.assertEqual([t for t, _ in got], tokens)
        self.assertGreater(sum(d for _, d in got), 10)

    def test_cache_graphs_stay_bounded(self):
        # A CSA and an HCA layer, and a CSA block (its `compress_ratios`
        # entry): every pool and buffer of both caches trims and grows.
        config = {**MTP_CONFIG, "num_hidden_layers": 2, "layer_types": None}
        config.update(compress_ratios=[4, 16, 4], mlp_layer_types=["moe"] * 2)
        model = make_tiny_model(config)
        cache, mtp_cache = model.make_cache(), make_mtp_prompt_cache(model)
        self.assertEqual(model.mtp[0].attn.kind, deepseek_v4.CSA)
        steps = speculative_generate_step(
            PROMPT,
            model,
            mtp=True,
            num_draft_tokens=2,
            max_tokens=1000,
            prompt_cache=cache + mtp_cache,
        )
        worst = []
        for i, _ in enumerate(steps):
            if i % 50 == 0:
                block = [mtp_cache[0].cache]
                worst.append(max(max_cache_graph(c) for c in (cache, block)))
                worst.append(graph_edges(mtp_cache[0].hidden))
        self.assertLessEqual(max(worst), GRAPH_BOUND)
        # Every token given, the block one position behind.
        self.assertEqual(cache[0].offset, PROMPT.size + 1000)
        self.assertEqual(mtp_cache[0].cache.offset, cache[0].offset - 1)


class TestMTPCommands(unittest.TestCase):

    def test_stream_generate_and_the_command(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = make_tiny_model_folder(Path(tmp) / "mtp", MTP_CONFIG)
            model, tokenizer = load(str(path), model_config=WITH_MTP)
            self.assertEqual(len(model.mtp), 1)
            prompt = "The quick brown fox"
            texts = []
            for mtp in (False, True):
                steps = stream_generate(
                    model, tokenizer, prompt, max_tokens=20, mtp=mtp, num_draft_tokens=3
                )
                texts.append("".join(r.text for r in steps))
            self.assertEqual(texts[0], texts[1])
            # batch_generate passes mtp to its BatchGenerator.
            prompts = [tokenizer.encode(p) for p in (prompt, "Hello", "A b c d e")]
            out = [
                batch_generate(
                    model,
                    tokenizer,
                    prompts,
                    max_tokens=20,
                    mtp=mtp,
                    num_draft_tokens=2,
                ).texts
                for mtp in (False, True)
            ]
            self.assertEqual(out[0], out[1])

            cmd = [sys.executable, "-m", "mlx_lm", "generate", "--model", str(path)]
            cmd += ["--prompt", prompt, "--max-tokens", "20", "--ignore-chat-template"]
            run = subprocess.run(
                cmd + ["--mtp", "--num-draft-tokens", "3"],
                capture_output=True,
                text=True,
                timeout=300,
            )
            self.assertEqual(run.returncode, 0, run.stderr)
            raw = tokenizer.encode(prompt, add_special_tokens=True)
            steps = stream_generate(model, tokenizer, raw, max_tokens=20)
            self.assertIn("".join(r.text for r in steps), run.stdout)

            none = make_tiny_model_folder(Path(tmp) / "none")
            run = subprocess.run(
                [*cmd[:5], str(none), "--prompt", prompt, "--mtp"],
                capture_output=True,
                text=True,
                timeout=300,
            )
            self.assertNotEqual(run.returncode, 0)
            self.assertIn("checkpoint has no drafter for --mtp", run.stderr)

    def test_cache_prompt_file_drafts_with_mtp(self):
        # mlx_lm.cache_prompt --mtp saves the block's cache after the model's;
        # drafting from that file gives what plain decoding from the plain
        # file gives, in Python and with mlx_lm.generate --mtp.
        with tempfile.TemporaryDirectory() as tmp:
            path = make_tiny_model_folder(Path(tmp) / "mtp", MTP_CONFIG)
            model, tokenizer = load(str(path), model_config=WITH_MTP)
            files = {}
            for mtp in (False, True):
                files[mtp] = str(Path(tmp) / f"cache_{mtp}.safetensors")
                argv = ["cache_prompt", "--model", str(path), "--prompt"]
                argv += ["The quick brown fox", "--prompt-cache-file", files[mtp]]
                with mock.patch.object(
                    sys, "argv", argv + ["--mtp"] * mtp
                ), contextlib.redirect_stdout(io.StringIO()):
                    cache_prompt.main()
            loaded = load_prompt_cache(files[True])
            self.assertEqual(len(loaded), len(model.layers) + 1)
            prompt = mx.array(tokenizer.encode(" jumps over", add_special_tokens=False))

            def tokens(mtp, file):
                cache = load_prompt_cache(file)
                if not mtp:
                    steps = generate_step(prompt, model, prompt_cache=cache)
                else:
                    steps = speculative_generate_step(
                        prompt, model, mtp=True, prompt_cache=cache, num_draft_tokens=2
                    )
                return [t for t, *_ in zip(range(24), steps)]

            self.assertEqual(tokens(True, files[True]), tokens(False, files[False]))
            # Without MTP the block's cache in the file is left out.
            self.assertEqual(tokens(False, files[True]), tokens(False, files[False]))
            # A file without the block's cache says so.
            with self.assertRaisesRegex(ValueError, "MTP entry"):
                tokens(True, files[False])

            def command(file, *extra):
                cmd = [sys.executable, "-m", "mlx_lm", "generate", "--model", str(path)]
                cmd += ["--prompt-cache-file", file, "--prompt", " jumps over"]
                cmd += ["--max-tokens", "16", "--ignore-chat-template", *extra]
                return subprocess.run(cmd, capture_output=True, text=True, timeout=300)

            runs = [
                command(files[False]),
                command(files[True], "--mtp"),
                command(files[True]),
            ]
            for run in runs:
                self.assertEqual(run.returncode, 0, run.stderr)
            texts = [run.stdout.split("==========")[1] for run in runs]
            self.assertEqual(texts[1:], texts[:1] * 2)
            run = command(files[False], "--mtp")
            self.assertNotEqual(run.returncode, 0)
            self.assertIn("mlx_lm.cache_prompt --mtp", run.stderr)

    def test_convert_keeps_the_block(self):
        # mlx_lm.convert (and -q) writes the block with the model; it loads
        # where asked for and drafts, with mlx_lm.generate --mtp too.
        from mlx_lm.convert import convert

        prompt = "The quick brown fox"
        with tempfile.TemporaryDirectory() as tmp:
            path = make_tiny_model_folder(Path(tmp) / "mtp", MTP_CONFIG)
            source, _ = load(str(path), model_config=WITH_MTP)
            for name, quantize in (("converted", False), ("converted-q", True)):
                out = Path(tmp) / name
                with contextlib.redirect_stdout(io.StringIO()):
                    convert(str(path), mlx_path=str(out), quantize=quantize)
                with open(out / "config.json") as f:
                    self.assertNotIn("mtp", json.load(f))
                self.assertEqual(load(str(out))[0].mtp, [])
                model, tokenizer = load(str(out), model_config=WITH_MTP)
                self.assertEqual(len(model.mtp), 1)
                if quantize:
                    # The tiny block's one projection of 64-column groups.
                    self.assertEqual(model.mtp[0].attn.wo_a.bits, 4)
                else:
                    got = dict(tree_flatten(model.mtp[0].parameters()))
                    want = dict(tree_flatten(source.mtp[0].parameters()))
                    self.assertEqual(got.keys(), want.keys())
                    for k, v in got.items():
                        self.assertTrue(mx.array_equal(v, want[k]), k)
                texts = []
                with mock.patch.object(
                    model, "mtp_draft", wraps=model.mtp_draft
                ) as draft:
                    for mtp in (False, True):
                        steps = stream_generate(
                            model, tokenizer, prompt, max_tokens=20, mtp=mtp
                        )
                        texts.append("".join(r.text for r in steps))
                self.assertGreater(draft.call_count, 10)
                self.assertEqual(texts[0], texts[1])

            cmd = [sys.executable, "-m", "mlx_lm", "generate", "--model", str(out)]
            cmd += ["--prompt", prompt, "--max-tokens", "20", "--ignore-chat-template"]
            run = subprocess.run(
                cmd + ["--mtp"], capture_output=True, text=True, timeout=300
            )
            self.assertEqual(run.returncode, 0, run.stderr)
            raw = tokenizer.encode(prompt, add_special_tokens=True)
            steps = stream_generate(model, tokenizer, raw, max_tokens=20)
            self.assertIn("".join(r.text for r in steps), run.stdout)

    def test_server_gives_the_plain_text_through_its_prompt_cache(self):
        # The same prompt again and a longer one: the server's prompt cache
        # hands the block's cache back in step, and holds every token given
        # (a draft model's too).
        prompts = ["The quick brown fox"] * 2 + ["The quick brown fox jumps"]
        with tempfile.TemporaryDirectory() as tmp:
            path = make_tiny_model_folder(Path(tmp) / "mtp", MTP_CONFIG)
            draft = make_tiny_model_folder(Path(tmp) / "draft", seed=1)
            texts = []
            for args in (
                (),
                ("--mtp", "--num-draft-tokens", "3"),
                ("--draft-model", str(draft)),
            ):
                thread = ServerThread(path, *args)
                try:
                    for prompt in prompts + prompts[:1]:
                        body = {"prompt": prompt, "max_tokens": 16, "temperature": 0}
                        status, answer = thread.request("POST", "/v1/completions", body)
                        self.assertEqual(status, 200, answer)
                        texts.append(answer["choices"][0]["text"])
                finally:
                    thread.close()
        self.assertEqual(texts[:4], texts[4:8])
        self.assertEqual(texts[:4], texts[8:])


class BatchOracle:
    """``Oracle`` for a ``BatchGenerator``'s rows: where the block runs on a
    batch's cache, row b drafts its request's tokens (``add``), wrongly
    after every ``every``-th position; ``checked`` gets, for each row's input
    that is the target's stream, whether the block's logits are those of one
    forward over the whole sequence, and ``read`` each request's positions
    so read."""

    def __init__(self, model, every=5):
        self.model, self.every = model, every
        self.generator, self.checked, self.read = None, [], {}
        self.sequences, self.references = {}, {}

    @classmethod
    def of(cls, model, **kwargs):
        """A BatchGenerator with MTP on the oracle of model."""
        oracle = cls(model)
        oracle.generator = BatchGenerator(oracle, mtp=True, **kwargs)
        return oracle.generator

    def add(self, uid, tokens):
        """Request uid's whole sequence (prompt and output)."""
        model, tokens = self.model, mx.array(tokens)
        _, hidden = model(tokens[None, :-1], return_hidden=True)
        block = model.mtp_draft(hidden, tokens[None, 1:], model.make_mtp_cache())
        mx.eval(hidden, block[0])
        self.sequences[uid] = tokens
        self.references[uid] = (hidden, block[0][0])

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def make_drafter(self):
        # The MTP block's drafter of this model, not of the wrapped one.
        return MTPDrafter(self)

    def _rows(self, cache):
        for batch in (self.generator._generation_batch, self.generator._prompt_batch):
            if batch.prompt_cache and batch.prompt_cache[-1].cache is cache:
                return batch.uids
        return None

    def mtp_draft(self, h, inputs, cache):
        c = cache[0]
        uids = None if self.generator is None else self._rows(c)
        if uids is None:
            return self.model.mtp_draft(h, inputs, cache)
        L = inputs.shape[1]
        starts = [min(s, L) for s in c._skip]
        lengths = [L - s for s in starts] if c._lengths is None else c._lengths
        offsets = [o - s for o, s in zip(c.offsets, starts)]
        logits, out = self.model.mtp_draft(h, inputs, cache)
        guesses = []
        for b, uid in enumerate(uids):
            tokens = self.sequences[uid].tolist()
            hidden, reference = self.references[uid]
            row = []
            for j in range(L):
                pos = offsets[b] + j
                right = tokens[pos + 2] if 0 <= pos < len(tokens) - 2 else 0
                right = right if pos % self.every else (right + 1) % 300
                row.append(right)
                if not (starts[b] <= j < starts[b] + lengths[b]):
                    continue
                if pos < hidden.shape[1] and mx.allclose(
                    h[b, j], hidden[0, pos], atol=1e-3
                ):
                    ref = reference[pos]
                    self.checked.append(mx.allclose(logits[b, j], ref, atol=1e-4))
                    self.read.setdefault(uid, []).append(pos)
            guesses.append(row)
        guess = mx.arange(logits.shape[-1]) == mx.array(guesses)[..., None]
        # Still through the block's logits, which evaluate its cache.
        return mx.where(guess, 10.0, -10.0) + 0.0 * logits, out


class TestMTPBatch(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.model = make_tiny_model(MTP_CONFIG)
        mx.random.seed(4)
        lengths = {"a": 37, "b": 21, "c": 50, "d": 1}
        cls.prompts = {
            k: mx.random.randint(2, 300, (n,)).tolist() for k, n in lengths.items()
        }
        cls.expected = {k: cls.alone(p, 40) for k, p in cls.prompts.items()}

    @classmethod
    def alone(cls, prompt, max_tokens):
        steps = generate_step(
            mx.array(prompt), cls.model, max_tokens=max_tokens, prefill_step_size=16
        )
        return [(int(t), lp) for t, lp in steps]

    def decode(self, inserts, oracle=False, num_draft_tokens=2, **kwargs):
        """Run a BatchGenerator with MTP that gets the requests of
        inserts[n] (a name and max_tokens) before its round n. Return each
        name's responses, the tokens each got in each round, and the
        largest cache graph."""
        kwargs.update(
            num_draft_tokens=num_draft_tokens, prefill_step_size=16, stop_tokens=set()
        )
        if oracle:
            generator = BatchOracle.of(self.model, **kwargs)
        else:
            generator = BatchGenerator(self.model, mtp=True, **kwargs)
        model = generator.model
        names, results, rounds, worst = {}, {}, [], 0
        step = before = 0
        while True:
            for name, max_tokens in inserts.get(step, []):
                prompt = self.prompts[name]
                (uid,) = generator.insert([prompt], max_tokens=[max_tokens])
                names[uid], results[name] = name, []
                if oracle:
                    model.add(uid, prompt + [t for t, _ in self.expected[name]])
            responses = generator.next_generated()
            if not responses and step > max(inserts):
                break
            counts = {}
            for r in responses:
                results[names[r.uid]].append(r)
                counts[names[r.uid]] = counts.get(names[r.uid], 0) + 1
            rounds.append(counts)
            batch = generator._generation_batch
            # The step rows join also carries their prompts' block prefill and
            # the merge into the batch (left lazy, evaluated with that step):
            # measured from the step after on.
            joined, before = len(batch) > before, len(batch)
            if batch.prompt_cache and not joined:
                worst = max(worst, max_cache_graph(batch.prompt_cache[:-1]))
                mtp_cache = batch.prompt_cache[-1]
                worst = max(worst, max_cache_graph([mtp_cache.cache]))
                worst = max(worst, graph_edges(mtp_cache.hidden))
            step += 1
        generator.close()
        self.checked = model.checked if oracle else []
        self.read = {names[u]: p for u, p in model.read.items()} if oracle else {}
        return results, rounds, worst

    def assertAlone(self, results, max_tokens):
        for name, responses in results.items():
            with self.subTest(request=name):
                expected = self.expected[name][: max_tokens[name]]
                self.assertEqual([r.token for r in responses], [t for t, _ in expected])
                for r, (_, logprobs) in zip(responses, expected):
                    self.assertTrue(mx.allclose(r.logprobs, logprobs, atol=1e-5))
                reasons = [r.finish_reason for r in responses]
                self.assertEqual(reasons, [None] * (len(reasons) - 1) + ["length"])

    def test_a_drafter_given_to_the_generator(self):
        # BatchGenerator(drafter=...) is the batch loop for any drafter.
        generator = BatchGenerator(
            self.model,
            drafter=MTPDrafter(self.model),
            num_draft_tokens=2,
            stop_tokens=set(),
        )
        (uid,) = generator.insert([self.prompts["a"]], max_tokens=[30])
        got = []
        while responses := generator.next_generated():
            got += [r for r in responses if r.uid == uid]
        generator.close()
        self.assertAlone({"a": got}, {"a": 30})
        self.assertIsInstance(generator._generation_batch, SpeculativeGenerationBatch)

    def test_rows_accept_their_own_counts(self):
        max_tokens = {"a": 40, "b": 33, "c": 37}
        results, rounds, worst = self.decode(
            {0: list(max_tokens.items())}, oracle=True, num_draft_tokens=3
        )
        self.assertAlone(results, max_tokens)
        self.assertLessEqual(worst, GRAPH_BOUND)
        # Rounds where the rows got different numbers of tokens, none past
        # its drafts and the target's token.
        full = [r for r in rounds[1:] if len(r) == 3]
        self.assertTrue(any(len(set(r.values())) > 1 for r in full), rounds)
        self.assertLessEqual(max(n for r in rounds for n in r.values()), 4)
        self.assertLess(len(rounds), 25)
        # Every read of the target's streams, prompt and rounds, exact.
        self.assertGreater(len(self.checked), 100)
        self.assertTrue(all(self.checked))
        self.assertReadOnce(results, 3)

    def assertReadOnce(self, results, num_draft_tokens):
        """The block read each row's positions, each once, with the target's
        streams in step (the oracle's checks), up to the last round's."""
        for name, responses in results.items():
            with self.subTest(request=name):
                # A row's first step runs while its batch is being made, where
                # the oracle cannot name its rows: the prompt's last two
                # positions (the one the prompt's block read left, then the
                # step's own).
                read, last = self.read[name], len(self.prompts[name]) - 2
                first = (last, last + 1)
                every = [p for p in range(len(read) + 2) if p not in first]
                self.assertEqual(sorted(read), every[: len(read)])
                total = len(self.prompts[name]) + len(responses)
                self.assertGreaterEqual(len(read), total - num_draft_tokens - 2)

    def test_requests_joining_mid_decode(self):
        inserts = {0: [("a", 40)], 4: [("b", 30)], 7: [("d", 20), ("c", 24)]}
        results, rounds, _ = self.decode(inserts, oracle=True, num_draft_tokens=2)
        self.assertAlone(results, {"a": 40, "b": 30, "c": 24, "d": 20})
        self.assertTrue(any(len(r) == 4 for r in rounds), rounds)
        self.assertTrue(all(self.checked))
        self.assertReadOnce(results, 2)

    def test_finished_rows_prompt_cache_continues_in_step(self):
        # Rows end inside rounds (at max_tokens, with drafts accepted past
        # it): each one's cache holds the tokens given that the target has
        # seen (all_tokens), the block in step, for the single-request loop
        # to continue.
        max_tokens = {"a": 13, "b": 15, "c": 40}
        results, _, _ = self.decode({0: list(max_tokens.items())}, oracle=True)
        self.assertAlone(results, max_tokens)
        unseen = set()
        for name in "abc":
            with self.subTest(request=name):
                unseen.add(self.assertContinues(self.prompts[name], results[name]))
        # Every token given is in the cache, as after plain decoding.
        self.assertEqual(unseen, {0})

    def assertContinues(self, prompt, responses):
        """Continue a finished row's prompt cache; return how many of the
        tokens given it lacks."""
        cache, cached = responses[-1].prompt_cache, responses[-1].all_tokens
        tokens = prompt + [r.token for r in responses]
        self.assertEqual(cached, tokens[: len(cached)])
        self.assertEqual(cache[0].size(), len(cached))
        self.assertEqual(cache[-1].cache.size(), len(cached) - 1)
        # Tokens after which no query's top-k entries tie: at [9, 4, 77] row
        # b's position 39 has CSA entries 1 and 3 at 1e-6 of each other for
        # its eighth pick, and which one the rounding picks differs between
        # equal computations (the widened attention and sdpa).
        rest = [9, 4, 78]
        full = tokens + rest
        expected = [t for t, _ in self.alone(full, 12)]
        full = mx.array(full + expected)
        checked = []
        oracle = Oracle(self.model, full, block_checker(self.model, full, checked))
        steps = speculative_generate_step(
            mx.array(tokens[len(cached) :] + rest),
            oracle,
            mtp=True,
            num_draft_tokens=3,
            prompt_cache=cache,
            max_tokens=12,
        )
        self.assertEqual([s[0] for s in steps], expected)
        self.assertGreater(len(checked), 3)
        self.assertTrue(all(checked))
        return len(tokens) - len(cached)

    def test_a_row_stops_at_its_stop_token(self):
        # Token 7 is the second of the four the oracle gets the row in its
        # fourth round: the row stops there, its drafts after it dropped.
        stop = self.expected["a"][7][0]
        end = [t for t, _ in self.expected["a"]].index(stop)
        self.assertEqual(end, 7)
        generator = BatchOracle.of(self.model, num_draft_tokens=3, stop_tokens=[[stop]])
        uids = generator.insert(
            [self.prompts["a"], self.prompts["b"]], max_tokens=[40, 20]
        )
        for uid, name in zip(uids, "ab"):
            full = self.prompts[name] + [t for t, _ in self.expected[name]]
            generator.model.add(uid, full)
        got = {u: [] for u in uids}
        while responses := generator.next_generated():
            for r in responses:
                got[r.uid].append(r)
        tokens = [t for t, _ in self.expected["a"][: end + 1]]
        self.assertEqual([r.token for r in got[uids[0]]], tokens)
        reasons = [r.finish_reason for r in got[uids[0]]]
        self.assertEqual(reasons, [None] * end + ["stop"])
        self.assertEqual(len(got[uids[1]]), 20)
        # Its cache holds the stop token, the block in step.
        self.assertEqual(self.assertContinues(self.prompts["a"], got[uids[0]]), 0)

    def test_cache_graphs_stay_bounded(self):
        # A CSA and an HCA layer, and a CSA block.
        config = {**MTP_CONFIG, "num_hidden_layers": 2, "layer_types": None}
        config.update(compress_ratios=[4, 16, 4], mlp_layer_types=["moe"] * 2)
        model, self.model = self.model, make_tiny_model(config)
        try:
            _, rounds, worst = self.decode(
                {0: [("a", 300), ("b", 250)], 20: [("d", 200)]}
            )
        finally:
            self.model = model
        self.assertGreater(len(rounds), 150)
        self.assertLessEqual(worst, GRAPH_BOUND)

    def test_sampled_rows_follow_the_target_distribution(self):
        # TestMTPSpeculative's check, on 600 rows of one batch.
        model, prompt, expected = second_token_marginal()
        mx.random.seed(5)
        runs, counts, drafted = 600, [0] * 8, 0
        generator = BatchGenerator(
            model,
            mtp=True,
            num_draft_tokens=2,
            sampler=make_sampler(temp=1.0),
            stop_tokens=set(),
            completion_batch_size=runs,
            prefill_batch_size=runs,
        )
        generator.insert([prompt.tolist()] * runs, max_tokens=[2] * runs)
        got, rounds = {}, 0
        while responses := generator.next_generated():
            for r in responses:
                got.setdefault(r.uid, []).append(r.token)
            rounds += 1
            # Both tokens in the first round: the second was a draft.
            if rounds == 1:
                drafted = sum(len(t) == 2 for t in got.values())
        self.assertEqual(len(got), runs)
        for tokens in got.values():
            counts[tokens[1]] += 1
        assert_follows(self, counts, expected)
        self.assertGreater(drafted, runs // 4)

    def test_logits_processors_see_each_rows_history(self):
        # A processor that depends on the history: rows with it give what
        # plain decoding with it gives, drafts accepted (oracle) or not.
        def penalty(tokens, logits):
            seen = mx.zeros((300,)).at[tokens].add(1.0)
            return logits - 3.0 * seen

        expected = {
            k: [
                int(t)
                for t, _ in generate_step(
                    mx.array(self.prompts[k]),
                    self.model,
                    max_tokens=30,
                    logits_processors=[penalty],
                )
            ]
            for k in "ab"
        }
        self.assertNotEqual(expected["a"], [t for t, _ in self.expected["a"][:30]])
        for oracle in (False, True):
            with self.subTest(oracle=oracle):
                kwargs = {"num_draft_tokens": 3, "stop_tokens": set()}
                if oracle:
                    generator = BatchOracle.of(self.model, **kwargs)
                else:
                    generator = BatchGenerator(self.model, mtp=True, **kwargs)
                uids = generator.insert(
                    [self.prompts[k] for k in "abc"],
                    max_tokens=[30] * 3,
                    logits_processors=[[penalty], [penalty], []],
                )
                if oracle:
                    c = [t for t, _ in self.expected["c"]]
                    for uid, tokens in zip(uids, (expected["a"], expected["b"], c)):
                        generator.model.add(uid, self.prompts["abc"[uid]] + tokens)
                got = {u: [] for u in uids}
                rounds = 0
                while responses := generator.next_generated():
                    rounds += 1
                    for r in responses:
                        got[r.uid].append(r.token)
                self.assertEqual(got[uids[0]], expected["a"])
                self.assertEqual(got[uids[1]], expected["b"])
                c = [t for t, _ in self.expected["c"][:30]]
                self.assertEqual(got[uids[2]], c)
                if oracle:
                    self.assertLess(rounds, 20)

    def test_rows_with_their_own_samplers(self):
        # A greedy row beside rows sampled by rejection with their own
        # filters: each keeps to its own.
        mx.random.seed(7)
        generator = BatchGenerator(
            self.model, mtp=True, num_draft_tokens=2, stop_tokens=set()
        )
        samplers = [make_sampler(temp=1.5, top_k=2), None, make_sampler(top_k=3)]
        uids = generator.insert(
            [self.prompts[k] for k in "abc"], max_tokens=[30] * 3, samplers=samplers
        )
        got = {u: [] for u in uids}
        while responses := generator.next_generated():
            for r in responses:
                got[r.uid].append(r)
        self.assertAlone({"b": got[uids[1]]}, {"b": 30})
        for uid, k in ((uids[0], 2), (uids[2], 3)):
            self.assertEqual(len(got[uid]), 30)
            for r in got[uid]:
                self.assertIn(r.token, mx.argsort(-r.logprobs)[:k].tolist())

    def test_sampled_rows_keep_to_the_sampler_filters(self):
        sampler = make_sampler(temp=1.5, top_k=2)
        mx.random.seed(6)
        max_tokens = {"a": 30, "b": 30, "c": 30}
        results, _, _ = self.decode(
            {0: list(max_tokens.items())}, num_draft_tokens=3, sampler=sampler
        )
        for responses in results.values():
            self.assertEqual(len(responses), 30)
            for r in responses:
                self.assertIn(r.token, mx.argsort(-r.logprobs)[:2].tolist())


if __name__ == "__main__":
    unittest.main()
