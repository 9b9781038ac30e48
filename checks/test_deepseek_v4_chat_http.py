# Copyright © 2026 Apple Inc.

"""mlx_lm.server with a tiny DeepSeek-V4 that writes a DSML tool call.

The model's layers add nothing to the residual stream, so its next token
depends only on the current one: the embeddings and lm_head are set so that
greedy decoding follows a chosen chain of tokens, which the tokenizer has as
added tokens.
"""

import argparse
import http.server
import importlib
import importlib.util
import io
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request
from pathlib import Path
from unittest import mock

import mlx.core as mx
from dsv4_fixtures import (
    TINY_CONFIG,
    make_tiny_model,
    make_tiny_model_folder,
    make_tiny_tokenizer,
)
from mlx.utils import tree_flatten, tree_unflatten
from test_deepseek_v4_chat import TOOLS as CHAT_TOOLS

from mlx_lm import load
from mlx_lm.chat_templates.deepseek_v4 import apply_chat_template
from mlx_lm.generate import TextStateMachine, make_text_state_machine
from mlx_lm.server import (
    APIHandler,
    CompletionRequest,
    LRUPromptCache,
    ModelProvider,
    Response,
    ResponseGenerator,
    ToolCallFormatter,
    process_message_content,
    tool_markers,
)
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.tool_parsers import deepseek_v4 as tool_parser

HAS_OPENAI = importlib.util.find_spec("openai") is not None

DSML = "｜DSML｜"
NOTE = f"a</{DSML}invoke>\n</{DSML}tool_calls>b"
ARGUMENTS = {"city": "Paris", "days": 2, "note": NOTE}

# Each token is followed by the next; a tuple is a chain of its own.
CHAINS = [
    (
        "</think>",
        f"\n\n<{DSML}tool_calls>",
        f'\n<{DSML}invoke name="get_weather">\n',
        f'<{DSML}parameter name="city" string="true">',
        "Paris",
        f"</{DSML}parameter>\n",
        f'<{DSML}parameter name="days" string="false">',
        "2",
        f'</{DSML}parameter>\n<{DSML}parameter name="note" string="true">',
        NOTE,
        f"</{DSML}parameter>\n</{DSML}invoke>\n</{DSML}tool_calls>",
        None,
    ),
    ("<think>", "It is sunny in Paris.", None),
]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "note": {"type": "string"},
                },
                "required": ["city"],
            },
        },
    }
]

# The prompts of both turns, as DeepSeek's encoding_dsv4.py writes them.
TOOLS_BLOCK = '## Tools\n\nYou have access to a set of tools to help answer the user\'s question. You can invoke tools by writing a "<｜DSML｜tool_calls>" block like the following:\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="$TOOL_NAME">\n<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n<｜DSML｜invoke name="$TOOL_NAME2">\n...\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>\n\nString parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.\n\nIf thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\nOtherwise, output directly after </think> with tool calls or final response.\n\n### Available Tool Schemas\n\n{"name": "get_weather", "description": "The weather in a city.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "note": {"type": "string"}}, "required": ["city"]}}\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n'
TURN_1_PROMPT = (
    "<｜begin▁of▁sentence｜>\n\n"
    + TOOLS_BLOCK
    + "<｜User｜>Weather in Paris?<｜Assistant｜></think>"
)
TURN_2_PROMPT = (
    "<｜begin▁of▁sentence｜>Reasoning Effort: Absolute maximum with no shortcuts permitted.\nYou MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\nExplicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n\n\n"
    + TOOLS_BLOCK
    + '<｜User｜>Weather in Paris?<｜Assistant｜><think></think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n<｜DSML｜parameter name="note" string="true">a</｜DSML｜invoke>\n</｜DSML｜tool_calls>b</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>Sunny\n\n22 C</tool_result><｜Assistant｜><think>'
)


# A block whose value holds a whole block end: it runs to the reply's end.
STREAMED = (
    '\n<｜DSML｜invoke name="write">\n<｜DSML｜parameter name="text" string="true"></｜DSML｜invoke>\n</｜DSML｜tool_calls></｜DSML｜parameter>\n<｜DSML｜parameter name="after" string="true">kept</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name="g">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>',
    [
        {
            "name": "write",
            "arguments": {
                "text": "</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
                "after": "kept",
            },
        },
        {"name": "g", "arguments": {}},
    ],
)


def invoke(city, name="get_weather"):
    return (
        f'<{DSML}invoke name="{name}">\n'
        f'<{DSML}parameter name="city" string="true">{city}</{DSML}parameter>\n'
        f"</{DSML}invoke>"
    )


def block(body, opener=f"<{DSML}tool_calls>"):
    return f"{opener}\n{body}\n</{DSML}tool_calls>"


SEOUL = [{"name": "get_weather", "arguments": {"city": "Seoul"}}]
QUOTE = block(invoke("Paris"))

# Replies with DSML written slightly damaged, as vLLM's and SGLang's
# DeepSeek-V4 parsers recover it: (name, reply, content, calls).
DAMAGED_CASES = [
    (
        "an invoke without the tool_calls wrapper",
        "Checking.\n" + invoke("Seoul") + f"\n</{DSML}tool_calls>",
        "Checking.\n",
        SEOUL,
    ),
    (
        "an invoke without the wrapper or its end",
        "Checking.\n" + invoke("Seoul"),
        "Checking.\n",
        SEOUL,
    ),
    (
        "the opener misspelled toolcalls",
        "\n\n" + block(invoke("Seoul"), f"<{DSML}toolcalls>"),
        "",
        SEOUL,
    ),
    (
        "the opener cut to tool",
        "\n\n" + block(invoke("Seoul"), f"<{DSML}tool>"),
        "",
        SEOUL,
    ),
    (
        "the opener without its >",
        "Sure.\n\n" + block(invoke("Seoul"), f"<{DSML}tool_calls"),
        "Sure.",
        SEOUL,
    ),
    (
        "indented lines",
        "Let me check.\n\n"
        + "\n".join("  " + line for line in block(invoke("Seoul")).split("\n")),
        "Let me check.\n\n  ",
        SEOUL,
    ),
    (
        "DSML quoted in a code fence before the call",
        f"The format:\n\n```\n{QUOTE}\n```\n\nNow the call:\n\n"
        + block(invoke("Seoul")),
        f"The format:\n\n```\n{QUOTE}\n```\n\nNow the call:",
        SEOUL,
    ),
    (
        "an invoke quoted in a fence with a language, then a bare invoke",
        f"```xml\n{invoke('Paris')}\n```\nCalling it:\n" + invoke("Seoul"),
        f"```xml\n{invoke('Paris')}\n```\nCalling it:\n",
        SEOUL,
    ),
]

# Replies whose DSML is not a call: the whole reply is content.
NOT_CALLS = [
    ("DSML only quoted in a code fence", f"Like this:\n\n```\n{QUOTE}\n```\n\nDone."),
    ("a truncated invoke", f'Docs quote <{DSML}invoke name="get_wea'),
    ("an invoke of an undeclared tool", invoke("Seoul", name="not_declared")),
    (
        "an invoke without its closing tag",
        invoke("Seoul").removesuffix(f"</{DSML}invoke>"),
    ),
    ("a function_calls block", block(invoke("Seoul"), f"<{DSML}function_calls>")),
    ("a tag in prose", f'The tag <{DSML}invoke name="get_weather"> starts a call.'),
    ("an invoke then text", invoke("Seoul") + "\nThat is all."),
]


def make_chain_model_folder(path):
    """A tiny DeepSeek-V4 whose greedy decoding follows CHAINS."""
    from transformers import AutoTokenizer

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    make_tiny_tokenizer(path, TINY_CONFIG["vocab_size"])
    tokenizer = AutoTokenizer.from_pretrained(path)
    words = sorted({w for chain in CHAINS for w in chain if w is not None})
    tokenizer.add_tokens(words)
    tokenizer.save_pretrained(path)
    ids = {w: tokenizer.convert_tokens_to_ids(w) for w in words}
    ids[None] = tokenizer.eos_token_id

    # The prompts with tools run past the tiny config's 256 positions.
    config = {**TINY_CONFIG, "vocab_size": len(tokenizer)}
    config["max_position_embeddings"] = 4096
    model = make_tiny_model(config)
    # Layers add nothing (their output weights are zero), so the hidden state
    # is the embedding of the current token.
    flat = [
        (k, v if "_hc." in k or k.endswith("tid2eid") else mx.zeros_like(v))
        for k, v in tree_flatten(model.parameters())
        if k.startswith("model.layers.")
    ]
    model.update(tree_unflatten(flat))
    embed = mx.zeros_like(model.model.embed_tokens.weight)
    head = mx.zeros_like(model.lm_head.weight)
    pairs = [(a, b) for chain in CHAINS for a, b in zip(chain, chain[1:])]
    for i, (a, b) in enumerate(pairs):
        embed[ids[a], i] = 1.0
        head[ids[b], i] = 20.0
    model.model.embed_tokens.weight = embed
    model.lm_head.weight = head
    model.model.norm.weight = mx.ones_like(model.model.norm.weight)
    mx.save_safetensors(
        str(path / "model.safetensors"), dict(tree_flatten(model.parameters()))
    )
    with open(path / "config.json", "w") as f:
        json.dump(config, f, indent=2)
    return path


def server_args(model):
    return argparse.Namespace(
        model=str(model),
        adapter_path=None,
        draft_model=None,
        num_draft_tokens=3,
        trust_remote_code=False,
        chat_template="",
        use_default_chat_template=False,
        chat_template_args={},
        pipeline=False,
        temp=0.0,
        top_p=1.0,
        top_k=0,
        min_p=0.0,
        max_tokens=64,
        decode_concurrency=4,
        prompt_concurrency=2,
        prefill_step_size=512,
        prompt_cache_size=4,
        prompt_cache_bytes=1 << 30,
        kv_bits=None,
        kv_group_size=64,
        quantized_kv_start=0,
        allowed_origins=["*"],
    )


def join_generation_thread(generator):
    """Stop the server's generation thread and wait until it has exited: its
    thread-local MLX compile cache is freed after Python's join returns, and a
    process that exits meanwhile can abort ("terminate called without an
    active exception")."""
    generator.stop_and_join()
    task = f"/proc/self/task/{generator._generation_thread.native_id}"
    while os.path.exists(task):
        time.sleep(0.01)


class TestDeepseekV4ChatServer(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        cls.path = make_chain_model_folder(Path(cls._tmp.name) / "model")
        cls.generator = ResponseGenerator(
            ModelProvider(server_args(cls.path)), LRUPromptCache()
        )
        cls.httpd = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0),
            lambda *args, **kwargs: APIHandler(cls.generator, *args, **kwargs),
        )
        cls.url = f"http://127.0.0.1:{cls.httpd.server_port}/v1"
        cls.thread = threading.Thread(target=cls.httpd.serve_forever, daemon=True)
        cls.thread.start()

    @classmethod
    def tearDownClass(cls):
        cls.httpd.shutdown()
        cls.httpd.server_close()
        cls.thread.join()
        join_generation_thread(cls.generator)
        cls._tmp.cleanup()

    def record_prompts(self):
        """Patch the tokenizer to keep each prompt text it renders."""
        prompts = []
        render = TokenizerWrapper.apply_chat_template

        def record(tokenizer, messages, tokenize=True, **kwargs):
            text = render(tokenizer, messages, tokenize=False, **kwargs)
            if kwargs.get("add_generation_prompt"):
                prompts.append(text)
            return render(tokenizer, messages, tokenize=tokenize, **kwargs)

        return prompts, mock.patch.object(
            TokenizerWrapper, "apply_chat_template", record
        )

    def tool_result_turn(self, call):
        return [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {
                "role": "tool",
                "tool_call_id": call["id"],
                "content": [
                    {"type": "text", "text": "Sunny"},
                    {"type": "text", "text": "22 C"},
                ],
            },
        ]

    def post(self, body):
        request = urllib.request.Request(
            self.url + "/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.load(response)

    def replying(self, chunks):
        """Patch the server to answer with chunks instead of the model's text."""
        generate = self.generator.generate

        def reply(request, args, progress_callback=None):
            ctx, response = generate(request, args, progress_callback)

            def texts():
                for _ in response:
                    pass
                for text in chunks:
                    yield Response(text, 0, 0.0, None, ())
                yield Response("", 0, 0.0, "stop", ())

            return ctx, texts()

        return mock.patch.object(self.generator, "generate", reply)

    def ask(self, chunks, stream):
        """(content, calls, finish_reason) of a reply, as a client sees it."""
        body = {
            "messages": [{"role": "user", "content": "Weather in Seoul?"}],
            "tools": TOOLS,
            "chat_template_kwargs": {"enable_thinking": False},
            "stream": stream,
        }
        with self.replying(chunks):
            if not stream:
                choice = self.post(body)["choices"][0]
                message = choice["message"]
                calls = message.get("tool_calls") or []
                content = message["content"] or ""
                return content, self.calls(calls), choice["finish_reason"]
            request = urllib.request.Request(
                self.url + "/chat/completions",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            content, calls, finish = "", {}, None
            with urllib.request.urlopen(request, timeout=120) as response:
                for line in response:
                    line = line.decode().strip()
                    if not line.startswith("data: {"):
                        continue
                    choice = json.loads(line[len("data: ") :])["choices"][0]
                    content += choice["delta"].get("content") or ""
                    for c in choice["delta"].get("tool_calls") or []:
                        calls[c["index"]] = c
                    finish = choice["finish_reason"] or finish
            return content, self.calls([calls[i] for i in sorted(calls)]), finish

    def calls(self, calls):
        return [
            {
                "name": c["function"]["name"],
                "arguments": json.loads(c["function"]["arguments"]),
            }
            for c in calls
        ]

    def chunkings(self, reply):
        for size in (len(reply), 1, 3, 7):
            yield [reply[i : i + size] for i in range(0, len(reply), size)]

    def test_damaged_calls_are_recovered_whole_and_streamed(self):
        for name, reply, content, calls in DAMAGED_CASES:
            for stream in (False, True):
                for chunks in self.chunkings(reply):
                    with self.subTest(name, stream=stream, size=len(chunks[0])):
                        self.assertEqual(
                            self.ask(chunks, stream), (content, calls, "tool_calls")
                        )

    def test_dsml_that_is_not_a_call_is_content_whole_and_streamed(self):
        for name, reply in NOT_CALLS:
            for stream in (False, True):
                for chunks in self.chunkings(reply):
                    with self.subTest(name, stream=stream, size=len(chunks[0])):
                        self.assertEqual(self.ask(chunks, stream), (reply, [], "stop"))

    def test_tool_call_and_result_over_http(self):
        prompts, patch = self.record_prompts()
        with patch:
            first = self.post(
                {
                    "messages": [{"role": "user", "content": "Weather in Paris?"}],
                    "tools": TOOLS,
                    "chat_template_kwargs": {"enable_thinking": False},
                }
            )
            choice = first["choices"][0]
            self.assertEqual(choice["finish_reason"], "tool_calls")
            self.assertFalse(choice["message"]["content"])
            (call,) = choice["message"]["tool_calls"]
            self.assertEqual(call["function"]["name"], "get_weather")
            self.assertEqual(json.loads(call["function"]["arguments"]), ARGUMENTS)

            second = self.post(
                {
                    "messages": self.tool_result_turn(call),
                    "tools": TOOLS,
                    "reasoning_effort": "max",
                }
            )
        message = second["choices"][0]["message"]
        self.assertEqual(message["reasoning"], "It is sunny in Paris.")
        self.assertFalse(message.get("tool_calls"))
        self.assertEqual(prompts, [TURN_1_PROMPT, TURN_2_PROMPT])

    def status_of(self, body):
        """The status and JSON answer of a request."""
        try:
            return 200, self.post(body)
        except urllib.error.HTTPError as e:
            return e.code, json.load(e)

    def test_openai_reasoning_efforts_are_honoured(self):
        ask = [{"role": "user", "content": "Weather in Paris?"}]
        prompts, patch = self.record_prompts()
        with patch:
            for effort in ("none", "minimal", "low", "medium", "high", "xhigh"):
                with self.subTest(effort):
                    body = {"messages": ask, "max_tokens": 2}
                    status, answer = self.status_of(
                        {**body, "reasoning_effort": effort}
                    )
                    self.assertEqual(status, 200, answer)
        # "none" is chat mode, "xhigh" DeepSeek's max, the rest its high.
        chat, high, max_ = (
            apply_chat_template(ask, add_generation_prompt=True, **kwargs)
            for kwargs in (
                {"enable_thinking": False},
                {"reasoning_effort": "high"},
                {"reasoning_effort": "max"},
            )
        )
        self.assertEqual(prompts, [chat, high, high, high, high, max_])

    def test_a_response_format_on_the_system_message_reaches_the_prompt(self):
        # DeepSeek's field for it; the encoder has no response_format keyword.
        schema = {"type": "json_object"}
        messages = [
            {"role": "system", "content": "Be brief.", "response_format": schema},
            {"role": "user", "content": "Hi"},
        ]
        prompts, patch = self.record_prompts()
        with patch:
            status, answer = self.status_of({"messages": messages, "max_tokens": 2})
        self.assertEqual(status, 200, answer)
        want = apply_chat_template(messages, add_generation_prompt=True)
        self.assertEqual(prompts, [want])
        self.assertIn("## Response Format:\n\nYou MUST strictly adhere", want)

    def test_vllms_thinking_keyword_reaches_the_prompt(self):
        # vLLM's DeepSeek-V4 clients send "thinking" in chat_template_kwargs.
        ask = [{"role": "user", "content": "Hi"}]
        prompts, patch = self.record_prompts()
        with patch:
            for thinking in (False, True):
                kwargs = {"thinking": thinking}
                body = {"messages": ask, "max_tokens": 2}
                status, answer = self.status_of(
                    {**body, "chat_template_kwargs": kwargs}
                )
                self.assertEqual(status, 200, answer)
        want = [
            apply_chat_template(ask, add_generation_prompt=True, enable_thinking=t)
            for t in (False, True)
        ]
        self.assertEqual(prompts, want)

    def test_what_the_template_rejects_is_a_400_naming_the_field(self):
        ask = [{"role": "user", "content": "Hi"}]
        bad = [
            ({"reasoning_effort": "lowest"}, "reasoning_effort 'lowest'.*'none'"),
            ({"reasoning_effort": 3}, "reasoning_effort must be a string"),
            ({"chat_template_kwargs": {"thinking_mode": "fast"}}, "'chat' or"),
            ({"chat_template_kwargs": "chat"}, "chat_template_kwargs must be"),
            ({"tools": [{"type": "function"}]}, r"tools\[0\] has no 'function'"),
        ]
        for fields, named in bad:
            with self.subTest(**{k: str(v) for k, v in fields.items()}):
                status, answer = self.status_of({"messages": ask, **fields})
                self.assertEqual(status, 400, answer)
                self.assertRegex(str(answer["error"]), named)

    def test_reasoning_effort_reaches_only_templates_that_name_it(self):
        _, tokenizer = load(str(self.path))
        seen = []

        def takes_effort(messages, reasoning_effort=None, **kwargs):
            seen.append(reasoning_effort)
            return "x"

        def takes_any(messages, **kwargs):
            # As deepseek_v32's encoder, which rejects unknown arguments.
            self.assertNotIn("reasoning_effort", kwargs)
            seen.append(None)
            return "x"

        messages = [{"role": "user", "content": "Hi"}]
        request = CompletionRequest("chat", "", messages, None, None)
        args = argparse.Namespace(chat_template_kwargs={"reasoning_effort": "max"})
        for template in (takes_effort, takes_any):
            wrapper = TokenizerWrapper(tokenizer._tokenizer, chat_template=template)
            self.generator._tokenize(wrapper, request, args)
        self.assertEqual(seen, ["max", None])

    def test_tool_result_parts_are_joined_by_the_template_that_asks(self):
        def messages():
            parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
            return [{"role": "tool", "content": parts}]

        kept = messages()
        process_message_content(kept, keep_tool_parts=True)
        self.assertEqual(kept, messages())
        joined = messages()
        process_message_content(joined)
        self.assertEqual(joined[0]["content"], "ab")

    @unittest.skipUnless(HAS_OPENAI, "the openai package is not installed")
    def test_tool_call_and_result_with_the_openai_client(self):
        from openai import OpenAI

        client = OpenAI(base_url=self.url, api_key="none")
        ask = {"role": "user", "content": "Weather in Paris?"}
        prompts, patch = self.record_prompts()
        with patch:
            for stream in (False, True):
                with self.subTest(stream=stream):
                    response = client.chat.completions.create(
                        model="default_model",
                        messages=[ask],
                        tools=TOOLS,
                        stream=stream,
                        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
                    )
                    if stream:
                        calls, content, finish = {}, "", None
                        for chunk in response:
                            delta = chunk.choices[0].delta
                            content += delta.content or ""
                            for c in delta.tool_calls or []:
                                calls[c.index] = c
                            finish = chunk.choices[0].finish_reason or finish
                        calls = [calls[i] for i in sorted(calls)]
                    else:
                        choice = response.choices[0]
                        calls = choice.message.tool_calls
                        content = choice.message.content
                        finish = choice.finish_reason
                    self.assertEqual(finish, "tool_calls")
                    self.assertFalse(content)
                    (call,) = calls
                    self.assertEqual(call.function.name, "get_weather")
                    self.assertEqual(json.loads(call.function.arguments), ARGUMENTS)

            call = {
                "id": call.id,
                "type": "function",
                "function": {
                    "name": call.function.name,
                    "arguments": call.function.arguments,
                },
            }
            response = client.chat.completions.create(
                model="default_model",
                messages=self.tool_result_turn(call),
                tools=TOOLS,
                reasoning_effort="max",
            )
        message = response.choices[0].message
        self.assertEqual(message.reasoning, "It is sunny in Paris.")
        self.assertFalse(message.tool_calls)
        self.assertEqual(prompts, [TURN_1_PROMPT, TURN_1_PROMPT, TURN_2_PROMPT])


class TestDeepseekV4ChatLoad(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        cls.path = make_tiny_model_folder(Path(cls._tmp.name) / "model")
        _, cls.tokenizer = load(str(cls.path))

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def reply(self, chunks):
        """(content, calls) of a reply in chunks, as mlx_lm.server reads it."""
        state = make_text_state_machine(self.tokenizer).make_state("normal")
        content, tool_text = "", ""
        for chunk in chunks:
            state, segments = TextStateMachine.split(state, chunk)
            for name, text in segments:
                if name == "tool":
                    tool_text += text
                else:
                    content += text
        state, rest, _ = TextStateMachine.flush(state)
        content += rest
        formatter = ToolCallFormatter(
            self.tokenizer.tool_parser, CHAT_TOOLS, True, tool_markers(self.tokenizer)
        )
        calls = formatter([tool_text] if tool_text else [])
        calls = [
            {
                "name": c["function"]["name"],
                "arguments": json.loads(c["function"]["arguments"]),
            }
            for c in calls
        ]
        return content + formatter.take_unparsed(), calls

    def test_damaged_calls_are_recovered_in_any_chunks(self):
        for name, reply, content, calls in DAMAGED_CASES:
            for size in range(1, len(reply) + 1):
                chunks = [reply[i : i + size] for i in range(0, len(reply), size)]
                with self.subTest(name, size=size):
                    self.assertEqual(self.reply(chunks), (content, calls))

    def test_dsml_that_is_not_a_call_stays_content_whole_in_any_chunks(self):
        for name, reply in NOT_CALLS:
            for size in range(1, len(reply) + 1):
                chunks = [reply[i : i + size] for i in range(0, len(reply), size)]
                with self.subTest(name, size=size):
                    self.assertEqual(self.reply(chunks), (reply, []))

    def test_load_uses_the_encoder_and_the_tool_parser(self):
        tokenizer = self.tokenizer
        self.assertTrue(tokenizer.has_chat_template)
        self.assertTrue(tokenizer.has_tool_calling)
        self.assertIs(tokenizer.tool_parser, tool_parser.parse_tool_call)
        self.assertEqual(tokenizer.tool_call_start, tool_parser.tool_call_start)
        messages = [{"role": "user", "content": "The quick brown fox"}]
        kwargs = dict(
            tools=CHAT_TOOLS, add_generation_prompt=True, enable_thinking=True
        )
        text = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
        self.assertEqual(text, apply_chat_template(messages, **kwargs))
        tokens = tokenizer.apply_chat_template(messages, **kwargs)
        self.assertEqual(tokens[0], tokenizer.bos_token_id)
        self.assertEqual(tokenizer.decode(tokens), text)

    def split(self, chunks):
        from mlx_lm.generate import TextStateMachine, make_text_state_machine

        machine = make_text_state_machine(self.tokenizer)
        state = machine.make_state("normal")
        segments = []
        for chunk in chunks:
            state, new = TextStateMachine.split(state, chunk)
            segments += new
        TextStateMachine.discard(state)
        text = "".join(t for s, t in segments if s == "normal")
        tool_text = "".join(t for s, t in segments if s == "tool")
        return text, tool_text

    def test_streamed_tool_calls_in_any_chunking(self):
        # As the server splits the stream: the block runs to the end.
        block, expected = STREAMED
        output = "Let me check." + tool_parser.tool_call_start + block
        for size in (1, 5, len(output)):
            with self.subTest(size=size):
                chunks = [output[i : i + size] for i in range(0, len(output), size)]
                text, tool_text = self.split(chunks)
                self.assertEqual(text, "Let me check.")
                self.assertEqual(
                    tool_parser.parse_tool_call(tool_text, CHAT_TOOLS), expected
                )

    def test_streamed_tokens_reach_the_parser(self):
        tokenizer = self.tokenizer
        block, expected = STREAMED
        output = "Let me check." + tool_parser.tool_call_start + block
        detokenizer = tokenizer.detokenizer
        chunks = []
        for token in tokenizer.encode(output, add_special_tokens=False):
            detokenizer.add_token(token)
            chunks.append(detokenizer.last_segment)
        detokenizer.finalize()
        chunks.append(detokenizer.last_segment)
        text, tool_text = self.split(chunks)
        self.assertEqual(text, "Let me check.")
        self.assertEqual(tool_parser.parse_tool_call(tool_text, CHAT_TOOLS), expected)

    def test_a_template_in_the_checkpoint_wins(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = make_tiny_model_folder(Path(tmp) / "model")
            with open(path / "tokenizer_config.json") as f:
                config = json.load(f)
            config["chat_template"] = (
                "{% for m in messages %}{{ m.content }}{% endfor %}"
            )
            with open(path / "tokenizer_config.json", "w") as f:
                json.dump(config, f)
            _, tokenizer = load(str(path))
        messages = [{"role": "user", "content": "fox"}]
        self.assertEqual(tokenizer.apply_chat_template(messages, tokenize=False), "fox")
        self.assertIs(tokenizer.tool_parser, tool_parser.parse_tool_call)

    def test_the_commands_render_what_the_server_renders_without_an_effort(self):
        # The prompt each of mlx_lm.generate, mlx_lm.chat and mlx_lm.server
        # renders for "Hi" and no reasoning_effort, in both chat formats.
        from mlx_lm.chat_templates.deepseek_v4 import REASONING_EFFORT_MAX

        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        folder_0731 = Path(tmp.name) / "0731"
        shutil.copytree(self.path, folder_0731)
        (folder_0731 / "encoding").mkdir()
        (folder_0731 / "encoding" / "encoding_dsv4.py").write_text(
            "PROMPT = 'Reasoning Effort: Beyond maximum'\n"
        )
        render = TokenizerWrapper.apply_chat_template
        bos, turn = "<｜begin▁of▁sentence｜>", "<｜User｜>Hi<｜Assistant｜><think>"
        for path, prompt in [(self.path, ""), (folder_0731, REASONING_EFFORT_MAX)]:
            prompts = {}

            def record(name):
                def apply(tokenizer, messages, tokenize=True, **kwargs):
                    text = render(tokenizer, messages, tokenize=False, **kwargs)
                    prompts.setdefault(name, text)
                    return render(tokenizer, messages, tokenize=tokenize, **kwargs)

                return mock.patch.object(TokenizerWrapper, "apply_chat_template", apply)

            for name, argv, stdin in [
                ("generate", ["-p", "Hi", "-m", "1"], ""),
                ("chat", ["--max-tokens", "1"], "Hi\nq\n"),
            ]:
                command = importlib.import_module(f"mlx_lm.{name}")
                argv = [f"mlx_lm.{name}", "--model", str(path), *argv]
                with record(name), mock.patch.object(sys, "argv", argv):
                    with mock.patch("sys.stdin", io.StringIO(stdin)):
                        with mock.patch("sys.stdout", io.StringIO()):
                            command.main()
            # The server's rendering, with its default arguments.
            cli_args = argparse.Namespace(chat_template_args={})
            server = argparse.Namespace(
                model_provider=argparse.Namespace(processor=None, cli_args=cli_args)
            )
            _, tokenizer = load(str(path))
            messages = [{"role": "user", "content": "Hi"}]
            request = CompletionRequest("chat", "", messages, None, None)
            args = argparse.Namespace(chat_template_kwargs=None)
            with record("server"):
                ResponseGenerator._tokenize(server, tokenizer, request, args)
            with self.subTest(path=path.name):
                self.assertEqual(
                    prompts,
                    dict.fromkeys(["generate", "chat", "server"], bos + prompt + turn),
                )


if __name__ == "__main__":
    unittest.main()
