# Copyright © 2026 Apple Inc.

"""Train a tiny DeepSeek-V4 and its MTP block on text this machine has, then
measure what drafting with the block gives: its teacher-forced agreement
with the target on held-out text (beside the block untrained and two
trivial drafters), and acceptance, tokens per target forward and tokens/s
of greedy and sampled decoding against plain decoding.

Bytes are the tokens (vocabulary 256). The text is Python's own standard
library source (the training files, then one file held out). The target
learns the next byte and the block the byte after it, from the target's
last hyper-connection streams and the next byte's embedding, as DeepSeek
trains its MTP block (the sum of the two losses). Greedy decoding of so
small a model loops on a byte or two, where every draft is kept: the
teacher-forced and the sampled figures are the block's.

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
from mlx_lm.models.cache import trim_prompt_cache
from mlx_lm.sample_utils import make_sampler

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


def agreement(model, held_out, rows, length, depth):
    """Teacher-forced agreement of the block with the target on held-out
    text: ``rows`` spans of ``length`` bytes, the target's argmax at every
    position, and at each position t the block's chain of ``depth`` calls
    (the target's streams at t with byte t + 1, then its own streams with
    the text's next bytes), each call's argmax against the target's argmax
    for the byte it drafts. Returns the target's accuracy on the text and
    the agreement at each depth, those of the best constant drafter and of
    one that repeats the byte it reads, and the positions counted."""
    starts = [r * (held_out.size - length) // max(rows - 1, 1) for r in range(rows)]
    x = mx.stack([held_out[s : s + length] for s in starts])
    logits, hidden = model(x[:, :-1], return_hidden=True)
    target = mx.argmax(logits, axis=-1)
    accuracy = (target == x[:, 1:]).mean().item()
    cache = model.make_mtp_cache()
    hits, counts = [mx.array(0)] * depth, [0] * depth
    for t in range(length - 2):
        h, calls = hidden[:, t : t + 1], min(depth, length - 2 - t)
        for j in range(calls):
            # Call j drafts byte t + 2 + j, the target's guess at t + 1 + j.
            draft, h = model.mtp_draft(h, x[:, t + 1 + j : t + 2 + j], cache)
            same = mx.argmax(draft[:, -1], axis=-1) == target[:, t + 1 + j]
            hits[j] = hits[j] + same.sum()
            counts[j] += rows
        # The block keeps only what it read from the target's streams.
        if trim_prompt_cache(cache, calls - 1) != calls - 1:
            raise RuntimeError("the block's cache did not trim its own streams")
        mx.eval(hits, cache[0].cache_arrays())
    # A drafter that always says the target's commonest byte there.
    common = [
        (target[:, 1 + j :, None] == mx.arange(256)).sum((0, 1)).max().item() / c
        for j, c in enumerate(counts)
    ]
    # A drafter that says the byte it reads again (indentation repeats).
    repeat = [
        (target[:, 1 + j :] == x[:, 1 + j : -1]).sum().item() / c
        for j, c in enumerate(counts)
    ]
    hits = [n.item() / c for n, c in zip(hits, counts)]
    return accuracy, hits, (common, repeat), counts


def decode(model, prompt, tokens, k, sampler=None):
    """The tokens, the drafts kept and proposed, the target forwards after
    the prompt's prefill and the seconds after the first token."""
    if k == 0:
        steps = generate_step(prompt, model, max_tokens=tokens, sampler=sampler)
    else:
        steps = speculative_generate_step(
            prompt,
            model,
            mtp=True,
            num_draft_tokens=k,
            max_tokens=tokens,
            sampler=sampler,
        )
    # Each target forward checks min(k, tokens left) drafts and gives the
    # ones it keeps and one more token (its own); the first round drafts
    # too, from the prompt's last position.
    out, kept, proposed, forwards, tic = [], 0, min(k, tokens), 1, None
    for item in steps:
        if tic is None:
            tic = time.perf_counter()
        out.append(int(item[0]))
        if k and item[-1]:
            kept += 1
        elif len(out) < tokens:
            forwards += 1
            proposed += min(k, tokens - len(out))
    return out, kept, proposed, forwards, time.perf_counter() - tic


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--report", type=int, default=50)
    parser.add_argument("--corpus", type=int, default=2_000_000, help="bytes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-rows", type=int, default=16)
    parser.add_argument("--eval-length", type=int, default=256)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.8)
    args = parser.parse_args()

    mx.random.seed(args.seed)
    data, held_out = corpus(args.corpus)
    model = deepseek_v4.Model(deepseek_v4.ModelArgs.from_dict(CONFIG))
    untrained = model.mtp[0].parameters()
    print(f"corpus {data.size:,} bytes, held out {held_out.size:,}, seed {args.seed}")
    train(model, data, args)
    model.eval()

    trained = model.mtp[0].parameters()
    rows, length, depth = args.eval_rows, args.eval_length, 3
    accuracy, agree, (common, repeat), counts = agreement(
        model, held_out, rows, length, depth
    )
    model.mtp[0].update(untrained)
    floor = agreement(model, held_out, rows, length, depth)[1]
    model.mtp[0].update(trained)
    print(
        f"teacher-forced, {rows} x {length} held-out bytes: the target's argmax "
        f"is the next byte at {accuracy:.3f} of positions"
    )
    print(f"  the block's argmax = the target's, depth {list(range(1, depth + 1))}")
    print(f"  trained     {' '.join(f'{a:.3f}' for a in agree)}")
    print(f"  untrained   {' '.join(f'{a:.3f}' for a in floor)}")
    print(f"  constant    {' '.join(f'{a:.3f}' for a in common)}")
    print(f"  repeat      {' '.join(f'{a:.3f}' for a in repeat)}")
    print(f"  positions   {' '.join(f'{c:,}' for c in counts)}")

    prompts = []
    for p in range(args.prompts):
        start = p * held_out.size // args.prompts
        prompts.append(held_out[start : start + 64])
    print(f"{args.prompts} held-out prompts of 64 bytes, {args.tokens} tokens each")
    for temp in (0.0, args.temperature):
        print("greedy" if temp == 0 else f"temperature {temp} (speculative sampling)")
        sampler = make_sampler(temp)
        plain = []
        for k in (0, 1, 2, 3):
            n = kept = proposed = forwards = seconds = 0
            distinct, commonest = [], []
            for p, prompt in enumerate(prompts):
                # Each sampled run draws from its prompt's own seed.
                mx.random.seed(args.seed + 1 + p)
                out, *counts, took = decode(model, prompt, args.tokens, k, sampler)
                if temp == 0 and k == 0:
                    plain.append(out)
                elif temp == 0 and out != plain[p]:
                    raise RuntimeError(f"MTP k={k} changed the greedy output")
                n, seconds = n + len(out), seconds + took
                kept, proposed = kept + counts[0], proposed + counts[1]
                forwards += counts[2]
                distinct.append(len(set(out)))
                commonest.append(max(map(out.count, set(out))) / len(out))
                if p == 0 and temp and k in (0, 3):
                    print(f"  {'plain' if k == 0 else f'MTP k={k}'}: {bytes(out)!r}")
            line = f"  {'plain' if k == 0 else f'MTP k={k}':9}"
            line += f"{(n - args.prompts) / seconds:7.1f} tok/s"
            if k:
                line += (
                    f", drafts kept {kept / proposed:.3f}, "
                    f"{n / forwards:.2f} tokens a target forward"
                )
            share = ", ".join(f"{c:.2f}" for c in commonest)
            print(f"{line}, distinct bytes {distinct}, commonest byte [{share}]")


if __name__ == "__main__":
    main()
