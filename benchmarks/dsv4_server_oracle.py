# Copyright © 2026 Apple Inc.
"""Concurrent requests to ``mlx_lm.server --mtp`` against the same server
without it, with oracle drafters at the published acceptance.

Builds two DeepSeek-V4 folders on one target (``dsv4_verify.py``'s random
weights): one with its MTP block, one with a DSpark drafter (V4-Flash-0731's
layout). Each prompt's plain greedy continuation (one row, ``generate_step``)
is computed first. Then three servers run: the target without ``--mtp``,
with ``--mtp`` (MTP, ``--mtp-k`` drafts a round) and with ``--mtp`` on the
DSpark folder (``--dspark-block`` drafts). In the two drafting servers the
model's drafter is wrapped by an oracle: the drafter runs (so a round costs
what its compute costs) and its drafts are replaced by the request's plain
tokens, right up to a count drawn for the request at that position (MTP:
70% / 29% for the first / second draft; DSpark: a geometric block of mean
``--block-mean`` tokens a round), wrong after. Each request finds its plain
tokens by the prompt tokens the drafter saw, so rows join and leave the
batch as the server schedules them. A batch in bf16 can round to other
tokens than one row, and a row that left its plain tokens gets wrong drafts
from there on; ``--oracle-truth self`` sends each run's requests to a
drafting server first untimed, feeding the tokens its rows kept back as
the oracle's until they repeat (at most 4 times), then times the run; the
plain server gets them once untimed too, so each server's prompt cache holds
the prompts of the runs it times.

Each run sends ``--requests`` completions at once (prompts and answers of
different lengths, so rows leave the batch at different times; greedy), new
prompts every run, to each server in turn, ``--repeat`` times. It prints
the aggregate tok/s (all answers' tokens over the wall time from the first
request to the last answer) and the per-request decode tok/s (tokens after
the first over the time between the first and the last streamed chunk),
medians (min-max) of the runs, the tokens a round the rows kept, the
answers that differ from the plain server's (warm-up included) and the
oracle's notes (a request whose tokens left the oracle's, one not found;
the untimed passes' included).

    python benchmarks/dsv4_server_oracle.py --tiny --layers 43 --repeat 3

The three servers run at once, each with its own copy of the weights: at
Flash's widths in bf16 (``--dtype bfloat16``) 43 layers with 8 experts
need three times 29.7 GB (on an 80 GB H100, 30 layers did not fit).
``--one-at-a-time`` starts each server alone, runs its runs in a row and
stops it before the next starts.
"""

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import mlx.core as mx
from dsv4_verify import MTP_RATES, build, build_dspark, geometric, per_position
from long_decode import make_tokenizer
from server_soak import free_port, start_server

from mlx_lm.models.cache import DrafterCache
from mlx_lm.models.drafters import Drafter

# The prompt tokens a row's drafter keeps to find its request.
TAIL = 16
# A drafting server's rows' rounds and the tokens they kept, so far.
ROUNDS = [0, 0]
WORDS = (
    "the quick brown fox jumps over lazy dog long generations must not grow "
    "graph behind cache write story about lighthouse keeper and sea server "
    "request answer token model numbers weather function paris london think"
).split()


class OracleCache(DrafterCache):
    """Per row: the tokens the target consumed, the last ``TAIL`` of them
    the drafter saw in a prompt, and the request (index of its plain
    tokens) once found."""

    def __init__(self, offsets=(0,), tails=((),), requests=(None,)):
        self.offsets, self.tails = list(offsets), list(tails)
        self.requests = list(requests)

    @property
    def nbytes(self):
        return 0

    def is_trimmable(self):
        return True

    @property
    def row_max_trim(self):
        return list(self.offsets)

    @property
    def max_trim(self):
        return min(self.offsets, default=0)

    def trim_rows(self, counts):
        counts = list(counts)
        self.offsets = [o - n for o, n in zip(self.offsets, counts)]
        self.tails = [t[: max(len(t) - n, 0)] for t, n in zip(self.tails, counts)]
        return True

    def trim(self, n):
        n = min(n, self.max_trim)
        self.trim_rows([n] * len(self.offsets))
        return n

    def size(self):
        return max(self.offsets, default=0)

    def empty(self):
        return not any(self.offsets)

    @classmethod
    def merge(cls, caches):
        return cls(
            [o for c in caches for o in c.offsets],
            [t for c in caches for t in c.tails],
            [r for c in caches for r in c.requests],
        )

    def filter(self, batch_indices):
        rows = list(batch_indices)
        self.offsets = [self.offsets[i] for i in rows]
        self.tails = [self.tails[i] for i in rows]
        self.requests = [self.requests[i] for i in rows]

    def extend(self, other):
        self.offsets += other.offsets
        self.tails += other.tails
        self.requests += other.requests

    def extract(self, idx):
        return OracleCache([self.offsets[idx]], [self.tails[idx]], [self.requests[idx]])


class ServerOracleDrafter(Drafter):
    """The model's drafter (``inner``) with its drafts replaced by each
    request's tokens (``truth``: a JSON file of prompt and continuation, read
    again when it changes), the first ``accepted(request, position)`` of a
    round right. The tokens the rows kept are written beside it
    (``<kind>-seen.json``), for ``--oracle-truth self``."""

    def __init__(self, inner, truth, accepted, vocab, stats=None):
        self.inner, self.truth = inner, Path(truth)
        self.accepted, self.vocab = accepted, vocab
        # Where the rows' rounds and kept tokens (totals) are written.
        self.stats = stats
        self.seen_file = (
            None
            if stats is None
            else stats.with_name(stats.name.replace("-rounds", "-seen"))
        )
        self.return_hidden = inner.return_hidden
        self._before = self._tokens = None
        self._mtime = None
        self._read_truth()

    def _read_truth(self):
        mtime = self.truth.stat().st_mtime_ns
        if mtime != self._mtime:
            self._mtime = mtime
            self.streams = json.loads(self.truth.read_text())
            self.seen = [list(s) for s in self.streams]
            # Requests whose tokens left the truth: wrong drafts from there.
            self.left = set()

    def make_cache(self):
        return self.inner.make_cache() + [OracleCache()]

    def check_cache(self, model_cache, cache):
        self.inner.check_cache(model_cache, cache[:-1])
        if not isinstance(cache[-1], OracleCache):
            raise TypeError("The prompt cache lacks the oracle's entry.")

    def prefill(self, cache, tokens, hidden, lengths):
        self.inner.prefill(cache[:-1], tokens, hidden, lengths)
        oracle = cache[-1]
        for b, (row, n) in enumerate(zip(tokens.tolist(), lengths)):
            oracle.offsets[b] += n
            oracle.tails[b] = (oracle.tails[b] + tuple(row[:n]))[-TAIL:]

    def _request(self, oracle, b):
        if oracle.requests[b] is None:
            offset, tail = oracle.offsets[b], oracle.tails[b]
            found = [
                i
                for i, s in enumerate(self.streams)
                if offset < len(s) and tuple(s[offset - len(tail) : offset]) == tail
            ]
            if len(found) != 1:
                print(f"oracle: {len(found)} requests match a row", file=sys.stderr)
            oracle.requests[b] = found[0] if len(found) == 1 else -1
            self.left.discard(oracle.requests[b])
        return oracle.requests[b]

    def draft(self, cache, inputs, num_draft, sample):
        drafted, _ = self.inner.draft(cache[:-1], inputs, num_draft, sample)
        # Each round: a prompt found in the server's cache skips the prefill.
        self._read_truth()
        N = drafted.shape[1]
        oracle = cache[-1]
        self._before = list(oracle.offsets)
        found = [self._request(oracle, b) for b in range(len(oracle.offsets))]
        if N == 0:
            return drafted, None
        rows = []
        for i, offset in zip(found, oracle.offsets):
            known = i >= 0 and i not in self.left
            row = list(self.streams[i][offset + 1 : offset + 1 + N]) if known else []
            row += [0] * (N - len(row))
            right = self.accepted(i, offset)
            if right < N:
                row[right] = (row[right] + 1) % self.vocab
            rows.append(row)
        return mx.array(rows, mx.uint32), None

    def accept(self, cache, accepted, hidden, tokens):
        self.inner.accept(cache[:-1], accepted, hidden, tokens)
        oracle = cache[-1]
        oracle.offsets = [o + tokens.shape[1] for o in oracle.offsets]
        self._tokens = tokens

    def trim(self, cache, counts):
        self.inner.trim(cache[:-1], counts)
        oracle = cache[-1]
        oracle.trim_rows(counts)
        # The round's tokens are on the host already (the loop's one sync).
        tokens = self._tokens.tolist()
        if len(tokens[0]) > 1:
            ROUNDS[0] += len(tokens)
            ROUNDS[1] += sum(len(t) - n for t, n in zip(tokens, counts))
        for b, (offset, n) in enumerate(zip(self._before, counts)):
            i = oracle.requests[b]
            if i < 0:
                continue
            kept = tokens[b][: len(tokens[b]) - n]
            seen = self.seen[i]
            end = min(offset + 1 + len(kept), len(seen))
            seen[offset + 1 : end] = kept[: max(end - offset - 1, 0)]
            if i in self.left:
                continue
            want = self.streams[i][offset + 1 : offset + 1 + len(kept)]
            if kept[: len(want)] != want:
                print(f"oracle: request {i} left its tokens", file=sys.stderr)
                self.left.add(i)

    def finish(self, cache):
        self.inner.finish(cache[:-1])
        # A row done (the batch extracts its cache): the totals so far.
        if self.stats is not None:
            self.stats.write_text(json.dumps(ROUNDS))
            self.seen_file.write_text(json.dumps(self.seen))


def acceptance(kind, args):
    """accepted(request, position): the drafts right in a round, drawn
    from the request's own generator at that position."""
    if kind == "mtp":

        def draw(rng):
            return per_position(MTP_RATES[: args.mtp_k], rng)()

    else:
        a = geometric(args.dspark_block, args.block_mean, random.Random(0))[1]

        def draw(rng):
            n = 0
            while n < args.dspark_block and rng.random() < a:
                n += 1
            return n

    def accepted(request, position):
        return draw(random.Random(f"{args.seed}/{request}/{position}"))

    return accepted


def serve(args, server_args):
    """The server with the model's drafter wrapped by the oracle."""
    from mlx_lm import server
    from mlx_lm.models import deepseek_v4

    make = deepseek_v4.Model.make_drafter
    accepted = acceptance(args.kind, args)

    stats = Path(args.truth).with_name(f"{args.kind}-rounds.json")

    def make_drafter(model):
        inner = make(model)
        vocab = model.args.vocab_size
        return ServerOracleDrafter(inner, args.truth, accepted, vocab, stats)

    deepseek_v4.Model.make_drafter = make_drafter
    sys.argv = ["mlx_lm.server", *server_args]
    server.main()


def save_folder(path, config, model):
    from mlx_lm.chat_templates.deepseek_v4 import special_tokens
    from mlx_lm.utils import save_model

    path.mkdir(parents=True, exist_ok=True)
    save_model(path, model)
    config = {k: v for k, v in config.items() if k != "mtp"}
    (path / "config.json").write_text(json.dumps(config, indent=2))
    make_tokenizer(path, config["vocab_size"], special_tokens, chat_template=None)


def launch(args, kind, folder, extra, truth, log):
    """A server of ``folder`` whose drafter the oracle wraps (``kind``:
    mtp, dspark or none), and its URL."""
    launcher = [sys.executable, __file__, "--serve", "--truth", str(truth)]
    launcher += ["--kind", kind, "--seed", str(args.seed), "--mtp-k", str(args.mtp_k)]
    launcher += ["--dspark-block", str(args.dspark_block)]
    launcher += ["--block-mean", str(args.block_mean), "--"]
    port = free_port()
    process = start_server(folder, port, log, launcher, extra)
    return process, f"http://127.0.0.1:{port}"


def complete(url, prompt, max_tokens, out):
    """One streamed greedy completion: its text, tokens, and the times of
    its first and last chunks."""
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    request = urllib.request.Request(
        url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    text, tokens, first, last = [], None, None, None
    with urllib.request.urlopen(request, timeout=3600) as response:
        for line in response:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                out["error"] = chunk["error"]
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                if choice.get("text"):
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    text.append(choice["text"])
    out.update(text="".join(text), tokens=tokens, first=first, last=last)


def run_requests(url, requests):
    """All ``requests`` (prompt, max_tokens, delay) at once; returns the
    wall time and each answer."""
    answers = [{} for _ in requests]
    start = time.perf_counter()

    def one(i):
        prompt, max_tokens, delay = requests[i]
        time.sleep(delay)
        complete(url, prompt, max_tokens, answers[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    for i, answer in enumerate(answers):
        if "error" in answer or answer.get("tokens") is None:
            raise RuntimeError(
                f"request {i} to {url} failed: {answer.get('error', 'no tokens')} "
                "(the server's log says why)"
            )
    return wall, answers


def rounds_so_far(work, kind):
    """A drafting server's rows' rounds and kept tokens, totals so far."""
    path = work / f"{kind}-rounds.json"
    return json.loads(path.read_text()) if path.exists() else [0, 0]


def feed(work, kind, url, requests, name, run):
    """--oracle-truth self: the requests sent (untimed) until the tokens
    the server kept are the oracle's, each time fed back as its tokens."""
    truth, seen = work / f"truth-{kind}.json", work / f"{kind}-seen.json"
    for _ in range(4):
        run_requests(url, requests)
        if json.loads(seen.read_text()) == json.loads(truth.read_text()):
            return
        truth.write_text(seen.read_text())
        print(f"  run {run} {name}: its own tokens fed back", flush=True)


def spread(values):
    values = sorted(values)
    return f"{statistics.median(values):.2f} ({values[0]:.2f}-{values[-1]:.2f})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=43, help="43: Flash's schedule")
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--tiny", action="store_true", help="tiny sizes for a CPU")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mtp-ratio", type=int, default=4)
    parser.add_argument("--markov-rank", type=int, default=256)
    parser.add_argument("--mtp-k", type=int, default=2)
    parser.add_argument("--dspark-block", type=int, default=5)
    parser.add_argument("--block-mean", type=float, default=3.0)
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--prompt-words", type=int, default=160)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--one-at-a-time",
        action="store_true",
        help="each server alone on the device, its runs in a row (where three "
        "copies of the model do not fit)",
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kind", help=argparse.SUPPRESS)
    parser.add_argument(
        "--oracle-truth",
        choices=["plain", "self"],
        default="plain",
        help="the oracle's tokens: one-row greedy's, or the server's own "
        "(in bf16 a batch can round to others; fed back until they repeat)",
    )
    parser.add_argument("--truth", help=argparse.SUPPRESS)
    argv = sys.argv[1:]
    server_args = []
    if "--" in argv:
        at = argv.index("--")
        argv, server_args = argv[:at], argv[at + 1 :]
    args = parser.parse_args(argv)
    if args.serve:
        serve(args, server_args)
        return

    from mlx_lm import load
    from mlx_lm.generate import generate_step

    work = Path(tempfile.mkdtemp(prefix="dsv4_server_oracle_"))
    config, model = build(args)
    dconfig, dmodel = build_dspark(args, config, model)
    save_folder(work / "mtp", config, model)
    save_folder(work / "dspark", dconfig, dmodel)
    del model, dmodel
    # The servers share the device: this process keeps none of its memory.
    mx.clear_cache()
    print(
        f"DeepSeek-V4: {config['num_hidden_layers']} layers, hidden "
        f"{config['hidden_size']}, {config['n_routed_experts']} experts, "
        f"{args.dtype}, {mx.default_device()}; folders in {work}"
    )

    # Every run's requests: prompts of different lengths, answers of
    # different lengths, sent 0.1 s apart.
    target, tokenizer = load(str(work / "mtp"))
    rng = random.Random(args.seed)
    runs, streams = [], []
    for _ in range(args.repeat + 1):
        requests = []
        for i in range(args.requests):
            words = args.prompt_words * (i + 2) // 2
            prompt = " ".join(rng.choice(WORDS) for _ in range(words))
            max_tokens = args.max_tokens * (i + 2) // 2
            requests.append((prompt, max_tokens, 0.1 * i))
            ids = tokenizer.encode(prompt)
            answer = [
                t
                for (t, _), _ in zip(
                    generate_step(mx.array(ids), target), range(max_tokens)
                )
            ]
            streams.append(ids + answer)
        runs.append(requests)
    # Each drafting server's oracle reads its own file (--oracle-truth self
    # rewrites it).
    for kind in ("none", "mtp", "dspark"):
        (work / f"truth-{kind}.json").write_text(json.dumps(streams))
    del target
    mx.clear_cache()
    print(f"plain tokens of {len(streams)} prompts (one row, generate_step)")

    servers = {
        "plain": (work / "mtp", []),
        f"MTP k={args.mtp_k}": (
            work / "mtp",
            ["--mtp", "--num-draft-tokens", str(args.mtp_k)],
        ),
        f"DSpark block {args.dspark_block}": (
            work / "dspark",
            ["--mtp", "--num-draft-tokens", str(args.dspark_block)],
        ),
    }
    kinds = {"plain": "none", f"MTP k={args.mtp_k}": "mtp"}
    processes, urls, logs = {}, {}, {}
    # Run 0 warms up: its answers are checked, not timed.
    results = {name: [] for name in servers}
    kept = {name: [0, 0] for name in servers}

    def start(name):
        folder, extra = servers[name]
        kind = kinds.get(name, "dspark")
        logs[name] = work / f"{name.split()[0]}.log"
        truth = work / f"truth-{kind}.json"
        log = open(logs[name], "w")
        processes[name], urls[name] = launch(args, kind, folder, extra, truth, log)

    def stop(name):
        process = processes.pop(name)
        process.terminate()
        process.wait()

    def one_run(name, r, requests):
        kind = kinds.get(name, "dspark")
        if args.oracle_truth == "self" and kind == "none":
            # As the drafting servers: the prompts in its cache.
            run_requests(urls[name], requests)
        elif args.oracle_truth == "self":
            feed(work, kind, urls[name], requests, name, r)
        before = rounds_so_far(work, kind)
        wall, answers = run_requests(urls[name], requests)
        after = rounds_so_far(work, kind)
        kept[name] = [k + b - a for k, a, b in zip(kept[name], before, after)]
        results[name].append((wall, answers))
        total = sum(a["tokens"] for a in answers)
        print(f"  run {r} {name}: {total / wall:.2f} tok/s", flush=True)

    try:
        if args.one_at_a_time:
            for name in servers:
                start(name)
                for r, requests in enumerate(runs):
                    one_run(name, r, requests)
                stop(name)
        else:
            for name in servers:
                start(name)
            for r, requests in enumerate(runs):
                for name in servers:
                    one_run(name, r, requests)
    finally:
        for name in list(processes):
            stop(name)

    print(
        f"\n{args.requests} concurrent requests a run (prompts of "
        f"{args.prompt_words}-{args.prompt_words * (args.requests + 1) // 2} words, "
        f"answers of {args.max_tokens}-{args.max_tokens * (args.requests + 1) // 2} "
        f"tokens), medians of {args.repeat} "
        f"{'runs, one server at a time' if args.one_at_a_time else 'alternated runs'}"
        " (min-max); tokens "
        "a round: the rows' mean over the rounds of these runs and the warm-up"
    )
    print(
        f"{'server':18} {'aggregate tok/s':>22} {'x plain':>8} "
        f"{'per-request tok/s':>22} {'x plain':>8} {'tokens a round':>15} "
        f"{'!= plain':>9} {'oracle':>7}"
    )
    plain = results["plain"][1:]

    def aggregate(runs_):
        return [sum(a["tokens"] for a in answers) / wall for wall, answers in runs_]

    def per_request(runs_):
        return [
            statistics.median(
                (a["tokens"] - 1) / (a["last"] - a["first"]) for a in answers
            )
            for _, answers in runs_
        ]

    for name, all_runs in results.items():
        runs_ = all_runs[1:]
        agg, req = aggregate(runs_), per_request(runs_)
        agg_x = statistics.median(a / b for a, b in zip(agg, aggregate(plain)))
        req_x = statistics.median(a / b for a, b in zip(req, per_request(plain)))
        differ = sum(
            a["text"] != b["text"] or a["tokens"] != b["tokens"]
            for (_, x), (_, y) in zip(all_runs, results["plain"])
            for a, b in zip(x, y)
        )
        notes = logs[name].read_text().count("oracle:")
        rows, tokens = kept[name] if kept[name][0] else (1, 1)
        print(
            f"{name:18} {spread(agg):>22} {agg_x:>8.2f} {spread(req):>22} "
            f"{req_x:>8.2f} {tokens / rows:>15.2f} {differ:>9} {notes:>7}"
        )


if __name__ == "__main__":
    main()
