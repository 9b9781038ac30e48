# Copyright © 2026 Apple Inc.

import copy
import json
import re
import tempfile
import unittest
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_map
from mlx_lm.utils import load_model, quantize_model, save_config, save_model
from test_deepseek_v4 import special_tokens

from mlx_lm.models import deepseek_v4
from mlx_lm.models.switch_layers import QuantizedSwitchLinear

try:
    import torch
    from safetensors.torch import save_file
    from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
except ImportError:
    torch = None

CONFIG = {
    "model_type": "deepseek_v4",
    "vocab_size": 64,
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "qk_rope_head_dim": 16,
    "q_lora_rank": 128,
    "o_groups": 2,
    "o_lora_rank": 64,
    "sliding_window": 8,
    "moe_intermediate_size": 64,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "scoring_func": "sqrtsoftplus",
    "routed_scaling_factor": 1.5,
    "swiglu_limit": 10.0,
    "hc_mult": 2,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "rms_norm_eps": 1e-6,
    "index_n_heads": 2,
    "index_head_dim": 32,
    "index_topk": 2,
    "compress_ratios": [0, 4, 128, 4, 0],
    "num_hash_layers": 1,
    "num_nextn_predict_layers": 1,
    "rope_theta": 10000.0,
    "compress_rope_theta": 160000.0,
    "rope_scaling": {
        "type": "yarn",
        "factor": 16,
        "original_max_position_embeddings": 64,
        "beta_fast": 32,
        "beta_slow": 1,
    },
    "max_position_embeddings": 1024,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "torch_dtype": "bfloat16",
}
FP8_CONFIG = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "scale_fmt": "ue8m0",
    "weight_block_size": [128, 128],
}
# The per-module quantization of the mlx-community conversions.
COMMUNITY_RULES = (
    (r"\.ffn\.switch_mlp\.", {"group_size": 32, "bits": 4, "mode": "mxfp4"}),
    (
        r"\.(ffn\.shared_experts\.|attn\.w|indexer\.wq)",
        {"group_size": 32, "bits": 8, "mode": "mxfp8"},
    ),
)
TOKENS = mx.array([[0, 5, 9, 17, 33, 2, 61, 40, 7, 7, 12, 50, 3, 28, 44, 19, 8, 1]])

# DeepSeek's release names, from this model's.
_RELEASE_NAMES = (
    (r"^model\.embed_tokens\.", "embed."),
    (r"^lm_head\.", "head."),
    (r"^model\.hc_head\.", "hc_head_"),
    (r"^model\.", ""),
    (r"\.(attn|ffn)_hc\.", r".hc_\1_"),
    (r"\.e_score_correction_bias$", ".bias"),
    (r"\.gate_proj\.", ".w1."),
    (r"\.down_proj\.", ".w2."),
    (r"\.up_proj\.", ".w3."),
)
# This model's names, from transformers' save_pretrained ones.
_TRANSFORMERS_NAMES = (
    (r"^head\.", "lm_head."),
    (r"\.hc_head\.hc_", ".hc_head."),
    (r"\.hc_(attn|ffn)_", r".\1_hc."),
    (r"\.attn\.norm\.", ".attn.kv_norm."),
    (r"\.gate\.bias$", ".gate.e_score_correction_bias"),
    (r"\.w1\.", ".gate_proj."),
    (r"\.w2\.", ".down_proj."),
    (r"\.w3\.", ".up_proj."),
)
_FP8 = re.compile(r".*\.(attn\.w\w+|indexer\.wq_b|shared_experts\.w\d)\.weight")
_FP4_VALUES = (0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6)
_FLOAT32 = re.compile(r".*(hc_|ape|attn_sink|\.bias$)")


def _random_weights(config, seed=0):
    """Random MLX-named weights for the tiny model, with usable magnitudes."""
    model = deepseek_v4.Model(deepseek_v4.ModelArgs.from_dict(config))
    rng = np.random.default_rng(seed)
    weights = {}
    for name, value in tree_flatten(model.parameters()):
        shape = value.shape
        if name.endswith("tid2eid"):
            rows = [rng.permutation(shape[1] + 2)[: shape[1]] for _ in range(shape[0])]
            weights[name] = mx.array(np.stack(rows) % config["n_routed_experts"])
            continue
        if "norm" in name:
            array = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith((".fn", ".base", "ape", "attn_sink", "bias")):
            array = 0.1 * rng.standard_normal(shape)
        elif name.endswith(".scale"):
            array = 0.5 + rng.random(shape)
        else:
            array = rng.standard_normal(shape) / np.sqrt(shape[-1])
            # Vary the magnitude between 128x128 blocks and between groups of
            # 32 in a row, so that the scales of a layer differ.
            *lead, rows, cols = shape
            tiles = rng.integers(-2, 3, (*lead, -(-rows // 128), -(-cols // 128)))
            tiles = tiles.repeat(128, -2)[..., :rows, :].repeat(128, -1)
            groups = rng.integers(-1, 2, (*lead, rows, -(-cols // 32)))
            exponent = tiles[..., :cols] + groups.repeat(32, -1)[..., :cols]
            array = array * 2.0**exponent
        weights[name] = mx.array(array.astype(np.float32))
    return weights


def _release_name(name):
    for old, new in _RELEASE_NAMES:
        name = re.sub(old, new, name)
    return name


def _fp8_blocks(w, block=128):
    """e4m3 values with one power-of-two scale per block x block tile."""
    rows, cols = w.shape
    grid = (-(-rows // block), -(-cols // block))
    padded = torch.zeros(grid[0] * block, grid[1] * block)
    padded[:rows, :cols] = w
    tiles = padded.reshape(grid[0], block, grid[1], block)
    amax = tiles.abs().amax(dim=(1, 3)).clamp(min=1e-12)
    scale = torch.exp2(torch.ceil(torch.log2(amax / 448)))
    q = (tiles / scale[:, None, :, None]).reshape(padded.shape)[:rows, :cols]
    return q.to(torch.float8_e4m3fn), scale.to(torch.float8_e8m0fnu)


def _fp4_rows(w):
    """e2m1 values packed two per byte (even element in the low nibble), with
    one power-of-two scale per row and 32 columns."""
    rows, cols = w.shape
    groups = w.reshape(rows, cols // 32, 32)
    amax = groups.abs().amax(-1).clamp(min=1e-12)
    scale = torch.exp2(torch.ceil(torch.log2(amax / 6)))
    values = torch.tensor(_FP4_VALUES)
    scaled = (groups / scale[..., None]).reshape(rows, cols)
    index = (scaled[..., None] - values).abs().argmin(-1).to(torch.uint8)
    packed = index[:, 0::2] | (index[:, 1::2] << 4)
    return packed.view(torch.int8), scale.to(torch.float8_e8m0fnu)


def _release_tensors(weights, expert_dtype="fp4"):
    """The tiny model in DeepSeek's release format and dtypes."""
    tensors = {}
    for name, value in weights.items():
        array = torch.from_numpy(np.array(value))
        if name.endswith(".attn.wo_a.weight"):
            array = array.reshape(-1, array.shape[-1])
        key = _release_name(name)
        if ".switch_mlp." in name:
            for e in range(array.shape[0]):
                expert = key.replace(".switch_mlp.", f".experts.{e}.")
                if expert_dtype == "fp4":
                    q, s = _fp4_rows(array[e])
                else:
                    q, s = _fp8_blocks(array[e])
                tensors[expert] = q
                tensors[expert.replace(".weight", ".scale")] = s
        elif _FP8.fullmatch(key):
            q, s = _fp8_blocks(array)
            tensors[key] = q
            tensors[key.replace(".weight", ".scale")] = s
        elif key.endswith("tid2eid"):
            tensors[key] = array.to(torch.int64)
        elif _FLOAT32.fullmatch(key):
            tensors[key] = array
        else:
            tensors[key] = array.to(torch.bfloat16)
    # The MTP block, dropped at load.
    tensors["mtp.0.emb.tok_emb.weight"] = torch.zeros(4, 4, dtype=torch.bfloat16)
    tensors["mtp.0.attn.wq_a.scale"] = torch.ones(1, 1).to(torch.float8_e8m0fnu)
    return tensors


def _dequantized(tensors):
    """Dequantize the fp8 and fp4 weights with transformers' own definitions."""
    out = {}
    for key, value in tensors.items():
        scale = tensors.get(key.replace(".weight", ".scale"))
        if key.endswith(".scale") and key.replace(".scale", ".weight") in tensors:
            continue
        if not key.endswith(".weight") or scale is None:
            out[key] = value
        elif value.dtype == torch.int8:
            rows, packed = value.shape
            blocks = value.view(torch.uint8).reshape(1, rows, packed // 16, 16)
            scales = scale.view(torch.uint8)[None]
            w = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
            out[key] = w[0].T.contiguous()
        else:
            out[key] = _dequantize_fp8_weight(value, scale, [128, 128], torch.float32)
    return out


def _write(path, tensors, config):
    path.mkdir(parents=True)
    keys = sorted(tensors)
    # Two shards, as released checkpoints are sharded.
    for i, part in enumerate((keys[: len(keys) // 2], keys[len(keys) // 2 :])):
        shard = {k: tensors[k].contiguous() for k in part}
        save_file(shard, str(path / f"model-0000{i + 1}-of-00002.safetensors"))
    with open(path / "config.json", "w") as f:
        json.dump(config, f)


def _write_tokenizer(path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    # The chat format's tokens first (BOS and EOS), then plain words.
    words = list(special_tokens)
    words += [f"t{i}" for i in range(len(words), CONFIG["vocab_size"])]
    vocab = {w: i for i, w in enumerate(words)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=words[-1]))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=words[0],
        eos_token=words[1],
        unk_token=words[-1],
    ).save_pretrained(path)


def _float32(model):
    """Cast the float parameters, so outputs compare in float32."""

    def cast(v):
        return v.astype(mx.float32) if mx.issubdtype(v.dtype, mx.floating) else v

    model.update(tree_map(cast, model.parameters()))
    return model


def _quantized_layers(model):
    return {
        name: module.mode
        for name, module in model.named_modules()
        if isinstance(module, (nn.QuantizedLinear, QuantizedSwitchLinear))
    }


def _community_predicate(path, module):
    for pattern, params in COMMUNITY_RULES:
        if re.search(pattern, path):
            return params
    return {"group_size": 64, "bits": 8, "mode": "affine"}


class TestScaleLayout(unittest.TestCase):
    def test_float_power_of_two_scales_equal_ue8m0(self):
        weight = mx.random.randint(0, 120, (200, 320)).astype(mx.uint8)
        exponents = mx.random.randint(120, 130, (2, 3)).astype(mx.uint8)
        scales = mx.power(2.0, exponents.astype(mx.float32) - 127)
        packed, expected = deepseek_v4._repack(weight, exponents, (128, 128))
        _, got = deepseek_v4._repack(weight, scales, (128, 128))
        self.assertTrue(mx.array_equal(got, expected))
        self.assertEqual(packed.shape, (200, 80))
        # One scale per row and 32 columns, from the block that holds them.
        self.assertEqual(expected.shape, (200, 10))
        self.assertEqual(expected[130, 4].item(), exponents[1, 1].item())
        self.assertEqual(expected[127, 9].item(), exponents[0, 2].item())

        with self.assertRaisesRegex(ValueError, "powers of two"):
            deepseek_v4._repack(weight, scales * 1.5, (128, 128))
        with self.assertRaisesRegex(ValueError, r"\(2, 2\)"):
            deepseek_v4._repack(weight, exponents[:, :2], (128, 128))


class TestReleasedFormat(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.path = Path(cls.tmp.name)
        cls.weights = _random_weights(CONFIG)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def _write_release(self, name, expert_dtype="fp4", tag_experts=True):
        tensors = _release_tensors(self.weights, expert_dtype)
        config = dict(CONFIG, quantization_config=dict(FP8_CONFIG))
        if tag_experts:
            config["quantization_config"]["expert_dtype"] = expert_dtype
        _write(self.path / name, tensors, config)
        reference = dict(CONFIG)
        _write(self.path / f"{name}-dequantized", _dequantized(tensors), reference)
        return self.path / name, self.path / f"{name}-dequantized"

    def _check_against_dequantized(self, path, reference, expert_mode):
        model, _ = load_model(path)
        expected, _ = load_model(reference)

        modes = _quantized_layers(model)
        for layer in range(CONFIG["num_hidden_layers"]):
            prefix = f"model.layers.{layer}"
            names = ["wq_a", "wq_b", "wkv", "wo_a", "wo_b"]
            for name in names:
                self.assertEqual(modes.pop(f"{prefix}.attn.{name}"), "mxfp8")
            for proj in ("gate_proj", "up_proj", "down_proj"):
                name = f"{prefix}.ffn.shared_experts.{proj}"
                self.assertEqual(modes.pop(name), "mxfp8")
                name = f"{prefix}.ffn.switch_mlp.{proj}"
                self.assertEqual(modes.pop(name), expert_mode)
            if CONFIG["compress_ratios"][layer] == 4:
                self.assertEqual(modes.pop(f"{prefix}.attn.indexer.wq_b"), "mxfp8")
        # Every other layer (embeddings, head, compressors) stays as shipped.
        self.assertEqual(modes, {})

        # The packed weights are exactly transformers' dequantized ones.
        reference_weights = dict(tree_flatten(expected.parameters()))
        for name, module in model.named_modules():
            if not hasattr(module, "scales"):
                continue
            w = mx.dequantize(
                module.weight,
                module.scales,
                group_size=module.group_size,
                bits=module.bits,
                mode=module.mode,
                dtype=mx.float32,
            )
            self.assertTrue(mx.array_equal(w, reference_weights[f"{name}.weight"]))

        out = _float32(model)(TOKENS)
        ref = _float32(expected)(TOKENS)
        self.assertFalse(mx.any(mx.isnan(out)).item())
        self.assertTrue(mx.allclose(out, ref, rtol=1e-4, atol=1e-4))
        return model, expected

    @unittest.skipIf(torch is None, "needs torch, safetensors and transformers")
    def test_fp8_weights_and_fp4_experts_load_packed(self):
        path, reference = self._write_release("release")
        model, expected = self._check_against_dequantized(path, reference, "mxfp4")

        # Decoding (one token per step through the packed experts) too.
        caches = model.make_cache(), expected.make_cache()
        prompt = mx.tile(TOKENS, (1, 4))
        out, ref = model(prompt, caches[0]), expected(prompt, caches[1])
        for _ in range(16):
            token = mx.argmax(out[:, -1:], axis=-1)
            out, ref = model(token, caches[0]), expected(token, caches[1])
            self.assertTrue(mx.allclose(out, ref, rtol=1e-4, atol=1e-4))
        # The first V4-Flash config did not say the experts are fp4.
        path, reference = self._write_release("release-untagged", tag_experts=False)
        self._check_against_dequantized(path, reference, "mxfp4")

    @unittest.skipIf(torch is None, "needs torch, safetensors and transformers")
    def test_fp8_experts_load_packed(self):
        path, reference = self._write_release(
            "release-fp8", expert_dtype="fp8", tag_experts=False
        )
        self._check_against_dequantized(path, reference, "mxfp8")

    @unittest.skipIf(torch is None, "needs torch, safetensors and transformers")
    def test_convert_round_trip(self):
        from mlx_lm.convert import convert

        path, _ = self._write_release("convert-source")
        _write_tokenizer(path)
        source, config = load_model(path)
        expected = source(TOKENS)

        convert(str(path), mlx_path=str(self.path / "converted"))
        model, _ = load_model(self.path / "converted")
        self.assertEqual(_quantized_layers(model), _quantized_layers(source))
        self.assertTrue(mx.array_equal(model(TOKENS), expected))

        convert(str(path), mlx_path=str(self.path / "converted-q"), quantize=True)
        model, _ = load_model(self.path / "converted-q")
        source, _ = quantize_model(source, config, None, None)
        self.assertIn("lm_head", _quantized_layers(model))
        self.assertEqual(_quantized_layers(model), _quantized_layers(source))
        self.assertTrue(mx.array_equal(model(TOKENS), source(TOKENS)))

    @unittest.skipIf(torch is None, "needs torch, safetensors and transformers")
    def test_bad_release_weights_name_every_key(self):
        tensors = _release_tensors(self.weights)
        del tensors["layers.1.ffn.experts.3.w2.weight"]
        del tensors["layers.2.attn.wkv.scale"]
        tensors["layers.0.attn.wq_a.scale"] = tensors["layers.0.attn.wq_a.scale"][:, :1]
        config = dict(CONFIG, quantization_config=FP8_CONFIG)
        _write(self.path / "bad", tensors, config)
        # What sanitize cannot pack, then what the model cannot take.
        unknown = _release_tensors(self.weights)
        unknown["layers.0.attn.unknown.weight"] = torch.zeros(2, 2)
        unknown["layers.3.attn_norm.weight"] = torch.ones(255)
        _write(self.path / "unknown", unknown, config)

        for folder, keys in (
            (
                "bad",
                (
                    "layers.1.ffn.experts.0.w2.weight: parts missing [3]",
                    "layers.2.attn.wkv.weight: an fp8 or fp4 weight needs its scale",
                    "layers.0.attn.wq_a.weight: its scale has shape (1, 1)",
                ),
            ),
            (
                "unknown",
                (
                    "layers.0.attn.unknown.weight: no parameter",
                    "layers.3.attn_norm.weight: has shape (255,)",
                ),
            ),
        ):
            with self.assertRaises(ValueError) as e:
                load_model(self.path / folder)
            message = str(e.exception)
            for key in keys:
                self.assertIn(key, message)
            self.assertEqual(message.count("\n  "), len(keys))

        # Nothing is half loaded into a model either.
        model = deepseek_v4.Model(deepseek_v4.ModelArgs.from_dict(config))
        before = dict(tree_flatten(model.parameters()))
        weights = {}
        for shard in (self.path / "bad").glob("*.safetensors"):
            weights.update(mx.load(str(shard)))
        with self.assertRaises(ValueError):
            model.load_weights(list(model.sanitize(weights).items()))
        after = dict(tree_flatten(model.parameters()))
        self.assertTrue(all(after[k] is v for k, v in before.items()))


class TestTransformersLayout(unittest.TestCase):
    @unittest.skipIf(torch is None, "needs torch, safetensors and transformers")
    def test_save_pretrained_loads_every_tensor(self):
        from safetensors import safe_open
        from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

        config = {
            k: v
            for k, v in CONFIG.items()
            if k not in ("compress_ratios", "num_hash_layers", "rope_scaling")
        }
        config["layer_types"] = [
            "sliding_attention",
            "compressed_sparse_attention",
            "heavily_compressed_attention",
            "compressed_sparse_attention",
        ]
        config["compress_rates"] = {
            "compressed_sparse_attention": 4,
            "heavily_compressed_attention": 8,
        }
        config["mlp_layer_types"] = ["hash_moe", "moe", "moe", "moe"]
        torch.manual_seed(0)
        reference = DeepseekV4ForCausalLM(DeepseekV4Config(**config))
        for param in reference.parameters():
            torch.nn.init.normal_(param, std=0.05)
        with tempfile.TemporaryDirectory() as tmp:
            reference.save_pretrained(tmp)
            model, _ = load_model(Path(tmp))
            with safe_open(str(Path(tmp) / "model.safetensors"), "pt") as f:
                saved = {k: f.get_tensor(k) for k in f.keys()}

        # transformers writes DeepSeek's names under "model.", with a few of
        # its own (hc_head.hc_fn, attn.norm for kv_norm).
        self.assertIn("model.layers.0.attn.norm.weight", saved)
        self.assertIn("model.hc_head.hc_fn", saved)
        params = dict(tree_flatten(model.parameters()))
        unread = set(params)
        for key, value in saved.items():
            name, expert = key, None
            for old, new in _TRANSFORMERS_NAMES:
                name = re.sub(old, new, name)
            if match := re.fullmatch(r"(.+)\.experts\.(\d+)\.(.+)", name):
                name = f"{match[1]}.switch_mlp.{match[3]}"
                expert = int(match[2])
            loaded = params[name] if expert is None else params[name][expert]
            value = value.numpy().reshape(loaded.shape)
            self.assertTrue(np.array_equal(np.array(loaded), value), key)
            unread.discard(name)
        self.assertEqual(unread, set())


class TestMLXConversions(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.path = Path(cls.tmp.name)
        args = deepseek_v4.ModelArgs.from_dict(CONFIG)
        cls.model = deepseek_v4.Model(args)
        cls.model.load_weights(list(_random_weights(CONFIG).items()))
        cls.model, cls.config = quantize_model(
            cls.model, dict(CONFIG), 64, 8, quant_predicate=_community_predicate
        )
        cls.expected = cls.model(TOKENS)
        cls.weights = dict(tree_flatten(cls.model.parameters()))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def _save(self, name, weights, config):
        path = self.path / name
        path.mkdir()
        mx.save_safetensors(str(path / "model.safetensors"), weights)
        save_config(copy.deepcopy(config), path / "config.json")
        return path

    def test_community_conversion_loads(self):
        save_model(self.path / "community", self.model)
        save_config(copy.deepcopy(self.config), self.path / "community/config.json")
        model, _ = load_model(self.path / "community")
        modes = _quantized_layers(model)
        self.assertEqual(modes["model.layers.0.ffn.switch_mlp.up_proj"], "mxfp4")
        self.assertEqual(modes["model.layers.0.attn.wo_a"], "mxfp8")
        self.assertEqual(modes["model.layers.3.attn.indexer.wq_b"], "mxfp8")
        self.assertEqual(modes["lm_head"], "affine")
        self.assertTrue(mx.array_equal(model(TOKENS), self.expected))

    def test_early_upload_names_load(self):
        def early_name(name):
            name = name.replace("model.embed_tokens", "embed")
            name = name.replace("lm_head", "head")
            name = name.replace(".attn_hc.", ".hc_attn.")
            name = name.replace(".switch_mlp.gate_proj", ".experts.w1")
            name = name.replace(".switch_mlp.down_proj", ".experts.w2")
            return name.replace(".switch_mlp.up_proj", ".experts.w3")

        weights = {}
        for name, value in self.weights.items():
            if ".attn.wo_a." in name:
                for g in range(value.shape[0]):
                    weights[name.replace(".wo_a.", f".wo_a.{g}.")] = value[g]
            else:
                weights[early_name(name)] = value
        # Their per-layer quantization entries used the same names.
        config = copy.deepcopy(self.config)
        config["quantization"] = {
            early_name(k): v for k, v in config["quantization"].items()
        }
        path = self._save("early", weights, config)
        model, _ = load_model(path)
        self.assertEqual(_quantized_layers(model), _quantized_layers(self.model))
        self.assertTrue(mx.array_equal(model(TOKENS), self.expected))

    def test_unmappable_keys_are_named(self):
        weights = dict(self.weights)
        weights["model.layers.0.attn.wo_c.weight"] = mx.zeros((2, 2))
        weights["model.layers.1.ffn.experts.w4.weight"] = mx.zeros((2, 2))
        path = self._save("unmappable", weights, self.config)
        with self.assertRaises(ValueError) as e:
            load_model(path)
        message = str(e.exception)
        self.assertIn("model.layers.0.attn.wo_c.weight", message)
        self.assertIn("model.layers.1.ffn.experts.w4.weight", message)
        self.assertIn("Cannot load 2 ", message)

        weights = dict(self.weights)
        wo_a = weights.pop("model.layers.2.attn.wo_a.weight")
        weights["model.layers.2.attn.wo_a.0.weight"] = wo_a[0]
        path = self._save("parts", weights, self.config)
        with self.assertRaisesRegex(
            ValueError, "model.layers.2.attn.wo_a.0.weight: parts missing \\[1\\]"
        ):
            load_model(path)

    def test_invalid_config_names_the_field(self):
        cases = (
            ({"quantization": {"group_size": 64, "bits": 8, "mode": "fp7"}}, "mode"),
            (
                {
                    "quantization": {
                        "group_size": 64,
                        "bits": 8,
                        "model.layers.0.attn.wq_a": {
                            "group_size": 64,
                            "bits": 8,
                            "mode": "mxfp8",
                        },
                    }
                },
                "quantization.model.layers.0.attn.wq_a",
            ),
            ({"compress_ratios": [0, 4]}, "compress_ratios"),
        )
        for change, field in cases:
            config = dict(CONFIG, **change)
            path = self._save(f"config-{field}-{len(change)}", self.weights, config)
            with self.subTest(field=field):
                with self.assertRaises(ValueError) as e:
                    load_model(path)
                self.assertIn(field, str(e.exception))


if __name__ == "__main__":
    unittest.main()
