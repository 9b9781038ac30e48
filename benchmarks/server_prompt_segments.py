# Copyright © 2026 Apple Inc.
"""What the batched server prefills per chat with DeepSeek-V3/R1's template form.

A random two-layer Llama (``KVCache``, trimmable, as DeepSeek-V3's cache in
0.32.2) and a word-level tokenizer with DeepSeek's special tokens, served in
process by the ``mlx_lm`` of ``--tree`` (an mlx-lm source tree: 0.32.2, or
0.32.2 with a PR exported onto it). The template renders as DeepSeek-V3's
(``--template v3``) or DeepSeek-R1's (``r1``: ``<think>`` opens the answer,
reasoning dropped from the history): no token closes the user's turn.

Requests, one at a time, sharing a system prompt of ``--system-words`` words:
chat A, chat B, chat A's second turn, chat C. For each it prints the prompt
and cached tokens (``usage``), the tokens fed to the model and its calls
(prefill and the ``--max-tokens`` of decode), the caches it stores (by
type) and the prompt cache's entries afterwards.

    python benchmarks/server_prompt_segments.py --tree DIR --template r1
"""

import argparse
import http.server
import sys
import threading
import time

WORDS = "the quick brown fox jumps over lazy dog a story about the sea".split()
SPECIAL = "<｜begin▁of▁sentence｜> <｜end▁of▁sentence｜> <｜User｜> <｜Assistant｜>"


def make_template(reasoning):
    def chat_template(messages, add_generation_prompt=False, **kwargs):
        system = " ".join(m["content"] for m in messages if m["role"] == "system")
        text = "<｜begin▁of▁sentence｜> " + system
        for m in messages:
            if m["role"] == "user":
                text += " <｜User｜> " + m["content"]
            elif m["role"] == "assistant":
                answer = m["content"].split("</think>")[-1]
                text += " <｜Assistant｜> " + answer + " <｜end▁of▁sentence｜>"
        if add_generation_prompt:
            text += " <｜Assistant｜>" + " <think>" * reasoning
        return text

    return chat_template


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", required=True, help="an mlx-lm source tree")
    parser.add_argument("--template", choices=["v3", "r1"], default="v3")
    parser.add_argument("--system-words", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=4)
    args = parser.parse_args()
    sys.path.insert(0, args.tree)

    import mlx.core as mx
    import requests
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from mlx_lm import server
    from mlx_lm.models import llama
    from mlx_lm.models.cache import LRUPromptCache
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    print(f"mlx_lm: {server.__file__}, template: {args.template}")
    vocab = SPECIAL.split() + ["<think>", "</think>"] + WORDS
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, "a"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = TokenizerWrapper(
        PreTrainedTokenizerFast(tokenizer_object=backend),
        chat_template=make_template(args.template == "r1"),
    )

    class CountingLlama(llama.Model):
        fed = calls = 0

        def __call__(self, inputs, *a, **kw):
            self.fed += inputs.size
            self.calls += 1
            return super().__call__(inputs, *a, **kw)

    config = dict(
        model_type="llama",
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=4,
        rms_norm_eps=1e-5,
        vocab_size=len(vocab),
    )
    model = CountingLlama(llama.ModelArgs(**config))
    mx.eval(model.parameters())

    class Provider:
        model_key = ("deepseek-form", None)
        processor = draft_model = None
        is_batchable = True
        # mlx_lm.server's defaults
        cli_args = argparse.Namespace(
            **{"temp": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0},
            max_tokens=args.max_tokens,
            num_draft_tokens=3,
            chat_template_args={},
            model=None,
            adapter_path=None,
            draft_model=None,
            decode_concurrency=32,
            prompt_concurrency=8,
            prefill_step_size=2048,
            prompt_cache_size=10,
            prompt_cache_bytes=None,
            allowed_origins=["*"],
            kv_bits=None,
            kv_group_size=64,
            quantized_kv_start=0,
        )

        def load(self, *a, **kw):
            return model, tokenizer

        def load_default(self):
            return self.load()

        def reset(self):
            pass

    prompt_cache = LRUPromptCache()
    inserted = []
    insert_cache = prompt_cache.insert_cache

    def counting_insert(*a, cache_type="assistant"):
        inserted.append(cache_type)
        insert_cache(*a, cache_type=cache_type)

    prompt_cache.insert_cache = counting_insert
    generator = server.ResponseGenerator(Provider(), prompt_cache)
    httpd = http.server.HTTPServer(
        ("localhost", 0), lambda *a: server.APIHandler(generator, *a)
    )
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://localhost:{httpd.server_port}/v1/chat/completions"

    system = " ".join(WORDS[i % len(WORDS)] for i in range(args.system_words))
    s = {"role": "system", "content": system}
    a1 = [s, {"role": "user", "content": "the quick fox"}]
    chats = {
        "A": a1,
        "B": [s, {"role": "user", "content": "a lazy dog"}],
        "A, turn 2": a1
        + [
            {"role": "assistant", "content": "<think> sea </think> the sea"},
            {"role": "user", "content": "about the sea"},
        ],
        "C": [s, {"role": "user", "content": "the story"}],
    }
    print("chat       prompt  cached  fed  calls  caches stored  cache entries")
    for name, messages in chats.items():
        fed, calls = model.fed, model.calls
        inserted.clear()
        body = {"messages": messages, "max_tokens": args.max_tokens}
        usage = requests.post(url, json=body).json()["usage"]
        time.sleep(0.5)  # the cache is stored after the reply
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        entries = {k: len(v) for k, v in prompt_cache._lru._lrus.items() if v}
        print(
            f"{name:10} {usage['prompt_tokens']:6} {cached:7} "
            f"{model.fed - fed:4} {model.calls - calls:6}  "
            f"{','.join(inserted):13}  {entries}"
        )
    generator.stop_and_join()
    httpd.shutdown()
    httpd.server_close()


if __name__ == "__main__":
    main()
