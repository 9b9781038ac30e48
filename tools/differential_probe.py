# Copyright © 2026 Apple Inc.
"""One side of the differential check (tools/differential.py): run mlx_lm's
CLIs, its server and its Python API on tiny model folders and write what they
give, normalised (no timings, ids, dates, ports or paths), as JSON.

It runs under the fork's Python and under the pristine release's, with the
same arguments, and imports nothing of the fork's."""

import argparse
import contextlib
import http.client
import io
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

# Keys whose values change from run to run (ids: but a model's path).
DROP = {"id", "created", "system_fingerprint", "prompt_tps", "generation_tps"}
DROP |= {"peak_memory", "fingerprint"}
PROMPT = "The quick brown fox"
NATO = "Alpha Bravo Charlie Delta Echo Foxtrot Golf Hotel India Juliett Kilo"
NATO = (NATO + " Lima Mike November Oscar Papa Quebec Romeo Sierra Tango").split()
MAX_TOKENS = 10
CHAT, COMP = "/v1/chat/completions", "/v1/completions"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


class Normaliser:
    def __init__(self, replace):
        # Longest first, so a folder inside another is replaced as itself.
        self.replace = sorted(replace.items(), key=lambda kv: -len(kv[0]))

    def text(self, s):
        for old, new in self.replace:
            s = s.replace(old, new)
        s = re.sub(r"[\d.]+ tokens-per-sec", "<n> tokens-per-sec", s)
        # cache_prompt pads its progress line to the longest one so far.
        s = re.sub(r"\( *[\d.]+ tok/s\) *", "(<n> tok/s)", s)
        s = re.sub(r"[\d.]+ tok/s", "<n> tok/s", s)
        s = re.sub(r"(Peak memory:|peak) [\d.]+ GB", r"\1 <n> GB", s)
        s = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:<port>", s)
        s = re.sub(r"\b(0x)[0-9a-f]{6,}", r"\1<addr>", s)
        if "Traceback (most recent call last)" in s:
            # Line numbers move with every patch: the exception alone.
            head, _, tail = s.partition("Traceback (most recent call last)")
            lines = tail.splitlines()
            frames = [i for i, x in enumerate(lines) if x.startswith("  File ")]
            i = frames[-1] + 1 if frames else 0
            while i < len(lines) and lines[i].startswith("    "):
                i += 1
            s = head + "Traceback: " + "\n".join(lines[i:]).strip()
        return s

    def __call__(self, obj):
        if isinstance(obj, dict):
            return {
                str(k): self(v)
                for k, v in obj.items()
                if k not in DROP or (k == "id" and self.text(str(v)).startswith("<"))
            }
        if isinstance(obj, (list, tuple)):
            return [self(v) for v in obj]
        if isinstance(obj, float):
            return obj if not math.isfinite(obj) else round(obj, 4)
        if isinstance(obj, str):
            return self.text(obj)
        if obj is None or isinstance(obj, (bool, int)):
            return obj
        return self.text(repr(obj))


def error_of(e):
    return f"{type(e).__name__}: {e}"


@contextlib.contextmanager
def captured(stdin=""):
    out, err = io.StringIO(), io.StringIO()
    old = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield out, err
    finally:
        sys.stdin = old


def cli(module, argv, stdin=""):
    """``mlx_lm.<module>`` with ``argv``, in this process: its exit status,
    stdout and stderr."""
    import importlib

    main = importlib.import_module(f"mlx_lm.{module}").main
    old_argv = sys.argv
    sys.argv = [f"mlx_lm.{module}", *map(str, argv)]
    code = 0
    with captured(stdin) as (out, err):
        try:
            main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if isinstance(e.code, str):
                print(e.code, file=sys.stderr)
        except Exception:
            code = 1
            traceback.print_exc()
        finally:
            sys.argv = old_argv
    return {"rc": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


def folder_summary(path):
    """A model folder: its files, config and every tensor's name, shape,
    dtype and a digest of its values."""
    import hashlib

    import mlx.core as mx

    path = Path(path)
    if not path.is_dir():
        return None
    out = {"files": sorted(p.name for p in path.iterdir())}
    if (path / "config.json").is_file():
        out["config"] = json.loads((path / "config.json").read_text())
    tensors = {}
    for f in sorted(path.glob("*.safetensors")):
        for k, v in sorted(mx.load(str(f)).items()):
            digest = hashlib.sha256(memoryview(v.astype(mx.float32))).hexdigest()
            tensors[k] = [list(v.shape), str(v.dtype), digest[:16]]
    out["tensors"] = tensors
    return out


def cache_file_summary(path):
    import mlx.core as mx

    if not Path(path).is_file():
        return None
    arrays, metadata = mx.load(str(path), return_metadata=True)
    shapes = {k: [list(v.shape), str(v.dtype)] for k, v in sorted(arrays.items())}
    return {"arrays": shapes, "metadata": dict(sorted(metadata.items()))}


# ----------------------------------------------------------------------------
# The CLIs


def run_clis(name, model, work):
    out = {}
    gen = ["--model", model, "--max-tokens", MAX_TOKENS]
    out["generate"] = cli("generate", gen + ["--prompt", PROMPT])
    out["generate.raw"] = cli(
        "generate", gen + ["--prompt", PROMPT, "--ignore-chat-template"]
    )
    out["generate.sampled"] = cli(
        "generate", gen + ["--prompt", PROMPT, "--temp", "0.8", "--seed", "3"]
    )
    out["generate.system"] = cli(
        "generate", gen + ["--prompt", PROMPT, "--system-prompt", "Be brief."]
    )
    if name == "qwen3_5":
        for on in ("true", "false"):
            config = '{"enable_thinking": %s}' % on
            out[f"generate.thinking_{on}"] = cli(
                "generate",
                gen + ["--prompt", PROMPT, "--chat-template-config", config],
            )
    out["generate.bad_model"] = cli(
        "generate", ["--model", f"{work}/missing", "--prompt", PROMPT]
    )
    out["chat"] = cli(
        "chat", ["--model", model, "--max-tokens", MAX_TOKENS], "Hello\nq\n"
    )
    out["chat.two_turns"] = cli(
        "chat", ["--model", model, "--max-tokens", 6], "Hello\nAnd then?\nq\n"
    )
    cache = f"{work}/{name}-cache.safetensors"
    out["cache_prompt"] = cli(
        "cache_prompt",
        ["--model", model, "--prompt-cache-file", cache, "--prompt", PROMPT * 3],
    )
    out["cache_prompt.file"] = cache_file_summary(cache)
    out["cache_prompt.bad_model"] = cli(
        "cache_prompt",
        ["--model", f"{work}/missing", "--prompt-cache-file", f"{cache}.none"]
        + ["--prompt", PROMPT],
    )
    out["generate.from_cache"] = cli(
        "generate",
        gen + ["--prompt-cache-file", cache, "--prompt", " jumps over"],
    )
    for label, extra in (
        ("q4", ["-q"]),
        ("q8g32", ["-q", "--q-bits", "8", "--q-group-size", "32"]),
        ("mixed_3_6", ["-q", "--quant-predicate", "mixed_3_6"]),
        ("bf16", ["--dtype", "bfloat16"]),
    ):
        dest = f"{work}/{name}-{label}"
        out[f"convert.{label}"] = cli(
            "convert", ["--hf-path", model, "--mlx-path", dest, *extra]
        )
        out[f"convert.{label}.folder"] = folder_summary(dest)
        out[f"convert.{label}.generate"] = cli(
            "generate", ["--model", dest, "--prompt", PROMPT, "--max-tokens", 6]
        )
    return out


# ----------------------------------------------------------------------------
# The Python API


def top(logprobs, n=3):
    import mlx.core as mx

    ids = mx.argsort(-logprobs)[:n].tolist()
    return [[i, logprobs[i].item()] for i in ids]


def run_api(name, model_path, work):
    import mlx.core as mx

    from mlx_lm import batch_generate, generate, load, stream_generate
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.sample_utils import make_sampler

    out = {}
    model, tokenizer = load(model_path)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": PROMPT},
    ]
    out["load"] = {
        "class": type(model).__module__ + "." + type(model).__name__,
        "model_type": getattr(model, "model_type", None),
        "layers": len(model.layers),
        "eos_token_ids": sorted(tokenizer.eos_token_ids),
        "has_thinking": tokenizer.has_thinking,
        "has_tool_calling": tokenizer.has_tool_calling,
        "chat": tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        ),
        "chat.tools": tokenizer.apply_chat_template(
            messages, tools=TOOLS, add_generation_prompt=True, tokenize=False
        ),
    }
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    out["generate"] = generate(model, tokenizer, prompt, max_tokens=MAX_TOKENS)
    with captured() as (stdout, _):
        generate(model, tokenizer, PROMPT, max_tokens=MAX_TOKENS, verbose=True)
    out["generate.verbose"] = stdout.getvalue()
    mx.random.seed(0)
    out["generate.sampled"] = generate(
        model,
        tokenizer,
        prompt,
        max_tokens=MAX_TOKENS,
        sampler=make_sampler(temp=0.8, top_p=0.9),
    )
    steps = []
    for r in stream_generate(model, tokenizer, prompt, max_tokens=MAX_TOKENS):
        steps.append(
            {
                "text": r.text,
                "token": r.token,
                "top": top(r.logprobs),
                "from_draft": r.from_draft,
                "prompt_tokens": r.prompt_tokens,
                "generation_tokens": r.generation_tokens,
                "finish_reason": r.finish_reason,
            }
        )
    out["stream_generate"] = steps
    # Two turns on one prompt cache.
    cache = make_prompt_cache(model)
    turns = []
    for text in (PROMPT, " over the lazy dog"):
        tokens = tokenizer.encode(text, add_special_tokens=not turns)
        turns.append(
            "".join(
                r.text
                for r in stream_generate(
                    model, tokenizer, tokens, max_tokens=6, prompt_cache=cache
                )
            )
        )
    out["stream_generate.prompt_cache"] = turns
    prompts = [
        tokenizer.encode(p)
        for p in (PROMPT, "Hello", "Write a story about a lighthouse keeper.")
    ]
    r = batch_generate(model, tokenizer, prompts, max_tokens=8)
    out["batch_generate"] = r.texts
    r = batch_generate(model, tokenizer, prompts, max_tokens=[3, 8, 5])
    out["batch_generate.max_tokens_each"] = r.texts
    del model
    return out


def run_load_variants(name, model_path, work):
    """Folders that real checkpoints resemble."""
    from mlx_lm import generate, load

    out = {}
    variants = {}
    if name == "llama":
        # A bool where the config class has an int (sliding_window: false).
        variants["bool_in_int"] = {"sliding_window": False}
    for label, change in variants.items():
        dest = Path(work) / f"{name}-{label}"
        shutil.copytree(model_path, dest)
        config = json.loads((dest / "config.json").read_text())
        config.update(change)
        (dest / "config.json").write_text(json.dumps(config))
        try:
            model, tokenizer = load(str(dest))
            out[label] = generate(model, tokenizer, PROMPT, max_tokens=6)
        except Exception as e:
            out[label] = {"error": error_of(e)}
    return out


# ----------------------------------------------------------------------------
# The server


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``mlx_lm.server`` in a process of its own (a request that kills it
    then kills only it)."""

    def __init__(self, model, log):
        self.model, self.log = model, log
        self.start()

    def start(self):
        self.port = free_port()
        cmd = [sys.executable, "-m", "mlx_lm", "server", "--model", self.model]
        cmd += ["--port", str(self.port), "--log-level", "WARNING"]
        self.proc = subprocess.Popen(
            cmd, stdout=self.log, stderr=subprocess.STDOUT, env=os.environ
        )
        self.ready = False

    def wait(self, timeout=120):
        deadline = time.monotonic() + timeout
        while not self.ready:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode})")
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            try:
                self.ready = self.raw("GET", "/v1/models")[0] == 200
            except OSError:
                time.sleep(0.2)

    def raw(self, method, path, body=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        headers = {"Content-Type": "application/json"}
        conn.request(method, path, body, headers)
        r = conn.getresponse()
        data = r.read().decode("utf-8", "replace")
        conn.close()
        return r.status, r.getheader("Content-Type"), data

    def request(self, method, path, body=None):
        """One request: status, content type, the answer (JSON, the events of
        a stream, or text) and whether the server lived through it."""
        self.wait()
        if body is not None and not isinstance(body, str):
            body = json.dumps(body)
        try:
            status, ctype, data = self.raw(method, path, body)
            out = {"status": status, "content_type": ctype}
            out["body"] = decode_body(ctype, data)
            died = "generation thread died" in data
        except OSError as e:
            out = {"error": type(e).__name__}
            died = True
        time.sleep(0.05)
        out["server_alive"] = self.proc.poll() is None
        if not out["server_alive"]:
            out["server_exit"] = self.proc.returncode
            self.start()
        elif died:
            # Its generation thread is gone (every later request would fail
            # alike): the next case gets a fresh server.
            self.close()
            self.start()
        return out

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def decode_body(ctype, data):
    if ctype and ctype.startswith("text/event-stream"):
        events = []
        for line in data.splitlines():
            if line.startswith("data: "):
                payload = line[len("data: ") :]
                try:
                    events.append(json.loads(payload))
                except ValueError:
                    events.append(payload)
            elif line.strip():
                events.append({"line": line})
        return events
    try:
        return json.loads(data)
    except ValueError:
        return data


def user(text=PROMPT):
    return [{"role": "user", "content": text}]


def server_requests(name, tokenizer_vocab):
    """(case, method, path, body) of every request, in order."""
    chat = {"messages": user(), "max_tokens": MAX_TOKENS}
    comp = {"prompt": PROMPT, "max_tokens": MAX_TOKENS}
    cases = [
        ("models", "GET", "/v1/models", None),
        ("health", "GET", "/health", None),
        ("chat", "POST", "/v1/chat/completions", chat),
        ("chat.repeat", "POST", "/v1/chat/completions", chat),
        ("chat.stream", "POST", "/v1/chat/completions", {**chat, "stream": True}),
        (
            "chat.stream_usage",
            "POST",
            "/v1/chat/completions",
            {**chat, "stream": True, "stream_options": {"include_usage": True}},
        ),
        (
            "chat.system",
            "POST",
            "/v1/chat/completions",
            {**chat, "messages": [{"role": "system", "content": "Be brief."}] + user()},
        ),
        (
            "chat.multi_turn",
            "POST",
            "/v1/chat/completions",
            {
                **chat,
                "messages": user("Hello")
                + [{"role": "assistant", "content": "Hello! How are you?"}]
                + user("Fine, thank you."),
            },
        ),
        (
            "chat.developer_role",
            "POST",
            "/v1/chat/completions",
            {
                **chat,
                "messages": [{"role": "developer", "content": "Be brief."}] + user(),
            },
        ),
        (
            "chat.max_tokens_1",
            "POST",
            "/v1/chat/completions",
            {**chat, "max_tokens": 1},
        ),
        (
            "chat.max_tokens_0",
            "POST",
            "/v1/chat/completions",
            {**chat, "max_tokens": 0},
        ),
        (
            "chat.sampled",
            "POST",
            "/v1/chat/completions",
            {**chat, "temperature": 0.8, "top_p": 0.9, "seed": 3},
        ),
        (
            "chat.penalties",
            "POST",
            "/v1/chat/completions",
            {**chat, "repetition_penalty": 1.3, "presence_penalty": 0.5},
        ),
        (
            "chat.logprobs",
            "POST",
            "/v1/chat/completions",
            {**chat, "logprobs": True, "top_logprobs": 3},
        ),
        (
            "chat.logprobs_only",
            "POST",
            "/v1/chat/completions",
            {**chat, "logprobs": True},
        ),
        (
            "chat.logprobs_stream",
            "POST",
            "/v1/chat/completions",
            {**chat, "logprobs": True, "top_logprobs": 2, "stream": True},
        ),
        ("completions", "POST", "/v1/completions", comp),
        ("completions.repeat", "POST", "/v1/completions", comp),
        ("completions.stream", "POST", "/v1/completions", {**comp, "stream": True}),
        ("completions.logprobs", "POST", "/v1/completions", {**comp, "logprobs": 3}),
        (
            "completions.logprobs_stream",
            "POST",
            "/v1/completions",
            {**comp, "logprobs": 2, "stream": True},
        ),
        (
            "completions.long_prompt",
            "POST",
            "/v1/completions",
            {**comp, "prompt": "The quick brown fox jumps. " * 120, "max_tokens": 3},
        ),
        # Stop words: words of the answer to the same request without them
        # (run_server fills them in from the answers named).
        (
            "chat.stop",
            "POST",
            "/v1/chat/completions",
            {**chat, "stop": "<word of chat>"},
        ),
        (
            "chat.stop_stream",
            "POST",
            "/v1/chat/completions",
            {**chat, "stop": "<word of chat>", "stream": True},
        ),
        (
            "completions.stop",
            "POST",
            "/v1/completions",
            {**comp, "stop": ["<word of completions>"]},
        ),
        (
            "completions.stop_stream",
            "POST",
            "/v1/completions",
            {**comp, "stop": ["<word of completions>"], "stream": True},
        ),
        # A stop word the model generates as a token of its own.
        ("chat.stop_piece", "POST", CHAT, {**chat, "stop": "<piece of chat.stream>"}),
        (
            "chat.stop_piece_stream",
            "POST",
            CHAT,
            {**chat, "stop": ["<piece of chat.stream>"], "stream": True},
        ),
        (
            "completions.stop_piece",
            "POST",
            COMP,
            {**comp, "stop": ["<piece of completions.stream>"]},
        ),
        (
            "completions.stop_piece_stream",
            "POST",
            COMP,
            {**comp, "stop": "<piece of completions.stream>", "stream": True},
        ),
        ("chat.tools", "POST", "/v1/chat/completions", {**chat, "tools": TOOLS}),
        (
            "chat.tool_history",
            "POST",
            "/v1/chat/completions",
            {
                **chat,
                "tools": TOOLS,
                "messages": user("The weather in Paris?")
                + [
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {
                                    "name": "get_weather",
                                    "arguments": '{"city": "Paris"}',
                                },
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
                ],
            },
        ),
    ]
    start, end = tokenizer_vocab.get("<tool_call>"), tokenizer_vocab.get("</tool_call>")
    if start is not None:
        # Random weights call no tool: the bias makes every token the start
        # of a call (never ended), or a start or an end.
        for label, bias in (
            ("unterminated", {str(start): 100}),
            ("empty", {str(start): 100, str(end): 100}),
        ):
            for stream in (False, True):
                case = f"chat.tool_call_{label}" + ("_stream" if stream else "")
                body = {**chat, "tools": TOOLS, "logit_bias": bias, "stream": stream}
                cases.append((case, "POST", "/v1/chat/completions", body))
    if name == "qwen3_5":
        for kwargs in ({"enable_thinking": True}, {"enable_thinking": False}):
            on = "on" if kwargs["enable_thinking"] else "off"
            for stream in (False, True):
                case = f"chat.thinking_{on}" + ("_stream" if stream else "")
                body = {**chat, "chat_template_kwargs": kwargs, "stream": stream}
                cases.append((case, "POST", "/v1/chat/completions", body))
    # Requests whose prompts the cache now holds whole or in part.
    again = {c: (m, p, b) for c, m, p, b in cases}
    for c in ("chat.system", "chat.multi_turn", "chat.max_tokens_1", "chat.tools"):
        cases.append((c + ".repeat", *again[c]))
    # The first request again, after all of them (but the bad ones, which
    # 0.32.2 answers in part, its prompt cache then holding other prompts).
    cases.append(("chat.again", "POST", "/v1/chat/completions", chat))
    bad = [
        ("bad.not_json", "/v1/chat/completions", "{not json"),
        ("bad.no_messages", "/v1/chat/completions", {"max_tokens": 3}),
        ("bad.messages_str", "/v1/chat/completions", {"messages": "hi"}),
        (
            "bad.role",
            "/v1/chat/completions",
            {"messages": [{"role": "robot", "content": ""}]},
        ),
        ("bad.no_content", "/v1/chat/completions", {"messages": [{"role": "user"}]}),
        ("bad.max_tokens_str", "/v1/chat/completions", {**chat, "max_tokens": "ten"}),
        ("bad.max_tokens_bool", "/v1/chat/completions", {**chat, "max_tokens": True}),
        ("bad.max_tokens_neg", "/v1/chat/completions", {**chat, "max_tokens": -1}),
        ("bad.temperature", "/v1/chat/completions", {**chat, "temperature": "hot"}),
        (
            "bad.top_logprobs",
            "/v1/chat/completions",
            {**chat, "logprobs": True, "top_logprobs": 50},
        ),
        ("bad.model", "/v1/chat/completions", {**chat, "model": "./no-such-model"}),
        ("bad.n", "/v1/chat/completions", {**chat, "n": 2}),
        (
            "bad.template_kwargs",
            "/v1/chat/completions",
            {**chat, "chat_template_kwargs": "x"},
        ),
        ("bad.tools", "/v1/chat/completions", {**chat, "tools": "x"}),
        ("bad.completions_no_prompt", "/v1/completions", {"max_tokens": 3}),
        ("bad.completions_prompt_int", "/v1/completions", {"prompt": 5}),
        ("bad.path", "/v1/nothing", {}),
    ]
    # Each with a prompt of its own (where 0.32.2 answers one, its prompt
    # cache would give the next a longer cached prefix there than here) and
    # few tokens (0.32.2 answers some with its default max_tokens).
    words = iter(NATO)
    for c, p, b in bad:
        if isinstance(b, dict) and isinstance(b.get("messages"), list):
            word = next(words)
            b = {
                **b,
                "messages": [
                    {**m, "content": word} if "content" in m else m
                    for m in b["messages"]
                ],
            }
        if isinstance(b, dict) and "max_tokens" not in b:
            b = {**b, "max_tokens": 3}
        cases.append((c, "POST", p, b))
    cases.append(("bad.get_path", "GET", "/v1/nothing", None))
    if name in ("qwen3", "qwen3_5"):
        # Thinking on and off in turn on one prompt; then a completion whose
        # prompt is the chat prompt up to its thinking tail (the cache holds
        # it whole; 0.32.2's generation thread dies on it: last).
        off = {"chat_template_kwargs": {"enable_thinking": False}}
        lazy = {"messages": user("The lazy dog"), "max_tokens": 2}
        for i, kwargs in enumerate(({}, off, {}, off)):
            body = {**chat, "max_tokens": 4, **kwargs}
            cases.append((f"chat.thinking_turns.{i}", "POST", CHAT, body))
        cases.append(("chat.lazy", "POST", CHAT, lazy))
        text = "<|im_start|>user\nThe lazy dog<|im_end|>\n<|im_start|>assistant\n"
        for i in range(2):
            body = {"prompt": text, "max_tokens": 2}
            cases.append((f"completions.held_whole.{i}", "POST", COMP, body))
        cases.append(("chat.lazy.repeat", "POST", CHAT, lazy))
    # 0.32.2's generation thread dies on it (the server is started again).
    stop_int = {**chat, "messages": user("Uniform"), "stop": 5, "max_tokens": 3}
    cases.append(("bad.stop_int", "POST", CHAT, stop_int))
    return cases


def stop_word(answer):
    """A word inside ``answer``'s text, or a string it does not have."""
    text = ""
    if isinstance(answer, dict):
        for c in answer.get("choices") or []:
            m = c.get("message") or {}
            text = m.get("content") or m.get("reasoning") or c.get("text") or ""
    text = text.strip()
    return text[len(text) // 2 : len(text) // 2 + 2] if len(text) > 3 else "zzzz"


def stop_piece(events):
    """The text of the third piece of a streamed answer (one token's text,
    as the model generates it), or a string it does not have."""
    pieces = []
    for e in events if isinstance(events, list) else []:
        for c in e.get("choices", []) if isinstance(e, dict) else []:
            d = c.get("delta") or {}
            text = d.get("content") or d.get("reasoning") or c.get("text")
            if text and text.strip():
                pieces.append(text)
    return pieces[2] if len(pieces) > 2 else "zzzz"


def run_server(name, server):
    from transformers import AutoTokenizer

    vocab = AutoTokenizer.from_pretrained(server.model).get_vocab()
    out = {}
    for case, method, path, body in server_requests(name, vocab):
        stop = body.get("stop") if isinstance(body, dict) else None
        source = stop[0] if isinstance(stop, list) else stop
        if isinstance(source, str) and source.startswith("<word of "):
            word = stop_word(out[source[9:-1]].get("body"))
        elif isinstance(source, str) and source.startswith("<piece of "):
            word = stop_piece(out[source[10:-1]].get("body"))
        else:
            word = None
        if word is not None:
            body = {**body, "stop": [word] if isinstance(stop, list) else word}
            out[case + ".word"] = word
        out[case] = server.request(method, path, body)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", required=True, help="NAME=DIR")
    parser.add_argument("--work", required=True, help="a folder for this side")
    parser.add_argument("--out", required=True, help="the JSON to write")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    models = dict(m.split("=", 1) for m in args.model)
    replace = {str(work): "<work>", sys.prefix: "<venv>"}
    for name, path in models.items():
        replace[path] = f"<{name}>"
    norm = Normaliser(replace)
    import mlx.core as mx

    import mlx_lm

    results = {
        "env": {"mlx": mx.__version__, "mlx_lm": mlx_lm.__version__.split("+")[0]}
    }
    # The servers load while the CLIs run.
    logs, servers = {}, {}
    for name, path in models.items():
        logs[name] = open(work / f"server-{name}.log", "w")
        servers[name] = Server(path, logs[name])
    try:
        for name, path in models.items():
            parts = {
                "cli": lambda: run_clis(name, path, str(work)),
                "api": lambda: run_api(name, path, str(work)),
                "load": lambda: run_load_variants(name, path, str(work)),
                "server": lambda: run_server(name, servers[name]),
            }
            for area, run in parts.items():
                tic = time.monotonic()
                try:
                    value = run()
                except Exception as e:
                    value = {"error": error_of(e)}
                    traceback.print_exc()
                results[f"{area}/{name}"] = norm(value)
                took = time.monotonic() - tic
                print(f"{mlx_lm.__version__} {area}/{name}: {took:.1f} s", flush=True)
    finally:
        for name, server in servers.items():
            server.close()
            logs[name].close()
    Path(args.out).write_text(json.dumps(results, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
