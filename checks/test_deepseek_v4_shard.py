# Copyright © 2026 Apple Inc.

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request
from pathlib import Path

import mlx.core as mx
from dsv4_fixtures import (
    GRAPH_BOUND,
    TINY_CONFIG,
    make_tiny_model,
    make_tiny_model_folder,
    max_diff,
)
from mlx.utils import tree_flatten

from mlx_lm import generate, load
from mlx_lm.models import deepseek_v4
from mlx_lm.models.deepseek_v4 import CSA, HCA, SLIDING

TESTS = Path(__file__).resolve().parent.parent / "tests"

# Sizes whose shards hold whole quantization groups, for the mxfp8 attention
# and mxfp4 experts of converted checkpoints.
CASES = {
    "float32": {},
    "mxfp": {"q_lora_rank": 32, "o_lora_rank": 32, "moe_intermediate_size": 64},
}

# Both ranks build the same model, run it whole, then shard it and run it
# again. The prompt wraps the window and closes CSA and HCA windows, and the
# decode steps close more.
SCRIPT = """
import json
import sys

import mlx.core as mx
import mlx.nn as nn

sys.path.insert(0, {tests!r})
from test_deepseek_v4 import TINY_CONFIG, make_tiny_model, max_diff

group = mx.distributed.init(strict=True, backend="ring")
mx.random.seed(1)
inputs = mx.random.randint(0, TINY_CONFIG["vocab_size"], (2, 52))


def mxfp(path, module):
    if not hasattr(module, "to_quantized"):
        return False
    if ".ffn." in path:
        return {{"group_size": 32, "bits": 4, "mode": "mxfp4"}}
    if path.endswith(("attn.wq_b", "attn.wo_a", "attn.wo_b")):
        return {{"group_size": 32, "bits": 8, "mode": "mxfp8"}}
    return False


def run(model):
    cache = model.make_cache()
    outs = [model(inputs[:, :40], cache)]
    for i in range(40, inputs.shape[1]):
        outs.append(model(inputs[:, i : i + 1], cache))
    return mx.concatenate(outs, axis=1)


results = {{}}
for name, overrides in json.loads({cases!r}).items():
    model = make_tiny_model({{**TINY_CONFIG, **overrides}})
    if name == "mxfp":
        nn.quantize(model, class_predicate=mxfp)
    expected = run(model)
    mx.eval(expected)
    model.shard(group)
    out = run(model)
    attn = model.layers[0].attn
    results[name] = {{
        "size": group.size(),
        "quantized": "Quantized" in type(attn.wo_b).__name__,
        "n_heads": attn.n_heads,
        "wq_b_rows": attn.wq_b.weight.shape[0],
        "expert_rows": model.layers[0].ffn.switch_mlp.gate_proj.weight.shape[1],
        "diff": max_diff(out, expected),
        "logits": out[:, -1].tolist(),
    }}
with open({{out}}.format(group.rank()), "w") as f:
    json.dump(results, f)
"""


# Each rank builds the same model and runs it whole, then keeps only its
# pipeline stage and runs it again: a prompt and decode steps one token at a
# time, a trim, a saved and loaded prompt cache, generate_step and a
# BatchGenerator whose second request joins mid-decode.
PIPELINE_SCRIPT = """
import json
import sys

import mlx.core as mx
from mlx.utils import tree_flatten

sys.path.insert(0, {checks!r})
from dsv4_fixtures import make_tiny_model, max_cache_graph, max_diff
from test_deepseek_v4_long import decode_alone, decode_batched

from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache, trim_prompt_cache

group = mx.distributed.init(strict=True, backend="ring")
prompt, steps = {prompt}, {steps}


def nbytes(module):
    return sum(v.nbytes for _, v in tree_flatten(module.parameters()))


def run(model, inputs, prompts, cache_file):
    # Every rank evaluates each forward in the same order, as generation does:
    # each forward's output waits on a collective of all ranks.
    def forward(tokens, cache):
        out = model(tokens, cache)
        mx.eval(out)
        return out

    cache = model.make_cache()
    logits = [forward(inputs[:, :prompt], cache)]
    graph = 0
    for i in range(prompt, inputs.shape[1]):
        logits.append(forward(inputs[:, i : i + 1], cache))
        graph = max(graph, max_cache_graph(cache))
    # The last 3 tokens again, after a trim and after a saved prompt cache.
    trimmed = trim_prompt_cache(cache, 3)
    logits.append(forward(inputs[:, -3:], cache))
    save_prompt_cache(cache_file, cache)
    cache = load_prompt_cache(cache_file)
    trim_prompt_cache(cache, 3)
    logits.append(forward(inputs[:, -3:], cache))
    tokens, logprobs = decode_alone(model, prompts["a"], steps)
    inserts = {{0: [("a", steps)], 5: [("c", steps // 2)]}}
    batched, widest, batch_graph = decode_batched(model, prompts, inserts)
    out = {{
        "logits": mx.concatenate(logits, axis=1),
        "logprobs": logprobs,
        "batch_logprobs": mx.concatenate([batched[k][1] for k in "ac"]),
        "tokens": tokens,
        "batch_tokens": [batched[k][0] for k in "ac"],
        "trimmed": trimmed,
        "widest": widest,
        "graph": max(graph, batch_graph),
        "caches": len(cache),
    }}
    mx.eval(out)
    return out


results = {{}}
for name, config in json.loads({cases!r}).items():
    mx.random.seed(1)
    inputs = mx.random.randint(2, config["vocab_size"], (2, prompt + steps))
    prompts = {{"a": inputs[0, :37].tolist(), "c": inputs[1, :21].tolist()}}
    cache_file = {{out}}.format(f"{{group.rank()}}-{{name}}") + ".safetensors"
    model = make_tiny_model(config)
    layer_nbytes = [nbytes(layer) for layer in model.layers]
    full_nbytes = nbytes(model)
    expected = run(model, inputs, prompts, cache_file)
    model.model.pipeline(group)
    got = run(model, inputs, prompts, cache_file)
    results[name] = {{
        "held": [i for i, layer in enumerate(model.model.layers) if layer is not None],
        "layer_nbytes": layer_nbytes,
        "full_nbytes": full_nbytes,
        "nbytes": nbytes(model),
        "diffs": {{
            k: max_diff(got[k], expected[k])
            for k in ("logits", "logprobs", "batch_logprobs")
        }},
        "expected": {{k: v for k, v in expected.items() if not isinstance(v, mx.array)}},
        **{{k: v for k, v in got.items() if not isinstance(v, mx.array)}},
    }}
with open({{out}}.format(group.rank()), "w") as f:
    json.dump(results, f)
"""


# sharded_load with a pipeline group loads only the rank's layers of a
# folder, and generate gives the text of the whole model.
LOAD_SCRIPT = """
import json

import mlx.core as mx
from mlx.utils import tree_flatten

from mlx_lm import generate, load
from mlx_lm.utils import sharded_load

group = mx.distributed.init(strict=True, backend="ring")
results = {{}}
for name, kwargs in (("one", {{}}), ("pipeline", {{"pipeline_group": group}})):
    if name == "one":
        model, tokenizer = load({path!r})
    else:
        model, tokenizer = sharded_load({path!r}, **kwargs)
    text = generate(model, tokenizer, "The quick brown fox", max_tokens={tokens})
    results[name] = {{
        "text": text,
        "nbytes": sum(v.nbytes for _, v in tree_flatten(model.parameters())),
        "layers": [i for i, l in enumerate(model.model.layers) if l is not None],
    }}
    del model
with open({{out}}.format(group.rank()), "w") as f:
    json.dump(results, f)
"""


# A pipeline drafts as one process does: the MTP block (an oracle that keeps
# many drafts) reads the last layer's streams, which the last stage holds;
# DSpark taps layers of both stages.
DRAFT_SCRIPT = """
import json
import sys

import mlx.core as mx

sys.path.insert(0, {tests!r})
from test_deepseek_v4_dspark import PROMPT as DSPARK_PROMPT
from test_deepseek_v4_dspark import make_model as make_dspark_model
from test_deepseek_v4_mtp import PROMPT, Oracle, make_model

from mlx_lm.generate import generate_step, speculative_generate_step

group = mx.distributed.init(strict=True, backend="ring")


def draft(model, prompt, k):
    blocks = []
    if isinstance(model, Oracle):
        # What the real block drafts from the streams it reads.
        model.check = lambda h, i, s, logits: blocks.append(
            logits.argmax(-1).tolist()
        )
    steps = speculative_generate_step(
        prompt, model, mtp=True, num_draft_tokens=k, max_tokens={tokens}
    )
    steps = [(int(t), bool(d)) for t, _, d in steps]
    return {{
        "tokens": [t for t, _ in steps],
        "accepted": sum(d for _, d in steps),
        "blocks": blocks,
    }}


results = {{}}
mtp = make_model()
dspark = make_dspark_model()
cases = (("mtp", mtp, PROMPT, 3), ("dspark", dspark, DSPARK_PROMPT, 4))
for name, model, prompt, k in cases:
    plain = [int(t) for t, _ in generate_step(prompt, model, max_tokens={tokens})]
    if name == "mtp":
        model = Oracle(model, [prompt.tolist() + plain])
    results[name] = {{"plain": plain, "one": draft(model, prompt, k)}}
mtp.model.pipeline(group)
dspark.model.pipeline(group)
for name, model, prompt, k in cases:
    if name == "mtp":
        model = Oracle(model, [prompt.tolist() + results[name]["plain"]])
    results[name]["pipeline"] = draft(model, prompt, k)
with open({{out}}.format(group.rank()), "w") as f:
    json.dump(results, f)
"""


def ring_command(test, ranks, *argv):
    """mlx.launch's command running this Python with argv on ranks processes
    of the ring backend on loopback; skips test where it cannot start."""
    bin_dir = os.path.dirname(sys.executable)
    launcher = shutil.which("mlx.launch", path=bin_dir) or shutil.which("mlx.launch")
    if launcher is None or not mx.distributed.is_available("ring"):
        test.skipTest("mlx.launch with the ring backend is not available")
    port = str(_free_ports(ranks))
    ring = ["-n", str(ranks), "--backend", "ring", "--starting-port", port]
    return [launcher, *ring, "--", sys.executable, *argv]


def _free_ports(n):
    """A port free now with the n - 1 after it (rank r listens on port + r)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            for p in range(port + 1, port + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise OSError(f"no {n} free ports in a row")


class FakeGroup:
    def __init__(self, rank, size):
        self._rank, self._size = rank, size

    def rank(self):
        return self._rank

    def size(self):
        return self._size


def launch(test, script, ranks, timeout=240):
    """Run script on ranks processes of mlx.launch's ring backend on loopback
    ({out} in it names each rank's JSON file) and return their results, or
    skip test where the launcher is not available."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank{}.json")
        path = Path(tmp) / "script.py"
        path.write_text(script.replace("{out}", repr(out)))
        command = ring_command(test, ranks, str(path))
        # Its own session, so that a rank left waiting is killed with it.
        run = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            _, stderr = run.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            _, stderr = run.communicate()
            test.fail(f"the ranks did not finish in {timeout} s:\n{stderr}")
        # The launcher exits 0 even when a rank fails: read the results.
        results = []
        for rank in range(ranks):
            path = Path(out.format(rank))
            if not path.exists():
                test.fail(f"rank {rank} wrote no result:\n{stderr}")
            results.append(json.loads(path.read_text()))
    return results


class TestDeepseekV4Shard(unittest.TestCase):
    def test_shard_names_the_field_that_does_not_divide(self):
        model = make_tiny_model()
        with self.assertRaisesRegex(ValueError, "`o_groups` 2") as e:
            model.shard(FakeGroup(0, 4))
        self.assertNotIn("num_attention_heads", str(e.exception))
        with self.assertRaisesRegex(
            ValueError,
            "`num_attention_heads` 4, `o_groups` 2, `moe_intermediate_size` 16",
        ):
            model.shard(FakeGroup(0, 3))

    def test_shard_on_one_rank_changes_nothing(self):
        model = make_tiny_model()
        inputs = mx.array([[3, 1, 4, 1, 5, 9, 2, 6]])
        expected = model(inputs)
        model.shard(mx.distributed.init())
        self.assertLessEqual(max_diff(model(inputs), expected), 1e-5)

    def test_two_ranks_match_the_whole_model(self):
        script = SCRIPT.format(tests=str(TESTS), cases=json.dumps(CASES))
        results = launch(self, script, 2)
        for name, overrides in CASES.items():
            args = deepseek_v4.ModelArgs.from_dict({**TINY_CONFIG, **overrides})
            rows = [r[name] for r in results]
            for rank, result in enumerate(rows):
                with self.subTest(name, rank=rank):
                    self.assertEqual(result["size"], 2)
                    self.assertEqual(result["quantized"], name == "mxfp")
                    self.assertEqual(result["n_heads"], args.num_attention_heads // 2)
                    self.assertEqual(
                        result["wq_b_rows"],
                        args.num_attention_heads * args.head_dim // 2,
                    )
                    self.assertEqual(
                        result["expert_rows"], args.moe_intermediate_size // 2
                    )
                    self.assertLessEqual(result["diff"], 1e-4)
            with self.subTest(name):
                self.assertEqual(rows[0]["logits"], rows[1]["logits"])


# DeepSeek-V4-Flash's released config: this model's defaults, and its
# schedule (the last ratio is the MTP block's).
FLASH_CONFIG = {
    "model_type": "deepseek_v4",
    "compress_ratios": [0, 0] + [4, 128] * 20 + [4, 0],
    "num_hash_layers": 3,
}

# DeepSeek-V4-Pro's released config (DeepSeek's schema, the fields this model
# reads): 61 layers, two HCA layers, then CSA and HCA in turn; the last ratio
# is the MTP block's.
PRO_CONFIG = {
    "model_type": "deepseek_v4",
    "vocab_size": 129280,
    "hidden_size": 7168,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 1,
    "head_dim": 512,
    "qk_rope_head_dim": 64,
    "q_lora_rank": 1536,
    "o_groups": 16,
    "o_lora_rank": 1024,
    "sliding_window": 128,
    "moe_intermediate_size": 3072,
    "n_routed_experts": 384,
    "n_shared_experts": 1,
    "num_experts_per_tok": 6,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sqrtsoftplus",
    "num_hash_layers": 3,
    "index_n_heads": 64,
    "index_head_dim": 128,
    "index_topk": 1024,
    "compress_ratios": [128, 128] + [4, 128] * 29 + [4, 0],
    "rope_theta": 10000,
    "compress_rope_theta": 160000,
    "rope_scaling": {
        "type": "yarn",
        "factor": 16,
        "original_max_position_embeddings": 65536,
        "beta_fast": 32,
        "beta_slow": 1,
    },
    "num_nextn_predict_layers": 1,
    "quantization_config": {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "scale_fmt": "ue8m0",
        "weight_block_size": [128, 128],
        "expert_dtype": "fp4",
    },
}

# A tiny model of Pro's shape: two HCA layers, then CSA and HCA in turn (and
# five layers, which no rank count here splits evenly).
TINY_PRO_CONFIG = {
    **TINY_CONFIG,
    "num_hidden_layers": 5,
    "layer_types": [HCA, HCA, CSA, HCA, CSA],
    "mlp_layer_types": ["hash_moe"] * 3 + ["moe"] * 2,
}

# A prompt past the window (32) whose decode steps wrap it twice and close
# 4 HCA (16) and 16 CSA (4) windows, beyond the top-k (8).
PIPELINE_PROMPT, PIPELINE_STEPS = 40, 64


def split(layers, size):
    """Each rank's layers under PipelineMixin's even split: rank 0 runs the
    last layers, and the low ranks take the extra ones."""
    base, extra = divmod(layers, size)
    counts = [base + (r < extra) for r in range(size)]
    return [list(range(sum(counts[r + 1 :]), sum(counts[r:]))) for r in range(size)]


def sharded_folder(path, config):
    """A tiny model folder with one weights file per layer, as sharded
    checkpoints come, and their index."""
    path = make_tiny_model_folder(path, config)
    weights = mx.load(str(path / "model.safetensors"))
    (path / "model.safetensors").unlink()
    files = {}
    for key, value in weights.items():
        match = re.search(r"\.layers\.(\d+)\.", key)
        name = f"model-{match.group(1) if match else 'rest'}.safetensors"
        files.setdefault(name, {})[key] = value
    for name, tensors in files.items():
        mx.save_safetensors(str(path / name), tensors)
    index = {k: f for f, tensors in files.items() for k in tensors}
    with open(path / "model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {}, "weight_map": index}, f)
    return path


class TestDeepseekV4Pipeline(unittest.TestCase):
    def test_pro_config_loads_in_both_schemas(self):
        ratios = PRO_CONFIG["compress_ratios"][:61]
        types = [SLIDING if not r else CSA if r == 4 else HCA for r in ratios]
        # transformers' schema of the same config.
        transformers = {
            k: v
            for k, v in PRO_CONFIG.items()
            if k not in ("compress_ratios", "num_hash_layers", "rope_scaling")
        }
        transformers.update(
            layer_types=types,
            compress_rates={CSA: 4, HCA: 128},
            mlp_layer_types=["hash_moe"] * 3 + ["moe"] * 58,
            rope_parameters={
                "main": {"rope_type": "default", "rope_theta": 10000},
                "compress": {
                    "rope_type": "yarn",
                    "rope_theta": 160000,
                    **PRO_CONFIG["rope_scaling"],
                },
            },
        )
        for schema, config in (
            ("deepseek", PRO_CONFIG),
            ("transformers", transformers),
        ):
            with self.subTest(schema):
                args = deepseek_v4.ModelArgs.from_dict(config)
                self.assertEqual(args.layer_types, types)
                self.assertEqual(types[:4], [HCA, HCA, CSA, HCA])
                self.assertEqual(args.compress_rates, {CSA: 4, HCA: 128})
                self.assertEqual(args.mlp_layer_types.count("hash_moe"), 3)
                self.assertEqual(args.compress_rope_theta, 160000)
                self.assertEqual(args.rope_scaling["factor"], 16)
                # Built lazily: the parameters are never allocated.
                mtp = deepseek_v4.ModelArgs.from_dict({**config, "mtp": True})
                params = tree_flatten(deepseek_v4.Model(mtp).parameters())
                total = sum(v.size for _, v in params)
                block = sum(v.size for k, v in params if k.startswith("mtp."))
                # 1.6T with the MTP block (one more layer), which loads only
                # where asked for.
                self.assertEqual(round(total / 1e9), 1599)
                self.assertEqual(round((total - block) / 1e9), 1573)
                model = deepseek_v4.Model(args)
                plain = sum(v.size for _, v in tree_flatten(model.parameters()))
                self.assertEqual(plain, total - block)
                self.assertEqual(len(model.make_cache()), 61)
        flash = deepseek_v4.Model(deepseek_v4.ModelArgs.from_dict(FLASH_CONFIG))
        total = sum(v.size for _, v in tree_flatten(flash.parameters()))
        self.assertEqual(round(total / 1e9), 284)

    def test_pipeline_keeps_only_the_stage_layers_and_caches(self):
        model = make_tiny_model(TINY_PRO_CONFIG)
        kinds = [layer.attn.kind for layer in model.layers]
        for rank, held in enumerate(split(5, 3)):
            with self.subTest(rank=rank):
                model = make_tiny_model(TINY_PRO_CONFIG)
                model.model.pipeline(FakeGroup(rank, 3))
                self.assertEqual(
                    [i for i, l in enumerate(model.model.layers) if l is not None],
                    held,
                )
                self.assertEqual(
                    [l.attn.kind for l in model.layers], kinds[held[0] : held[-1] + 1]
                )
                cache = model.make_cache()
                self.assertEqual(len(cache), len(held))
                ratios = [c.compressor.ratio for c in cache]
                rates = TINY_PRO_CONFIG["compress_rates"]
                self.assertEqual(ratios, [rates[kinds[i]] for i in held])

    def check_pipeline(self, ranks, cases, steps=PIPELINE_STEPS):
        script = PIPELINE_SCRIPT.format(
            checks=str(Path(__file__).resolve().parent),
            cases=json.dumps(cases),
            prompt=PIPELINE_PROMPT,
            steps=steps,
        )
        results = launch(self, script, ranks)
        for name, config in cases.items():
            n = config["num_hidden_layers"]
            stages = split(n, ranks)
            for rank, result in enumerate(r[name] for r in results):
                with self.subTest(name, rank=rank):
                    self.assertEqual(result["held"], stages[rank])
                    self.assertEqual(result["caches"], len(stages[rank]))
                    # Only the stage's layers stay, next to the embeddings, the
                    # head mix, the norm and the head.
                    dropped = sum(
                        b
                        for i, b in enumerate(result["layer_nbytes"])
                        if i not in stages[rank]
                    )
                    self.assertEqual(result["nbytes"], result["full_nbytes"] - dropped)
                    for key, diff in result["diffs"].items():
                        self.assertLessEqual(diff, 1e-5, key)
                    for key in ("tokens", "batch_tokens", "trimmed", "widest"):
                        self.assertEqual(result[key], result["expected"][key], key)
                    self.assertEqual(result["trimmed"], 3)
                    self.assertEqual(result["widest"], 2)
                    self.assertLessEqual(result["graph"], GRAPH_BOUND)
        return results

    def test_two_ranks_match_one_process(self):
        results = self.check_pipeline(2, {"flash": TINY_CONFIG})
        # Each rank holds about half the model.
        for result in (r["flash"] for r in results):
            self.assertLess(result["nbytes"], 0.6 * result["full_nbytes"])

    def test_three_ranks_split_unevenly(self):
        # Fewer steps: three ranks share the cores of the machine.
        self.check_pipeline(3, {"pro": TINY_PRO_CONFIG}, steps=48)

    def test_drafting_on_two_ranks_matches_one_process(self):
        script = DRAFT_SCRIPT.format(tests=str(TESTS), tokens=PIPELINE_STEPS)
        results = launch(self, script, 2)
        for rank, result in enumerate(results):
            for name, runs in result.items():
                with self.subTest(name, rank=rank):
                    self.assertEqual(runs["one"]["tokens"], runs["plain"])
                    self.assertEqual(runs["pipeline"], runs["one"])
        self.assertGreater(results[0]["mtp"]["one"]["accepted"], PIPELINE_STEPS // 3)
        self.assertTrue(results[0]["mtp"]["one"]["blocks"])

    def test_sharded_load_generates_the_same_text(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = sharded_folder(Path(tmp) / "model", TINY_PRO_CONFIG)
            script = LOAD_SCRIPT.format(path=str(path), tokens=PIPELINE_STEPS)
            results = launch(self, script, 2)
        stages = split(TINY_PRO_CONFIG["num_hidden_layers"], 2)
        for rank, result in enumerate(results):
            with self.subTest(rank=rank):
                one, pipeline = result["one"], result["pipeline"]
                self.assertEqual(one["layers"], list(range(5)))
                self.assertEqual(pipeline["layers"], stages[rank])
                self.assertEqual(pipeline["text"], one["text"])
                self.assertGreater(len(one["text"]), PIPELINE_STEPS)
                self.assertLess(pipeline["nbytes"], 0.7 * one["nbytes"])

    def test_server_pipeline_serves_the_same_text(self):
        prompt = "The quick brown fox"
        with tempfile.TemporaryDirectory() as tmp:
            path = sharded_folder(Path(tmp) / "model", TINY_PRO_CONFIG)
            model, tokenizer = load(str(path))
            expected = generate(model, tokenizer, prompt, max_tokens=PIPELINE_STEPS)
            port = _free_ports(1)
            server = ("-m", "mlx_lm.server", "--model", str(path), "--pipeline")
            command = ring_command(self, 2, *server, "--port", str(port))
            with open(Path(tmp) / "log", "w+") as log:
                server = subprocess.Popen(
                    command, stdout=log, stderr=log, start_new_session=True
                )
                try:
                    body = json.dumps(
                        {"prompt": prompt, "max_tokens": PIPELINE_STEPS, "temp": 0}
                    ).encode()
                    url = f"http://127.0.0.1:{port}/v1/completions"
                    for _ in range(600):
                        try:
                            with urllib.request.urlopen(url, body, timeout=60) as r:
                                text = json.load(r)["choices"][0]["text"]
                            break
                        except urllib.error.URLError:
                            if server.poll() is not None:
                                break
                            time.sleep(0.1)
                    else:
                        text = None
                finally:
                    os.killpg(server.pid, signal.SIGKILL)
                    server.wait()
                    log.seek(0)
                    output = log.read()
        self.assertEqual(text, expected, output)


if __name__ == "__main__":
    unittest.main()
