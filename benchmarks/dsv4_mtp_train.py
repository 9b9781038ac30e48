# Copyright © 2026 Apple Inc.

"""Train a tiny DeepSeek-V4 and its MTP block on text this machine has, then
measure what drafting with the block gives: acceptance, tokens per target
forward and tokens/s against plain greedy decoding.

Bytes are the tokens (vocabulary 256). The text is Python's own standard
library source (the training files, then one file held out for the prompts).
The target learns the next byte and the block the byte after it, from the
target's last hyper-connection streams and the next byte's embedding, as
DeepSeek trains its MTP block (the sum of the two losses).

    python3 benchmarks/dsv4_mtp_train.py --steps 300
"""

import argparse
import os
import sysconfig
import time

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from long_decode import CONFIGS
from mlx_lm.generate import generate_step, speculative_generate_step

from mlx_lm.models import deepseek_v4

# The demo's tiny model, wider, with bytes for tokens and its MTP block.
CONFIG = {
    **CONFIGS["deepseek_v4"],
    "vocab_size": 256,
    "hidden_size": 128,
    "qk_rope_head_dim": 8,
    "q_lora_rank": 64,
    "o_lora_rank": 32,
    "moe_intermediate_size": 128,
    "n_routed_experts": 8,
    "mlp_layer_types": ["moe"] * 4,
    "max_position_embeddings": 4096,
    "num_nextn_predict_layers": 1,
    "mtp": True,
}


def corpus(limit):
    """The bytes of the standard library's modules, and one held out."""
    lib = sysconfig.get_paths()["stdlib"]
    names = sorted(n for n in os.listdir(lib) if n.endswith(".py"))
    held_out = os.path.join(lib, "argparse.py")
    data = bytearray()
    for name in names:
        path = os.path.join(lib, name)
        if path != held_out and len(data) < limit:
            with open(path, "rb") as f:
                data += f.read()
    with open(held_out, "rb") as f:
        return mx.array(list(data[:limit])), mx.array(list(f.read()))


def loss_fn(model, x):
    """Next-byte loss of the target plus the block's loss on the byte after."""
    inputs, nxt, after = x[:, :-2], x[:, 1:-1], x[:, 2:]
    logits, hidden = model(inputs, return_hidden=True)
    draft, _ = model.mtp_draft(hidden, nxt, model.make_mtp_cache())
    target_loss = nn.losses.cross_entropy(logits, nxt, reduction="mean")
    mtp_loss = nn.losses.cross_entropy(draft, after, reduction="mean")
    return target_loss + mtp_loss, (target_loss, mtp_loss)


def train(model, data, args):
    optimizer = optim.Adam(learning_rate=args.learning_rate)
    step = nn.value_and_grad(model, lambda m, x: loss_fn(m, x)[0])
    tic = time.perf_counter()
    for i in range(args.steps):
        starts = mx.random.randint(0, data.size - args.length - 2, (args.batch,))
        x = mx.stack([data[s.item() : s.item() + args.length + 2] for s in starts])
        loss, grads = step(model, x)
        optimizer.update(model, grads)
        mx.eval(model.parameters(), optimizer.state, loss)
        if (i + 1) % args.report == 0 or i + 1 == args.steps:
            _, (t, m) = loss_fn(model, x)
            print(
                f"step {i + 1}: target loss {t.item():.3f}, MTP loss {m.item():.3f} "
                f"({time.perf_counter() - tic:.0f} s)"
            )


def decode(model, prompt, tokens, k):
    """Greedy tokens, the drafts kept and the seconds after the first token."""
    if k == 0:
        steps = generate_step(prompt, model, max_tokens=tokens)
    else:
        steps = speculative_generate_step(
            prompt, model, mtp=True, num_draft_tokens=k, max_tokens=tokens
        )
    out, kept, tic = [], 0, None
    for item in steps:
        if tic is None:
            tic = time.perf_counter()
        out.append(int(item[0]))
        kept += bool(item[-1]) if k else 0
    return out, kept, time.perf_counter() - tic


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--report", type=int, default=50)
    parser.add_argument("--corpus", type=int, default=2_000_000, help="bytes")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=256)
    args = parser.parse_args()

    mx.random.seed(0)
    data, held_out = corpus(args.corpus)
    model = deepseek_v4.Model(deepseek_v4.ModelArgs.from_dict(CONFIG))
    print(f"corpus {data.size:,} bytes, held out {held_out.size:,}")
    train(model, data, args)
    model.eval()

    results = {k: [0, 0, 0.0] for k in (0, 1, 2, 3)}  # tokens, kept, seconds
    for p in range(args.prompts):
        start = p * held_out.size // args.prompts
        prompt = held_out[start : start + 64]
        plain, _, _ = decode(model, prompt, args.tokens, 0)
        for k in results:
            out, kept, seconds = decode(model, prompt, args.tokens, k)
            if out != plain:
                raise RuntimeError(f"MTP k={k} changed the greedy output")
            results[k][0] += len(out) - 1
            results[k][1] += kept
            results[k][2] += seconds
    print(f"{args.prompts} held-out prompts of 64 bytes, {args.tokens} tokens each")
    for k, (n, kept, seconds) in results.items():
        if k == 0:
            print(f"  plain      {n / seconds:7.1f} tok/s")
            continue
        # After the prompt's forward, each target forward checks a round's
        # k drafts and gives the ones it keeps and one more token.
        rounds = n - kept
        print(
            f"  MTP k={k}    {n / seconds:7.1f} tok/s, drafts kept "
            f"{kept / (rounds * k):.2f}, {n / rounds:.2f} tokens a target forward"
        )


if __name__ == "__main__":
    main()
