# Copyright © 2026 Apple Inc.
"""Soak ``mlx_lm.server`` with the ``openai`` client on tiny random models.

For each model type it builds a tiny model folder (as ``long_decode.py``
does), starts ``mlx_lm.server`` on loopback and sends ``--requests`` chat
requests, ``--concurrency`` at a time: streaming and not, with and without
tools, prompts up to ``--max-prompt`` tokens (90% share a long system
prompt, so the prompt cache serves it), answers up to ``--max-answer``
tokens, and some cancelled midway (a stream closed after a few chunks, a
request whose client times out). Every 50 requests it reads the server's
resident memory from outside (psutil). At the end it prints the errors,
the requests completed and cancelled, p50/p95 latency and the memory.

    python benchmarks/server_soak.py --requests 1000
    python benchmarks/server_soak.py --model-type qwen3_5 --requests 100 \\
        --max-prompt 400 --max-answer 64
"""

import argparse
import json
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from long_decode import CONFIGS, make_model_folder

REPORT_EVERY = 50

WORDS = (
    "the quick brown fox jumps over lazy dog long generations must not grow "
    "graph behind cache write story about lighthouse keeper and sea a of to "
    "in is was for on with as by at from server request answer token model"
).split()

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(folder, port, log, launcher=None, extra=()):
    """``mlx_lm.server`` on ``folder`` (``launcher``: the command line that
    runs it in place of ``python -m mlx_lm server``; ``extra``: more of its
    arguments), once it answers /health."""
    launcher = launcher or [sys.executable, "-m", "mlx_lm", "server"]
    cmd = [*launcher, "--model", str(folder)]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "WARNING"]
    cmd += list(extra)
    process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/health"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"mlx_lm.server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return process
        except OSError:
            time.sleep(0.5)
    process.kill()
    raise RuntimeError("mlx_lm.server did not answer /health")


def make_text(rng, tokenizer, n_tokens):
    """Random words, cut to at most ``n_tokens`` tokens."""
    words = [rng.choice(WORDS) for _ in range(n_tokens)]
    tokens = tokenizer.encode(" ".join(words), add_special_tokens=False)
    return tokenizer.decode(tokens[:n_tokens])


def make_workload(rng, tokenizer, n, max_prompt, max_answer):
    """The requests of a run: their messages, options and how each ends."""
    document = make_text(rng, tokenizer, max_prompt * 3 // 4)
    requests = []
    for _ in range(n):
        question = make_text(rng, tokenizer, rng.randint(4, 24))
        if rng.random() < 0.9:
            # One long system prompt: the server caches it as a segment.
            system = "Answer from this document.\n" + document
        else:
            # Log-uniform lengths: mostly short prompts, a few long ones.
            length = int(round(16 * (max_prompt / 16) ** rng.random()))
            system = make_text(rng, tokenizer, length)
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ]
        u = rng.random()
        if u < 0.75:
            max_tokens = rng.randint(1, 32)
        elif u < 0.98:
            max_tokens = rng.randint(32, max(32, max_answer // 10))
        else:
            max_tokens = rng.randint(max_answer // 10, max_answer)
        stream = rng.random() < 0.5
        cancel = None
        if rng.random() < 0.1:
            # Streams close after a few chunks; others give up waiting.
            max_tokens = max_answer
            cancel = rng.randint(1, 8) if stream else rng.uniform(0.5, 2.0)
        requests.append(
            dict(
                messages=messages,
                max_tokens=max_tokens,
                stream=stream,
                tools=TOOLS if rng.random() < 0.2 else None,
                cancel=cancel,
            )
        )
    return requests


def check_usage(usage, finish_reason, max_tokens):
    if finish_reason not in ("stop", "length", "tool_calls"):
        raise AssertionError(f"finish_reason {finish_reason!r}")
    n = usage.completion_tokens
    if n > max_tokens or (finish_reason == "length" and n != max_tokens):
        raise AssertionError(f"{n} tokens for max_tokens {max_tokens}")


def send(client, model_id, request):
    """Send one request. Return "completed" or "cancelled" and the usage."""
    import openai

    kwargs = dict(
        model=model_id, messages=request["messages"], max_tokens=request["max_tokens"]
    )
    if request["tools"]:
        kwargs["tools"] = request["tools"]
    cancel = request["cancel"]
    if not request["stream"]:
        if cancel is not None:
            client = client.with_options(timeout=cancel)
        try:
            answer = client.chat.completions.create(**kwargs)
        except openai.APITimeoutError:
            return "cancelled", None
        choice = answer.choices[0]
        check_usage(answer.usage, choice.finish_reason, request["max_tokens"])
        return "completed", answer.usage

    stream = client.chat.completions.create(
        stream=True, stream_options={"include_usage": True}, **kwargs
    )
    finish_reason, usage = None, None
    with stream:
        for n, chunk in enumerate(stream, start=1):
            if cancel is not None and n >= cancel:
                return "cancelled", None
            if chunk.choices and chunk.choices[0].finish_reason:
                finish_reason = chunk.choices[0].finish_reason
            if chunk.usage is not None:
                usage = chunk.usage
    if usage is None:
        raise AssertionError("the stream ended without its usage chunk")
    check_usage(usage, finish_reason, request["max_tokens"])
    return "completed", usage


def percentile(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def soak(
    model_type,
    requests=100,
    concurrency=8,
    max_prompt=2000,
    max_answer=1000,
    seed=0,
    warmup=0,
    log=None,
    verbose=True,
    report_every=REPORT_EVERY,
):
    """Run the soak on one tiny model; return its figures as a dict.

    ``warmup`` requests with the longest prompts and answers go first, all at
    once, to fill the prompt cache and reach the largest batches. Memory is
    read every ``report_every`` requests."""
    import openai
    import psutil
    from transformers import AutoTokenizer

    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        folder = make_model_folder(Path(tmp) / model_type, model_type, seed=seed)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        workload = make_workload(rng, tokenizer, requests, max_prompt, max_answer)
        longest = [
            dict(
                messages=[
                    {"role": "user", "content": make_text(rng, tokenizer, max_prompt)}
                ],
                max_tokens=max_answer,
                stream=False,
                tools=None,
                cancel=None,
            )
            for _ in range(warmup)
        ]
        port = free_port()
        log = log or subprocess.DEVNULL
        process = start_server(folder, port, log)
        try:
            server = psutil.Process(process.pid)
            client = openai.OpenAI(
                base_url=f"http://127.0.0.1:{port}/v1",
                api_key="none",
                max_retries=0,
                timeout=1800,
            )
            model_id = client.models.list().data[-1].id
            with ThreadPoolExecutor(max(warmup, 1)) as pool:
                for _ in pool.map(lambda r: send(client, model_id, r), longest):
                    pass
            results = run_workload(
                client, model_id, workload, concurrency, server, verbose, report_every
            )
            results["server_alive"] = process.poll() is None
        finally:
            process.terminate()
            process.wait(timeout=60)
    results.update(model_type=model_type, requests=requests)
    return results


def run_workload(
    client, model_id, workload, concurrency, server, verbose, report_every
):
    lock = threading.Lock()
    latencies, errors, outcomes = [], [], {"completed": 0, "cancelled": 0}
    prompt_tokens = cached_tokens = completion_tokens = 0
    rss = []

    def one(request):
        nonlocal prompt_tokens, cached_tokens, completion_tokens
        tic = time.perf_counter()
        try:
            outcome, usage = send(client, model_id, request)
        except Exception as e:
            with lock:
                errors.append(f"{type(e).__name__}: {e}")
            return
        toc = time.perf_counter()
        with lock:
            outcomes[outcome] += 1
            if outcome == "completed":
                latencies.append(toc - tic)
                prompt_tokens += usage.prompt_tokens
                completion_tokens += usage.completion_tokens
                details = usage.prompt_tokens_details
                cached_tokens += (details.cached_tokens or 0) if details else 0

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        # Blocks of report_every requests: memory is read when a block is done
        # and the server idle, so the readings compare like with like.
        for first in range(0, len(workload), report_every):
            block = workload[first : first + report_every]
            for _ in as_completed([pool.submit(one, r) for r in block]):
                pass
            n = first + len(block)
            rss.append((n, idle_memory(server)))
            if verbose:
                print(
                    f"{n:>6} requests  errors {len(errors)}  "
                    f"completed {outcomes['completed']}  "
                    f"cancelled {outcomes['cancelled']}  "
                    f"p50 {percentile(latencies, 0.5):6.2f} s  "
                    f"p95 {percentile(latencies, 0.95):6.2f} s  "
                    f"cached {cached_tokens}/{prompt_tokens} prompt tokens  "
                    f"rss {rss[-1][1] / 2**20:7.1f} MiB",
                    flush=True,
                )
    return dict(
        seconds=time.perf_counter() - start,
        errors=errors,
        completed=outcomes["completed"],
        cancelled=outcomes["cancelled"],
        p50=percentile(latencies, 0.5),
        p95=percentile(latencies, 0.95),
        prompt_tokens=prompt_tokens,
        cached_tokens=cached_tokens,
        completion_tokens=completion_tokens,
        rss=rss,
    )


def idle_memory(server, interval=0.25, patience=120):
    """The server's resident memory once it is idle.

    A block is done when its last client has its answer or gave up; the
    server may still be serving a cancelled request or freeing a finished
    one. Wait until its CPU time grows by at most a clock tick (10 ms) in
    ``interval`` seconds, or ``patience`` seconds have passed."""
    used = sum(server.cpu_times()[:2])
    for _ in range(int(patience / interval)):
        time.sleep(interval)
        before, used = used, sum(server.cpu_times()[:2])
        if used - before <= 0.01:
            break
    return server.memory_info().rss


def rss_growth(rss, over=REPORT_EVERY):
    """How far the last reading of resident memory rises above every reading
    taken ``over`` or more requests before it, relative to the highest of
    them (0 if it does not): a leak grows it, a batch freed does not."""
    n, last = rss[-1]
    earlier = [b for m, b in rss if m <= n - over]
    if not earlier:
        return float("nan")
    return max(0.0, last - max(earlier)) / max(earlier)


def rss_drift(rss):
    """The relative change of resident memory over the last 50 requests."""
    if len(rss) < 2:
        return float("nan")
    (_, before), (_, after) = rss[-2], rss[-1]
    return abs(after - before) / before


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model-type", choices=CONFIGS, action="append", help="default: all"
    )
    parser.add_argument("--requests", type=int, default=100, help="per model")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-prompt", type=int, default=2000)
    parser.add_argument("--max-answer", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--warmup", type=int, default=0, help="requests of the longest sizes first"
    )
    parser.add_argument("--server-log", help="append the servers' output here")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    # Stop the server also when this script is killed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))

    log = open(args.server_log, "a") if args.server_log else None
    figures = []
    for model_type in args.model_type or list(CONFIGS):
        print(f"{model_type}: {args.requests} requests, {args.concurrency} at a time")
        r = soak(
            model_type,
            requests=args.requests,
            concurrency=args.concurrency,
            max_prompt=args.max_prompt,
            max_answer=args.max_answer,
            seed=args.seed,
            warmup=args.warmup,
            log=log,
        )
        figures.append(r)
        print(
            f"{model_type}: {len(r['errors'])} errors, {r['completed']} completed, "
            f"{r['cancelled']} cancelled in {r['seconds']:.0f} s; "
            f"p50 {r['p50']:.2f} s, p95 {r['p95']:.2f} s; "
            f"{r['completion_tokens']} tokens generated, "
            f"{r['cached_tokens']} of {r['prompt_tokens']} prompt tokens cached; "
            f"rss change over the last 50 requests {100 * rss_drift(r['rss']):.2f}%, "
            f"growth above every reading 50 or more requests before the last "
            f"{100 * rss_growth(r['rss']):.2f}%"
        )
        for e in r["errors"][:10]:
            print("  error:", e)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
