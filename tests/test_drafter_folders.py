# Copyright © 2026 Apple Inc.

"""``--mtp PATH`` / ``load_drafter``: a drafter split out of its checkpoint
(mlx-vlm's ``deepseek_v4_mtp`` and ``deepseek_v4_dspark`` layouts) beside a
tiny target folder without ``mtp.*``. Each folder is written here from a
tiny model with the block, under the layout's names and config; the same
model with the block in place is the reference."""

import contextlib
import io
import json
import re
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten
from test_deepseek_v4_trim import ServerThread

from mlx_lm.generate import generate_step, load_drafter
from mlx_lm.generate import main as generate_main
from mlx_lm.generate import make_drafter, speculative_generate_step
from mlx_lm.models import deepseek_v4
from mlx_lm.utils import load

# Tiny; transformers' config (the tokenizer's load reads it) knows ratios 0,
# 4 and 128. The block's compress_ratios entries are window-only.
BASE = {
    "model_type": "deepseek_v4",
    "vocab_size": 300,
    "hidden_size": 32,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "head_dim": 32,
    "qk_rope_head_dim": 8,
    "q_lora_rank": 24,
    "o_groups": 2,
    "o_lora_rank": 16,
    "sliding_window": 8,
    "moe_intermediate_size": 16,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "index_n_heads": 8,
    "index_head_dim": 16,
    "index_topk": 8,
    "num_hash_layers": 1,
    "max_position_embeddings": 512,
    "num_nextn_predict_layers": 1,
}
MTP_CONFIG = {**BASE, "compress_ratios": [0, 4, 128, 4, 0]}
# 0731-shaped: three DSpark stages, num_nextn_predict_layers reading 1.
DSPARK_CONFIG = {
    **BASE,
    "compress_ratios": [0, 4, 128, 4, 0, 0, 0],
    "dspark_block_size": 5,
    "dspark_noise_token_id": 299,
    "dspark_target_layer_ids": [1, 2, 3],
    "dspark_markov_rank": 8,
}
PROMPT = mx.array([5, 17, 33, 2, 61, 40, 7, 7, 12, 50, 3, 28, 44, 19, 8] * 2)
MXFP4 = {"group_size": 32, "bits": 4, "mode": "mxfp4"}
MXFP8 = {"group_size": 32, "bits": 8, "mode": "mxfp8"}


def make_model(config, seed=0):
    """The target with its block, every float parameter random."""
    mx.random.seed(seed)
    model = deepseek_v4.Model(deepseek_v4.ModelArgs.from_dict({**config, "mtp": True}))
    params = []
    for name, value in tree_flatten(model.parameters()):
        if mx.issubdtype(value.dtype, mx.floating):
            noise = mx.random.normal(value.shape)
            if value.ndim >= 2:
                value = noise * value.shape[-1] ** -0.5
                value = 4 * value if ".markov_head." in name else value
            elif name.endswith(("norm.weight", ".scale")):
                value = 1 + 0.2 * noise
            else:
                value = 0.5 * noise
        params.append((name, value))
    model.update(tree_unflatten(params))
    # Zero logits for BOS and EOS, so greedy decoding runs to the limit.
    model.lm_head.weight[:2] = 0.0
    mx.eval(model.parameters())
    return model


def quantize_block(model):
    """The block quantized as DeepSeek releases it: experts mxfp4, attention
    and shared experts mxfp8 (where the input width allows)."""

    def predicate(path, module):
        if not hasattr(module, "to_quantized") or module.weight.shape[-1] % 32:
            return False
        if ".switch_mlp." in path:
            return MXFP4
        return MXFP8 if (".attn.w" in path or "shared_experts" in path) else False

    for name in ("mtp", "dspark"):
        for i, block in enumerate(getattr(model, name)):
            nn.quantize(
                block, class_predicate=lambda p, m: predicate(f"{name}.{i}.{p}", m)
            )


def write_tokenizer(path, vocab_size):
    from test_deepseek_v4 import SPECIAL_TOKENS as special_tokens
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 1,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(
        ["The quick brown fox jumps over the dog."] * 8, trainer
    )
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=special_tokens[0],
        eos_token=special_tokens[1],
    ).save_pretrained(path)


def write_target(path, model, config):
    """The target folder, as a conversion that dropped the block writes it."""
    path.mkdir(parents=True)
    weights = {
        k: v
        for k, v in tree_flatten(model.parameters())
        if not k.startswith(("mtp.", "dspark."))
    }
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    (path / "config.json").write_text(json.dumps(config))
    write_tokenizer(path, config["vocab_size"])
    return path


# mlx-vlm's names of the block's weights, from this model's.
_MTP_TOP = re.compile(r"mtp\.0\.((e_proj|h_proj|enorm|hnorm|hc_head|norm)\..+)")


def folder_name(name, stages):
    if name.startswith("mtp."):
        top = _MTP_TOP.fullmatch(name)
        return top[1] if top else "decoder." + name[len("mtp.0.") :]
    name = re.sub(r"^dspark\.(\d+)\.", r"stages.\1.", name)
    return name.replace(f"stages.{stages - 1}.markov_head.", "markov_head.")


def write_split(path, model, config):
    """The block's folder in mlx-vlm's split layout: the MTP block in one
    model.safetensors; DSpark one shard a stage with an index, its
    confidence head left out; the per-module quantization in its names."""
    path.mkdir(parents=True)
    dspark = bool(model.dspark)
    stages = len(model.dspark)
    shards, quantization = {}, {"group_size": 64, "bits": 8, "mode": "affine"}
    for name, value in tree_flatten(model.parameters()):
        if not name.startswith(("mtp.", "dspark.")) or ".confidence_head." in name:
            continue
        key = folder_name(name, stages)
        shard = int(key.split(".")[1]) if key.startswith("stages.") else stages - 1
        shards.setdefault(shard if dspark else 0, {})[key] = value
    for name, module in tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module):
        if name.startswith(("mtp.", "dspark.")) and hasattr(module, "bits"):
            key = folder_name(name + ".weight", stages).removesuffix(".weight")
            quantization[key] = {
                "group_size": module.group_size,
                "bits": module.bits,
                "mode": module.mode,
            }
    weight_map = {}
    for i, weights in sorted(shards.items()):
        file = (
            f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            if dspark
            else "model.safetensors"
        )
        mx.save_safetensors(str(path / file), weights, metadata={"format": "mlx"})
        weight_map.update({k: file for k in weights})
    if dspark:
        index = {"metadata": {}, "weight_map": weight_map}
        (path / "model.safetensors.index.json").write_text(json.dumps(index))
    out = {
        "model_type": "deepseek_v4_dspark" if dspark else "deepseek_v4_mtp",
        "text_config": config,
        "block_size": config["num_nextn_predict_layers"] + 1,
        "tie_word_embeddings": False,
    }
    if dspark:
        out.update(
            n_mtp_layers=stages,
            target_layer_ids=config["dspark_target_layer_ids"],
            mask_token_id=config["dspark_noise_token_id"],
            markov_rank=config["dspark_markov_rank"],
            block_size=config["dspark_block_size"] + 1,
        )
    if len(quantization) > 3:
        out["quantization"] = out["quantization_config"] = quantization
    (path / "config.json").write_text(json.dumps(out))
    return path


def drafting(model, max_tokens=24):
    """(token, from_draft) of mtp=True greedy decoding, and every draft."""
    drafter, drafts = make_drafter(model), []
    draft = drafter.draft

    def recording(*args, **kwargs):
        out = draft(*args, **kwargs)
        drafts.append(out[0].tolist())
        return out

    drafter.draft = recording
    steps = speculative_generate_step(
        PROMPT, model, drafter=drafter, num_draft_tokens=3, max_tokens=max_tokens
    )
    return [(int(t), f) for t, _, f in steps], drafts


def plain(model, max_tokens=24):
    steps = zip(range(max_tokens), generate_step(PROMPT, model))
    return [int(t) for _, (t, _) in steps]


class TestDrafterFolders(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        root = Path(cls.tmp.name)
        cls.folders = {}
        for kind, config in (("mtp", MTP_CONFIG), ("dspark", DSPARK_CONFIG)):
            for quantized in (False, True):
                model = make_model(config)
                if quantized:
                    quantize_block(model)
                name = f"{kind}-q" if quantized else kind
                cls.folders[name] = model, write_split(root / name, model, config)
            write_target(root / f"{kind}-target", model, config)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def target(self, kind):
        model, _ = load(str(Path(self.tmp.name) / f"{kind}-target"))
        self.assertEqual((model.mtp, model.dspark), ([], []))
        return model

    def assert_same_drafting(self, name):
        kind = name.split("-")[0]
        reference, folder = self.folders[name]
        model = load_drafter(self.target(kind), folder)
        self.assertEqual(len(model.dspark), 3 if kind == "dspark" else 0)
        self.assertEqual(len(model.mtp), 1 if kind == "mtp" else 0)
        quantized = [
            [
                k
                for k, m in tree_flatten(
                    blocks.leaf_modules(), is_leaf=nn.Module.is_module
                )
                if hasattr(m, "bits")
            ]
            for blocks in (model, reference)
        ]
        self.assertEqual(quantized[0], quantized[1])
        self.assertEqual(bool(quantized[0]), name.endswith("-q"))
        got, want = drafting(model), drafting(reference)
        # The same drafts as the block loaded in place, so the same accepted.
        self.assertEqual(got, want)
        self.assertEqual([t for t, _ in got[0]], plain(model))
        if kind == "dspark":
            # (The random MTP block's drafts are all rejected; its drafts
            # being the in-place block's is the check.)
            self.assertGreater(sum(f for _, f in got[0]), 0)

    def test_mtp_folder_drafts_as_the_block_in_place(self):
        self.assert_same_drafting("mtp")

    def test_dspark_folder_drafts_as_the_drafter_in_place(self):
        self.assert_same_drafting("dspark")

    def test_quantized_folders_load_quantized(self):
        for name in ("mtp-q", "dspark-q"):
            with self.subTest(name):
                self.assert_same_drafting(name)
                config = json.loads((self.folders[name][1] / "config.json").read_text())
                self.assertIn("quantization", config)

    def test_generate_with_mtp_path_equals_plain_decoding(self):
        root = Path(self.tmp.name)
        for kind in ("mtp", "dspark"):
            texts = []
            for extra in ([], ["--mtp", str(root / kind)]):
                argv = ["mlx_lm.generate", "--model", str(root / f"{kind}-target")]
                argv += ["--prompt", "The quick brown fox", "--max-tokens", "16"]
                argv += ["--ignore-chat-template", "--num-draft-tokens", "3"]
                with mock.patch.object(sys, "argv", argv + extra):
                    with contextlib.redirect_stdout(io.StringIO()) as out:
                        generate_main()
                texts.append(out.getvalue().split("==========")[1])
            self.assertEqual(texts[0], texts[1], kind)
            self.assertGreater(len(texts[0].strip()), 0)

    def test_a_target_without_its_drafter_names_mtp_path(self):
        # What --mtp loads of a checkpoint converted without its drafter.
        for kind in ("mtp", "dspark"):
            with self.subTest(kind):
                path = Path(self.tmp.name) / f"{kind}-target"
                model, _ = load(str(path), model_config={"mtp": True})
                with self.assertRaisesRegex(
                    ValueError, "--mtp PATH loads one from a drafter folder"
                ):
                    make_drafter(model)

    def broken(self, name, edit, message):
        """``edit`` a copy of folder ``name``'s weights (and config); the load
        fails in one line naming the key, leaving the target as it was."""
        kind = name.split("-")[0]
        _, source = self.folders[name]
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp)
            config = json.loads((source / "config.json").read_text())
            weights = {}
            for file in source.glob("*.safetensors"):
                weights.update(mx.load(str(file)))
            edit(weights, config)
            mx.save_safetensors(str(path / "model.safetensors"), weights)
            (path / "config.json").write_text(json.dumps(config))
            model = self.target(kind)
            args = dict(vars(model.args))
            with self.assertRaises(ValueError) as e:
                load_drafter(model, path)
        error = str(e.exception)
        self.assertNotIn("\n", error)
        self.assertIn(message, error)
        self.assertEqual((model.mtp, model.dspark), ([], []))
        self.assertEqual(vars(model.args), args)
        return error

    def test_bad_folders_say_which_key(self):
        def rename(old, new):
            return lambda w, c: w.__setitem__(new, w.pop(old))

        def reshape(key, shape):
            return lambda w, c: w.__setitem__(key, mx.zeros(shape))

        def retype(w, c):
            c.pop("model_type")
            for k in list(w):
                w["x." + k] = w.pop(k)

        cases = [
            ("mtp", rename("e_proj.weight", "e_proj2.weight"), "'e_proj2.weight'"),
            ("mtp", reshape("h_proj.weight", (32, 16)), "has shape (32, 16)"),
            ("mtp", retype, "fit neither"),
            ("mtp", lambda w, c: w.pop("decoder.ffn_norm.weight"), "mtp.0.ffn_norm"),
            (
                "dspark",
                reshape("stages.0.main_proj.weight", (32, 64)),
                "'stages.0.main_proj.weight' (dspark.0.main_proj.weight) has "
                "shape (32, 64), the target's config gives (32, 96)",
            ),
            (
                "dspark",
                rename("markov_head.markov_w1.weight", "markov.markov_w1.weight"),
                "'markov.markov_w1.weight' is not a name",
            ),
            (
                "dspark",
                lambda w, c: c.update(target_layer_ids=[0, 1, 2]),
                "dspark_target_layer_ids ([0, 1, 2]) is not the target",
            ),
            (
                "dspark-q",
                reshape("stages.1.ffn.switch_mlp.gate_proj.scales", (8, 16, 2)),
                "'stages.1.ffn.switch_mlp.gate_proj.scales'",
            ),
        ]
        for name, edit, message in cases:
            with self.subTest(message):
                self.broken(name, edit, message)


class TestDrafterFolderServer(unittest.TestCase):

    def test_server_serves_a_dspark_folder(self):
        body = {
            "messages": [{"role": "user", "content": "The quick brown fox"}],
            "max_tokens": 16,
            "temperature": 0,
        }
        with tempfile.TemporaryDirectory() as tmp:
            model = make_model(DSPARK_CONFIG)
            target = write_target(Path(tmp) / "target", model, DSPARK_CONFIG)
            folder = write_split(Path(tmp) / "dspark", model, DSPARK_CONFIG)
            answers = []
            for extra in ([], ["--mtp", str(folder), "--num-draft-tokens", "3"]):
                thread = ServerThread(target, *extra)
                try:
                    answers.append(thread.post("/v1/chat/completions", body))
                finally:
                    thread.close()
        for status, answer in answers:
            self.assertEqual(status, 200, answer)
        texts = [a["choices"][0]["message"] for _, a in answers]
        self.assertEqual(texts[0], texts[1])
        self.assertTrue(texts[0].get("content") or texts[0].get("reasoning"))


if __name__ == "__main__":
    unittest.main()
