# Copyright © 2026 Apple Inc.
"""Long decode on a tiny random model, through the path of mlx_lm.generate.

Builds a model folder (random weights, a small byte-level BPE tokenizer made
here), loads it with ``mlx_lm.load`` and decodes with ``stream_generate``,
which evaluates only the tokens, as ``mlx_lm.generate`` and the server do.
Every ``--report`` tokens it prints tokens/s, active memory and the largest
unevaluated graph behind any array the prompt cache holds. A cache whose
graph grows here is the one that exhausts Metal's resource limit on a Mac.

    python benchmarks/long_decode.py                      # DeepSeek-V4
    python benchmarks/long_decode.py --model-type qwen3_5 --tokens 5000
"""

import argparse
import io
import json
import tempfile
import time
from pathlib import Path

import mlx.core as mx

CONFIGS = {
    "deepseek_v4": {
        "model_type": "deepseek_v4",
        "vocab_size": 512,
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "head_dim": 32,
        "qk_rope_head_dim": 16,
        "q_lora_rank": 32,
        "o_groups": 2,
        "o_lora_rank": 16,
        "sliding_window": 32,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "index_n_heads": 4,
        "index_head_dim": 16,
        "index_topk": 16,
        "hc_mult": 4,
        # transformers' config class (the tokenizer loader reads it) takes
        # rates other than 4 and 128 only in this schema.
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
        "mlp_layer_types": ["hash_moe", "moe", "moe", "moe"],
        "bos_token_id": 0,
        "eos_token_id": 1,
    },
    "qwen3_5": {
        "model_type": "qwen3_5",
        "text_config": {
            "model_type": "qwen3_5_text",
            "vocab_size": 512,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 8,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "linear_num_value_heads": 4,
            "linear_num_key_heads": 2,
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
            "full_attention_interval": 4,
            "tie_word_embeddings": False,
        },
    },
    "llama": {
        "model_type": "llama",
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
    },
    "qwen3": {
        "model_type": "qwen3",
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
    },
}

# A DeepSeek-V4 config with its multi-token-prediction block (`mtp.*`), which
# `mlx_lm.generate --mtp` drafts with.
MTP = {"num_nextn_predict_layers": 1}
# A V4-Flash-0731-shaped one: DeepSeek's `compress_ratios` schema, one
# window-only entry per DSpark stage after the layers' (three), its drafter's
# `dspark_*` fields (which also pick the 0731 chat format).
DSPARK = {
    "compress_ratios": [0, 4, 128, 4, 0, 0, 0],
    "num_nextn_predict_layers": 1,
    "dspark_block_size": 5,
    "dspark_noise_token_id": 511,
    "dspark_target_layer_ids": [1, 2, 3],
    "dspark_markov_rank": 8,
}


# ChatML, for the model types without a chat encoder of their own.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen's ChatML with tools (its <tool_call> JSON, which mlx_lm's json_tools
# parser reads) and thinking (`enable_thinking`), for qwen3 and qwen3_5.
QWEN_TEMPLATE = """\
{%- if tools %}<|im_start|>system
# Tools
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
Call a function as <tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == "assistant" and m.tool_calls %}<|im_start|>assistant
{{ m.content or "" }}
{%- for tool_call in m.tool_calls %}
{%- set tool_call = tool_call.function or tool_call %}<tool_call>
{"name": "{{ tool_call.name }}", "arguments": {{ tool_call.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif m.role == "tool" %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% else %}<think>
{% endif %}{% endif %}"""
QWEN_TOKENS = (
    "<|endoftext|>",
    "<|im_end|>",
    "<|im_start|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
)


def make_tokenizer(
    path, vocab_size, special_tokens=("<bos>", "<eos>"), chat_template=CHAT_TEMPLATE
):
    """Train a small byte-level BPE tokenizer and save it to ``path``. The
    first two special tokens are BOS and EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = [
        "The quick brown fox jumps over the lazy dog.",
        "Long generations must not grow the graph behind the cache.",
        "Write a story about a lighthouse keeper and the sea.",
        # Enough words that the merges fill the vocabulary: ids past the
        # trained ones decode to nothing.
        "Hello! How are you today? I am fine, thank you; and what about you?",
        "Please call the weather function for Paris, London and New York.",
        "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000, then some more words.",
        "Every model reads its config, loads weights and decodes one token.",
        "A server answers requests: chat, completions, tools and streams.",
        "Think step by step before you answer the question of the user.",
    ]
    tok.train_from_iterator(text * 10, trainer)
    PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=special_tokens[0],
        eos_token=special_tokens[1],
        chat_template=chat_template,
    ).save_pretrained(path)


def make_model_folder(path, model_type, seed=0, mtp=False, dspark=False):
    """A folder ``mlx_lm.load`` reads: config, random weights, tokenizer;
    ``mtp``: DeepSeek-V4's multi-token-prediction block too; ``dspark``: a
    V4-Flash-0731-shaped DeepSeek-V4 with its DSpark drafter."""
    from mlx_lm.utils import _get_classes, save_model

    config = CONFIGS[model_type]
    if (mtp or dspark) and model_type != "deepseek_v4":
        raise ValueError(f"a drafter block is DeepSeek-V4's, not {model_type}'s")
    if dspark:
        schema = ("layer_types", "compress_rates", "mlp_layer_types")
        config = {k: v for k, v in config.items() if k not in schema}
        config, mtp = {**config, **DSPARK}, True
    elif mtp:
        config = {**config, **MTP}
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    mx.random.seed(seed)
    model_class, args_class = _get_classes(config)
    # The block is built where asked for (load's model_config); the folder
    # keeps it, as mlx_lm.convert does.
    model = model_class(
        args_class.from_dict({**config, "mtp": True} if mtp else config)
    )
    mx.eval(model.parameters())
    save_model(path, model, donate_model=True)
    with open(path / "config.json", "w") as f:
        json.dump(config, f, indent=2)
    vocab = config.get("vocab_size") or config["text_config"]["vocab_size"]
    if model_type == "deepseek_v4":
        # The tokens of its chat format, which load checks.
        from mlx_lm.chat_templates.deepseek_v4 import special_tokens

        make_tokenizer(path, vocab, special_tokens, chat_template=None)
    elif model_type in ("qwen3", "qwen3_5"):
        make_tokenizer(path, vocab, QWEN_TOKENS, chat_template=QWEN_TEMPLATE)
    else:
        make_tokenizer(path, vocab)
    return path


def graph_edges(a):
    if a is None:
        return 0
    f = io.StringIO()
    mx.export_to_dot(f, a)
    return f.getvalue().count("->")


def cache_arrays(obj, seen=None):
    """Every array a cache object holds, however it nests them."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, mx.array):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [a for o in obj for a in cache_arrays(o, seen)]
    if isinstance(obj, dict):
        return [a for o in obj.values() for a in cache_arrays(o, seen)]
    if hasattr(obj, "__dict__"):
        return cache_arrays(vars(obj), seen)
    return []


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model-type",
        default="deepseek_v4",
        choices=CONFIGS,
        help="the tiny model to build (default deepseek_v4)",
    )
    parser.add_argument("--model", help="an existing model folder instead")
    parser.add_argument(
        "--tokens", type=int, default=3000, help="tokens to decode (default 3000)"
    )
    parser.add_argument(
        "--report",
        type=int,
        default=500,
        help="print a line every N tokens (default 500)",
    )
    parser.add_argument(
        "--blocking-eval",
        action="store_true",
        help="also mx.eval every cache array after each forward (a host sync "
        "per step, as the earlier fix did), to compare tokens/s",
    )
    args = parser.parse_args()

    from mlx_lm import load, stream_generate
    from mlx_lm.models.cache import make_prompt_cache

    with tempfile.TemporaryDirectory() as tmp:
        folder = args.model or make_model_folder(tmp, args.model_type)
        model, tokenizer = load(str(folder))
    if args.blocking_eval:
        base = type(model)

        class BlockingEval(base):
            def __call__(self, *a, cache=None, **kw):
                out = base.__call__(self, *a, cache=cache, **kw)
                mx.eval(cache_arrays(cache))
                return out

        model.__class__ = BlockingEval
    cache = make_prompt_cache(model)
    eos = list(tokenizer.eos_token_ids)

    def no_eos(tokens, logits):
        # Random weights: keep decoding to the requested length.
        logits[:, eos] = -float("inf")
        return logits

    prompt = tokenizer.encode("Write a story about a lighthouse keeper.")
    mode = "blocking eval per forward" if args.blocking_eval else "as shipped"
    name = args.model or args.model_type
    print(f"{name} ({mode}): {args.tokens} tokens, prompt {len(prompt)}")
    print(f"{'tokens':>7} {'tok/s':>9} {'active MB':>10} {'cache MB':>9} {'graph':>6}")
    tic, last = time.perf_counter(), 0
    for n, _ in enumerate(
        stream_generate(
            model,
            tokenizer,
            prompt,
            max_tokens=args.tokens,
            prompt_cache=cache,
            logits_processors=[no_eos],
        ),
        start=1,
    ):
        if n % args.report == 0 or n == args.tokens:
            toc = time.perf_counter()
            arrays = cache_arrays(cache)
            graph = max((graph_edges(a) for a in arrays), default=0)
            cache_mb = sum(a.nbytes for a in arrays) / 1e6
            print(
                f"{n:>7} {(n - last) / (toc - tic):>9.1f} "
                f"{mx.get_active_memory() / 1e6:>10.2f} {cache_mb:>9.2f} {graph:>6}",
                flush=True,
            )
            tic, last = time.perf_counter(), n


if __name__ == "__main__":
    main()
