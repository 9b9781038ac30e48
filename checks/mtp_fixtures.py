# Copyright © 2026 Apple Inc.
"""Tiny DeepSeek-V4 models, folders and a server for the fork's deeper
speculative-decoding checks (test_mtp_deep.py, test_trim_deep.py): copies of
tests/test_deepseek_v4.py's and tests/test_server_requests.py's fixtures,
which the PRs' own tests do not share (each test file stands alone)."""

import http.client
import io
import json
import sys
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from unittest import mock

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from mlx_lm import server
from mlx_lm.models import deepseek_v4

# Every layer type and two hash layers; small rates and window so a prompt of
# a few hundred tokens wraps the window and fills both pools.
TINY_CONFIG = {
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
        "compressed_sparse_attention",
    ],
    "compress_rates": {
        "compressed_sparse_attention": 4,
        "heavily_compressed_attention": 16,
    },
    "mlp_layer_types": ["hash_moe", "hash_moe", "moe", "moe"],
    "rope_parameters": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "beta_fast": 32,
        "beta_slow": 1,
    },
    "max_position_embeddings": 256,
    "bos_token_id": 0,
    "eos_token_id": 1,
}


def random_weights(model, seed=0):
    """Give every parameter random values (the defaults are mostly zeros)."""
    mx.random.seed(seed)
    args = model.args

    def init(path, p):
        if path.endswith("tid2eid"):
            return mx.random.randint(0, args.n_routed_experts, p.shape).astype(p.dtype)
        if path.endswith("norm.weight"):
            return 1.0 + 0.1 * mx.random.normal(p.shape)
        return 0.2 * mx.random.normal(p.shape)

    flat = [(k, init(k, v)) for k, v in tree_flatten(model.parameters())]
    model.update(tree_unflatten(flat))
    mx.eval(model.parameters())
    return model


# The tokens of DeepSeek-V4's chat format (BOS and EOS first), as
# mlx_lm/chat_templates/deepseek_v4.py checks them at load.
special_tokens = (
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<think>",
    "</think>",
)


def make_tiny_model(config=None, seed=0):
    args = deepseek_v4.ModelArgs.from_dict(config or TINY_CONFIG)
    return random_weights(deepseek_v4.Model(args), seed)


def make_tiny_tokenizer(path, vocab_size, special_tokens=special_tokens):
    """A byte-level BPE tokenizer of vocab_size tokens saved in path, with the
    chat format's special tokens (BOS and EOS first)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    text = ["The quick brown fox jumps over the lazy dog. " * 4] * 8
    tokenizer.train_from_iterator(text, trainer)
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<｜begin▁of▁sentence｜>",
        eos_token="<｜end▁of▁sentence｜>",
    ).save_pretrained(path)


def make_tiny_model_folder(path, config=None, seed=0):
    """Write a random tiny DeepSeek-V4 (config, weights, tokenizer) to path."""
    config = config or TINY_CONFIG
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model = make_tiny_model(config, seed)
    # Zero logits for BOS and EOS, so greedy decoding runs to the token limit.
    model.lm_head.weight[:2] = 0.0
    mx.save_safetensors(
        str(path / "model.safetensors"), dict(tree_flatten(model.parameters()))
    )
    # "mtp" asks the loader for the MTP block: no checkpoint's field.
    config = {k: v for k, v in config.items() if k != "mtp"}
    with open(path / "config.json", "w") as f:
        json.dump(config, f, indent=2)
    make_tiny_tokenizer(path, config["vocab_size"])
    return path


def max_diff(a, b):
    return mx.abs(a.astype(mx.float32) - b.astype(mx.float32)).max().item()


GRAPH_BOUND = 8


def graph_edges(a):
    """Edges of the unevaluated graph behind a (0 once it is evaluated)."""
    f = io.StringIO()
    mx.export_to_dot(f, a)
    return f.getvalue().count("->")


def max_cache_graph(cache):
    """The largest graph behind any array that any layer's cache holds."""
    return max(
        (
            graph_edges(v)
            for layer_cache in cache
            for c in layer_cache.caches
            for v in vars(c).values()
            if isinstance(v, mx.array)
        ),
        default=0,
    )


def make_model_provider(model_path, *args):
    """The ModelProvider `mlx_lm.server` makes, with its default arguments."""
    argv = ["mlx_lm.server", "--model", str(model_path), "--log-level", "ERROR"]
    with mock.patch.object(server, "run") as run:
        with mock.patch.object(sys, "argv", argv + list(args)):
            server.main()
    return run.call_args.args[2]


class ServerThread:
    """`mlx_lm.server` on a free loopback port, in this process."""

    def __init__(self, model_path, *args):
        provider = make_model_provider(model_path, *args)
        cache = server.LRUPromptCache(provider.cli_args.prompt_cache_size)
        self.generator = server.ResponseGenerator(provider, cache)
        self.httpd = ThreadingHTTPServer(
            ("127.0.0.1", 0),
            lambda *a, **kw: server.APIHandler(self.generator, *a, **kw),
        )
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.generator.stop_and_join()

    def request(self, method, path, body=None):
        """Send one request; return the status and the decoded JSON answer."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        if body is not None and not isinstance(body, str):
            body = json.dumps(body)
        conn.request(method, path, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
        conn.close()
        return response.status, json.loads(data) if data else None

    def chat(self, body):
        return self.request("POST", "/v1/chat/completions", body)
