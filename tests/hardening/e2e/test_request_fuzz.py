"""Fuzz every route of a real server with requests drawn over its schema (issues 48, 53).

The routes are those SGLang's HTTP app registers (`app.routes`, read in this process, hidden
ones included) and those the live server lists (`/openapi.json`), so a route a new SGLang adds
is fuzzed too. Only the routes in SKIP are left out: each changes the server by design in a way
that breaks the run, and each must exist (the list cannot go stale). On the tiny model every route is
sent at least one request (on SmolLM2, every route that builds a prompt); the rest of the run
draws the routes that build a prompt most often.

A body is a well-formed request with one to three fields replaced by what clients get wrong:
numbers from their whole range (0, negative, the vocabulary's size and its neighbours, the
context's length, 2**31, 2**63, 10**18, floats, NaN, strings), token ids in and out of the
vocabulary, media fields ("x", [[]], [], "") beside empty, whitespace and normal prompts,
chunk markup in every text field, unicode and lone surrogates, wrong types, prompts longer
than the context, batches, streams, sessions, forged kv_hints, JSON nested to the server's bound
and past it, past orjson's 1,024 and past the stdlib parser's recursion limit (a whole body or one
field; on the tiny model every route that takes a body is sent one: issue 85.6). Routes without a drawer of
their own get bodies drawn from their OpenAPI schema, or generic ones (no body, {}, a JSON
that is not an object, a prompt, chat messages).

Every response must be a 2xx or a 4xx that says what is wrong (a 5xx, an error event with a
5xx code inside a stream, a dropped connection or a request that does not end in
REQUEST_TIMEOUT fails), and after every request the server must still answer GET /health (a
generation is probed every PROBE_EVERY requests): a death is blamed on the request just sent,
with the server log's traceback.

It runs on the tiny test model and on SmolLM2-135M (whose tokenizer adds no BOS, so an empty
text is a prompt of no tokens), each on a server of its own, started here and always stopped.
CI runs a fixed seed, so a failure replays as is; MEPIC_REQUEST_FUZZ_SEED=<n> runs another and
MEPIC_REQUEST_FUZZ_SEED=random draws one. The seed is printed and named in every failure.
MEPIC_REQUEST_FUZZ_SECONDS bounds each model's drawn requests (default 30 s on the tiny model, 20 on SmolLM2:
make test's share; exploring, give it more), after a first pass that runs whatever the budget.
The run stops at the first failure; MEPIC_REQUEST_FUZZ_KEEP_GOING=1 (for exploring) restarts a dead
server, shrinks each failure's body and reports every distinct failure at the end.
"""

import json
import math
import os
import random
import re
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import pytest
import requests

from sglang_mepic.launch import models
from sglang_mepic.process.server_process import ServerProcess

SEED = 20261124
# The tiny model answers about 20 requests a second on 2 cores (1,193 in 60 s, its first pass over every route
# in seconds); SmolLM2 about 4 (its first pass over every route, field and sampling parameter: 199 requests
# in 50 s). The first pass runs whatever the budget. SmolLM2's covers the routes that build a prompt, where
# its own case lies (its tokenizer adds no BOS: an empty text is a prompt of no tokens); the server code
# behind every other route, field and parameter is the tiny model's, whose first pass covers them all.
DEFAULT_SECONDS = {"tiny": 30.0}
EVERY_ROUTE_FIRST = {"tiny"}
SECONDS_ENV = os.environ.get("MEPIC_REQUEST_FUZZ_SECONDS")


def budget(model_name: str) -> float:
    return float(SECONDS_ENV) if SECONDS_ENV else DEFAULT_SECONDS.get(model_name, 20.0)
MAX_REQUESTS = int(os.environ.get("MEPIC_REQUEST_FUZZ_REQUESTS", 3000))
KEEP_GOING = os.environ.get("MEPIC_REQUEST_FUZZ_KEEP_GOING", "") not in ("", "0")
# For exploring past a known failure: routes (comma-separated) left out of this run
AVOID = {p for p in os.environ.get("MEPIC_REQUEST_FUZZ_AVOID", "").split(",") if p}
REQUEST_TIMEOUT = 60.0  # a whole request, stream included: the drawn generations are a few tokens
HEALTH_TIMEOUT = 10.0
PROBE_EVERY = 10

OPEN, CLOSE = "<|chunk|>", "<|/chunk|>"
DOC = " ".join(f"fact{i} is {i * 7 % 13}." for i in range(12))  # about 3 pages

# Routes not fuzzed, each with why: each changes the server by design in a way that breaks the run (or is no
# HTTP route). Every other admin route is fuzzed (issue 68): a body its handler cannot take is a 4xx, and a
# control request whose scheduler handler raises is answered as failed (sglang_mepic/patches/hardening/type_based_dispatcher_call.py)
# instead of ending the server.
SKIP = {
    "/start_profile": "profiles every forward until stopped and writes traces (the run slows to a crawl)",
    "/slow_down": "sleeps every forward for a drawn time (10**18 s wedges the scheduler by design)",
    "/pause_generation": "stops the scheduler until /continue_generation: every later request waits",
    "/release_memory_occupation": "frees the weights and KV pool until resumed: every later request fails",
    "/configure_logging": "sets the log level and dumps requests to drawn folders: the log the failures are "
                          "read from changes",
    "/update_weights_from_disk": "loads other weights (or none) into the model",
    "/update_weights_from_tensor": "replaces the model's weights",
    "/update_weights_from_distributed": "replaces weights from a process group",
    "/update_weights_from_ipc": "replaces weights from another process",
    "/begin_weight_update": "starts a weight update: generation waits for its end",
    "/end_weight_update": "ends a weight update (the pair of /begin_weight_update)",
    "/init_weights_update_group": "joins a process group at a drawn address: waits for peers that never come",
    "/destroy_weights_update_group": "tears down the weight-update group (the pair of the one above)",
    "/init_weights_send_group_for_remote_instance": "joins a process group at a drawn address",
    "/send_weights_to_remote_instance": "sends the weights to a drawn address (its failure on a group never set "
                                        "up is tested in tests/hardening/test_control_requests.py)",
    "/pd_role_switch": "switches the server's prefill/decode disaggregation role",
    "/scale_elastic_ep": "rescales expert parallelism: rebuilds the parallel groups",
    "/v1/realtime": "a WebSocket, not an HTTP route",
}

# The routes that build a prompt, drawn most often (relative weights; each has a drawer below).
PROMPTED = {"/generate": 8, "/v1/completions": 5, "/v1/chat/completions": 5, "/api/generate": 3, "/api/chat": 3,
            "/v1/messages": 2, "/v1/messages/count_tokens": 1, "/v1/score": 2, "/v1/rerank": 1, "/v1/tokenize": 2,
            "/tokenize": 1, "/v1/detokenize": 2, "/detokenize": 1, "/v1/embeddings": 1, "/encode": 1,
            "/v1/responses": 1, "/invocations": 1, "/vertex_generate": 1, "/open_session": 1, "/api/show": 1}
# The numeric fields of the OpenAI routes, drawn together
NUMBERS = ("max_tokens", "n", "temperature", "top_p", "top_k", "min_p", "seed", "frequency_penalty",
           "presence_penalty", "repetition_penalty", "min_tokens")
PROMPTED_SHARE = 0.75  # of the requests after every route was sent one
BODY_METHODS = ("POST", "PUT", "PATCH", "DELETE")  # each route of one of these is sent one deep body first
# The field that bounds a route's generation (absent, the rest of the context)
LENGTH_OF = {"/generate": "max_new_tokens", "/v1/completions": "max_tokens", "/v1/chat/completions": "max_tokens",
             "/invocations": "max_tokens", "/v1/messages": "max_tokens", "/api/generate": "num_predict",
             "/api/chat": "num_predict", "/v1/responses": "max_output_tokens"}


def seed() -> int:
    value = os.environ.get("MEPIC_REQUEST_FUZZ_SEED", str(SEED))
    return random.randrange(2**32) if value == "random" else int(value)


# ---------------------------------------------------------------------------------------------
# The routes


def _app_routes() -> tuple[set[tuple[str, str]], dict, tuple[str, ...]]:
    """(path, method) of every route SGLang's app registers, its OpenAPI schema and the fields of /generate."""
    from dataclasses import fields

    from sglang.srt.entrypoints.http_server import app
    from sglang.srt.managers.io_struct import GenerateReqInput

    found: set[tuple[str, str]] = set()

    def walk(routes):
        for route in routes:
            inner = getattr(route, "original_router", None) or getattr(route, "router", None)
            if inner is not None and hasattr(inner, "routes") and not hasattr(route, "path"):
                walk(inner.routes)
                continue
            path = getattr(route, "path", None)
            if path is None:
                continue
            methods = getattr(route, "methods", None) or {"WEBSOCKET"}
            found.update((path, m) for m in methods)

    walk(app.routes)
    return found, app.openapi(), tuple(f.name for f in fields(GenerateReqInput))


@pytest.fixture(scope="module")
def registered() -> Future:
    """The import of SGLang's app takes seconds: it runs while the servers start."""
    pool = ThreadPoolExecutor(1)
    yield pool.submit(_app_routes)
    pool.shutdown(wait=False)


def routes_of(server, registered: Future) -> tuple[list[tuple[str, str]], dict, tuple[str, ...]]:
    found, schema, generate_fields = registered.result(timeout=300)
    live = requests.get(server.url + "/openapi.json", timeout=30).json()
    for path, ops in live.get("paths", {}).items():
        found.update((path, m.upper()) for m in ops if m in ("get", "post", "put", "delete", "patch", "head"))
    schema = {**schema, "paths": {**schema.get("paths", {}), **live.get("paths", {})},
              "components": {"schemas": {**schema.get("components", {}).get("schemas", {}),
                                         **live.get("components", {}).get("schemas", {})}}}
    paths = {p for p, _ in found}
    stale = set(SKIP) - paths
    assert not stale, f"SKIP names routes the server does not register: {sorted(stale)}"
    missing = set(PROMPTED) - paths
    assert not missing, f"drawers for routes the server does not register: {sorted(missing)}"
    return sorted((p, m) for p, m in found if p not in SKIP and m != "WEBSOCKET"), schema, generate_fields


# ---------------------------------------------------------------------------------------------
# What is drawn


class Draw:
    """Request bodies for one model, from a seeded generator."""

    def __init__(self, rng: random.Random, vocab: int, context: int, cheap: int, schema: dict,
                 generate_fields: tuple[str, ...] = (), deep_rng: random.Random | None = None):
        self.rng, self.vocab, self.context, self.cheap, self.schema = rng, vocab, context, cheap, schema
        # Deep bodies are drawn from a generator of their own: the rest of a seed's run is drawn as before them
        self.deep_rng = deep_rng or random.Random(0)
        self.generate_fields = generate_fields or ("rid",)  # GenerateReqInput's fields
        self.long_ok = cheap >= context  # prompts the whole context long take a second, not minutes
        self.sessions: list[str] = []  # ids the server gave /open_session
        self.rids: list[str] = []

    def pick(self, *options):
        return self.rng.choice(options)

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    # -- values

    def int_(self):
        """An integer from the whole range, the edges of this model's vocabulary and context included."""
        v, c = self.vocab, self.context
        return self.pick(0, -1, 1, 2, 3, 5, 20, 21, 100, 128, 129, v - 1, v, v + 1, c - 1, c, c + 1, 100000,
                         2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64, 10**18, -(2**31), -(2**63) - 1,
                         -(10**18))

    def float_(self):
        return self.pick(0.0, 0.5, 1.0, 1.5, -0.5, -1.0, 1e-9, 2.0, 100.0, 1e308, -1e308, math.nan, math.inf,
                         -math.inf, 1e-320)

    def length(self):
        """A generation length from the whole range: the context's edges, the vocabulary's, huge, floats."""
        v, c = self.vocab, self.context
        return self.pick(0, -1, 1, 2, 4, 100, c, c + 1, v - 1, v, v + 1, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64,
                         10**18, -(2**63) - 1, 1.5, 2.0, 1e308, math.nan, "3", None, True)

    def count(self):
        """A k over the vocabulary (top-k, logprobs): its edges, huge, or not a count."""
        v = self.vocab
        return self.pick(0, -1, 1, 2, 20, 21, v - 1, v, v + 1, 100000, 2**31, 2**63, 10**18, -(2**63) - 1, 1.5,
                         math.nan, "3", None, True)

    def position(self):
        """A position in the prompt or the context (logprob_start_len)."""
        c = self.context
        return self.pick(-1, -2, 0, 1, 2, 5, c - 1, c, c + 1, 2**31, 2**63, -(2**63) - 1, 1.5, "3", None)

    def num(self):
        """A number from anywhere, or a value of the wrong type where a number belongs."""
        return self.pick(self.int_, self.int_, self.int_, self.float_, self.float_, self.junk)()

    def junk(self):
        return self.pick(None, "", "x", "3", " ", [], [[]], {}, {"a": 1}, True, False, OPEN, [1, "a"], "NaN")

    def any_(self):
        return self.pick(self.num, self.junk, self.text, self.ids)()

    def short(self) -> str:
        """A prompt that reaches the model cheaply."""
        return self.pick("hello", "What is 2+2?", "Answer: " + OPEN + DOC + CLOSE + " why?", "naïve 日本語 🚀",
                         DOC, "a", "The quick brown fox")

    def text(self) -> str:
        r = self.rng
        return self.pick(
            "", " ", "\n\t ", "\u3000", "hello", "Answer: " + OPEN + DOC + CLOSE + " why?", OPEN + DOC + CLOSE,
            OPEN, CLOSE, CLOSE + OPEN, OPEN + OPEN + "x" + CLOSE + CLOSE, OPEN + CLOSE, OPEN + " " + CLOSE,
            "x" * r.randint(1, 600), "naïve 日本語 🚀 " * r.randint(1, 20), "\x00\x01\u202e", "\ud800 lone",
            "word " * r.randint(1, self.cheap), "word " * (self.context + r.randint(1, 50)),
            OPEN + "a" + CLOSE + OPEN + DOC + CLOSE, DOC + OPEN + DOC * 3 + CLOSE, OPEN + "é" * 40 + CLOSE + "?",
            "<|im_start|>user\nhi<|im_end|>", "<s></s><|endoftext|>", "{{ messages }}{% for %}", "<image>",
            "<|image|>", "%s%n", "\\u0000")

    def ids(self) -> list:
        """Token ids in and out of the vocabulary, markers, wrong types."""
        r, v = self.rng, self.vocab
        plain = [r.randrange(0, v) for _ in range(r.randint(0, 40))]
        return self.pick(
            [], plain, plain, [0], [v - 1], [v], [v + 1], [-1], [2**31], [2**63], [10**18], [-100, -101],
            [-100, *plain, -101], [1, -100, 5] + plain, [-101, 5, -100], [-100, -100, 5, -101],
            [1, -100, *range(100, 140), -101, 7], [1.5, 2], ["a", "b"], [[1, 2], [3]], [True], [None],
            [5] * r.randint(1, self.cheap), [5] * (self.context + r.randint(0, 20)),
            [5] * (self.context - 2 if self.long_ok else self.cheap))

    def valid_ids(self) -> list:
        return [self.rng.randrange(2, self.vocab) for _ in range(self.rng.randint(1, 12))]

    def logprob_ids(self):
        """token_ids_logprob: ids in and out of the vocabulary."""
        v = self.vocab
        return self.pick([0], [v - 1], [v], [v + 1], [-1], [], [2**63], [0, v - 1, v], list(range(200)), [[1]],
                         [[v]], "x", None, [1.5])

    def media(self):
        return self.pick("x", [[]], [], "", [""], ["x"], [[""]], None, 5, {"url": "x"}, "data:image/png;base64,",
                         "data:image/png;base64,iVBORw0KGgo=", "file:///nonexistent.png",
                         "http://127.0.0.1:9/x.png", ["x", "y"], [["x"]], [None], " ")

    def prompt_field(self):
        """A generate prompt: text (one or a batch) or ids."""
        return self.pick(lambda: ("text", self.text()), lambda: ("text", self.short()),
                         lambda: ("input_ids", self.ids()), lambda: ("input_ids", self.valid_ids()),
                         lambda: ("text", [self.text() for _ in range(self.rng.randint(0, 3))]),
                         lambda: ("input_ids", [self.ids() for _ in range(self.rng.randint(1, 3))]))()

    def sampling_value(self, key):
        if key in ("stop", "stop_regex"):
            return self.pick(self.text(), [OPEN, CLOSE], ["", ""], [], "[", ["a"] * 200, 5)
        if key == "stop_token_ids":
            return self.pick(self.ids(), self.logprob_ids())
        if key in ("regex", "ebnf", "json_schema", "structural_tag"):
            return self.pick("[a-z]+", "(", "*", '{"type": "object"}', '{"type": "nope"}', "{", "root ::= ", "",
                             5, {"type": "object"}, OPEN)
        if key == "logit_bias":
            v = self.vocab
            return self.pick({"0": 100}, {str(v - 1): -100}, {str(v): 1}, {str(v + 1): 1}, {"-1": 1}, {"x": 1},
                             {str(2**63): 1}, {"5": math.nan}, {"5": 1e308}, [], "x")
        if key in ("max_new_tokens", "min_new_tokens"):
            return self.length()
        if key in ("top_k", "n"):
            return self.pick(self.count, self.num)()
        if key in ("custom_params", "watermark"):
            return self.pick({}, {"a": 1}, "x", [], None, {"gamma": self.num()})
        if key in ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim"):
            return self.pick(True, False, self.junk())
        return self.num()

    SAMPLING = ("max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k", "min_p", "frequency_penalty",
                "presence_penalty", "repetition_penalty", "n", "stop", "stop_token_ids", "stop_regex", "ignore_eos",
                "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "regex", "ebnf",
                "json_schema", "structural_tag", "stream_interval", "logit_bias", "sampling_seed", "custom_params",
                "watermark", "beam_width", "no_such_key")

    def hints(self):
        payload = self.pick({"chunks": [[0, 2]]}, {"chunks": [[16, 48]], "pads": [[48, 1]], "compile": True},
                            {"chunks": "x"}, {}, {"pads": [[-1, 10**9]]}, {"chunks": [[0, 2**63]]})
        return self.pick({"protocol_version": "1", "message_id": "m", "actions": [
            {"action_id": "a", "action_type": "mepic.chunks", "action_version": self.pick("1", "2", 1),
             "payload": payload}]}, {"actions": "nope"}, "string", None, {"actions": [None]})

    def mutate(self, body: dict, fields: dict, k: int | None = None) -> dict:
        """`body` with k of `fields` (name -> drawer) set to drawn values or removed."""
        k = self.rng.randint(1, 3) if k is None else k
        for key in self.rng.sample(sorted(fields), min(k, len(fields))):
            if self.chance(0.08):
                body.pop(key, None)
            else:
                body[key] = fields[key]()
        return body

    def schema_extras(self, route: str, body: dict, k: int = 2) -> dict:
        """Up to k more fields of the route's request schema, drawn from their types."""
        props = self.properties(route)
        for key in self.rng.sample(sorted(props), min(k, len(props))):
            body[key] = self.from_schema(props[key])
        return body

    # -- route drawers: a well-formed body, then fields replaced

    def generate(self) -> dict:
        r = self.rng
        body = {"text": self.short(), "sampling_params": {"max_new_tokens": r.randint(1, 4),
                                                          "temperature": self.pick(0, 0.7)}}
        if self.chance(0.3):
            body = {"input_ids": self.valid_ids(), "sampling_params": body["sampling_params"]}
        if self.chance(0.25):
            body["stream"] = True
        theme = self.pick("prompt", "logprobs", "logprobs", "logprobs", "sampling", "sampling", "media", "media",
                          "fields", "fields", "none")
        if theme == "prompt":
            body.pop("text", None), body.pop("input_ids", None)
            key, value = self.prompt_field()
            body[key] = value
        elif theme == "logprobs":  # each from its whole range, over a prompt of any kind
            self.mutate(body, {"logprob_start_len": self.position, "top_logprobs_num": self.count,
                               "token_ids_logprob": self.logprob_ids,
                               "return_text_in_logprobs": lambda: self.pick(True, False)})
            body["return_logprob"] = self.pick(True, True, True, True, False, "x", 1)
            if self.chance(0.3):
                body.pop("text", None), body.pop("input_ids", None)
                key, value = self.prompt_field()
                body[key] = value
        elif theme == "sampling":
            sp = body["sampling_params"]
            self.mutate(sp, {k: (lambda k=k: self.sampling_value(k)) for k in self.SAMPLING})
            if "min_new_tokens" not in sp and self.chance(0.3):
                sp["min_new_tokens"] = 1  # the min-tokens penalizer indexes the vocabulary with the stop ids
        elif theme == "media":  # a media field beside an empty, whitespace or normal prompt
            body.pop("text", None), body.pop("input_ids", None)
            key, value = self.pick(("text", ""), ("text", " "), ("text", "\n\t "), ("text", self.short()),
                                   ("input_ids", []), ("input_ids", self.valid_ids()), ("text", OPEN + CLOSE),
                                   ("text", [""]), ("text", OPEN + DOC + CLOSE), (None, None))
            if key:
                body[key] = value
            for field in self.rng.sample(["image_data", "audio_data", "video_data"], self.pick(1, 1, 2)):
                body[field] = self.media()
            if self.chance(0.2):
                body["modalities"] = self.pick(["image"], ["x"], "x", [], ["multi-images", "video"])
        elif theme == "fields":  # the fields this drawer knows, and every other field of GenerateReqInput
            self.mutate(body, {k: (lambda k=k: self.field_value(k)) for k in {*self.fields(), *self.generate_fields}})
        if self.long_ok and self.chance(0.05):  # a prompt that fills the context to an edge, and a length against it
            n = self.context - self.pick(1, 2, 3, 4, 5)
            body = {"input_ids": [5] * n, "sampling_params": {"max_new_tokens": self.pick(
                1, 2, self.context - n, self.context - n + 1)}}
        return self.tame(body, "max_new_tokens")

    def fields(self) -> dict:
        """Drawers for fields of /generate; any other field gets filler()."""
        return {
            "text": self.text, "input_ids": self.ids, "image_data": self.media, "audio_data": self.media,
            "video_data": self.media, "return_logprob": lambda: self.pick(True, "x", 1),
            "logprob_start_len": self.position, "top_logprobs_num": self.count, "token_ids_logprob": self.logprob_ids,
            "stream": lambda: self.pick(True, False, "x"),
            "rid": lambda: self.pick("r", "", OPEN + "r" + CLOSE, ["a", "b"], 5, None, *(self.rids[-3:] or ["x"])),
            "kv_hints": self.hints, "session_params": self.session_params, "lora_path": self.any_,
            "input_embeds": lambda: self.pick([], [[]], [[0.0] * 8], [[0.5] * 128], "x", [[1e308] * 576]),
            "custom_logit_processor": lambda: self.pick("x", "{}", '{"callable": "os.system"}', 5),
            "priority": self.num, "data_parallel_rank": self.num, "routed_dp_rank": self.num,
            "bootstrap_room": self.num,
            "sampling_params": lambda: self.pick("not a dict", None, [], {}, {"max_new_tokens": self.length()}),
            "max_thinking_tokens": self.num, "routed_experts_start_len": self.num,
            "modalities": lambda: self.pick(["image"], ["x"], "x", [], ["multi-images", "video"]),
        }

    def filler(self):
        """A value for a field no drawer knows: each kind a field may take, and some it should not."""
        return self.pick({"a": "b"}, {"a": 1}, [1], ["x"], [[1]], "x", "", 5, 0, -1, 2**31, 2**63, True, False, 1.5)

    def field_value(self, name: str):
        return self.fields().get(name, self.filler)()

    def generate_one(self, field: str = "", sampling: str = "") -> dict:
        """A plain /generate with one field, or one sampling parameter, drawn (the run sends each once)."""
        body = {"text": self.short(), "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
        if sampling:
            body["sampling_params"][sampling] = self.sampling_value(sampling)
            if sampling == "stop_token_ids" and self.chance(0.5):
                body["sampling_params"]["min_new_tokens"] = 1  # the min-tokens penalizer indexes the vocabulary
        if field:
            body[field] = self.field_value(field)
            if field in ("logprob_start_len", "top_logprobs_num", "token_ids_logprob", "return_text_in_logprobs") \
                    or field.startswith("return_flat_raw"):
                body["return_logprob"] = True
        return self.tame(body, "max_new_tokens")

    LENGTHS = ("max_new_tokens", "max_tokens", "max_completion_tokens", "num_predict", "max_output_tokens")
    TOP_K = ("top_logprobs_num", "logprobs", "top_logprobs")

    def tame(self, body, length: str):
        """Keep each request to seconds: no generation longer than 8 tokens but at the context's edge (a random
        model never ends one; an absent length is the rest of the context), and a short prompt under a large
        top-k of logprobs (a k over the vocabulary per token answers megabytes)."""
        if not isinstance(body, dict):
            return body

        def count(x):
            return x if isinstance(x, int) and not isinstance(x, bool) else 1 if x is None else 0

        inner = [body] + [v for v in body.values() if isinstance(v, dict)]
        top = max([count(d.get(k)) for d in inner for k in self.TOP_K] + [
            len(body["token_ids_logprob"]) if isinstance(body.get("token_ids_logprob"), list) else 0])
        for d in inner:
            for k in self.LENGTHS:
                v = d.get(k)
                if 8 < count(v) < self.context:
                    d[k] = self.pick(2, 4)
        if length == "num_predict" and body.get("options") is None:  # Ollama's default: 2,048 tokens, minutes
            body["options"] = {"num_predict": 4}
        if length == "num_predict" and body.get("options") is None:
            body["options"] = {}
        if length == "max_new_tokens" and not self.long_ok and not body.get("sampling_params"):
            body["sampling_params"] = {}  # SGLang's default is 128 tokens
        if length:  # an absent or null length is the rest of the context (Ollama: 2,048 tokens)
            target = body.get("sampling_params") if length == "max_new_tokens" else body.get("options") \
                if length == "num_predict" else body
            if isinstance(target, dict) and target.get(length) is None:
                target[length] = 4
        if top > 20:
            for k, short in (("text", "hello"), ("prompt", "hello"), ("input_ids", [5, 6]),
                             ("messages", [{"role": "user", "content": "hi"}])):
                if k in body:
                    body[k] = short
            for d in inner:
                if "n" in d:
                    d["n"] = 1
        return body

    def session_params(self):
        sid = self.pick(*(self.sessions[-3:] or ["nope"]), "nope", "", None)
        return self.pick({"id": sid}, {"id": sid, "rid": self.pick("r", None, *(self.rids[-2:] or ["x"])),
                                       "offset": self.num(), "replace": self.pick(True, False)},
                         {"id": sid, "offset": -1}, "x", {}, {"id": 5})

    def open_session(self) -> dict:
        return self.mutate({"capacity_of_str_len": self.pick(10, 1000)},
                           {"capacity_of_str_len": self.num, "session_id": lambda: self.pick("s", "", OPEN, 5),
                            "streaming": lambda: self.pick(True, "x"), "timeout": self.num}, self.pick(0, 0, 1, 2))

    def completions(self) -> dict:
        body = {"model": "m", "prompt": self.short(), "max_tokens": self.rng.randint(1, 4), "temperature": 0}
        fields = {
            "prompt": lambda: self.pick(self.text(), [self.text()], self.ids(), [self.ids()], None, 5, [], [[]]),
            "max_tokens": self.length, "n": self.num, "best_of": self.num, "logprobs": self.count,
            "echo": lambda: self.pick(True, False, "x"), "stream": lambda: self.pick(True, False),
            "stream_options": lambda: self.pick({"include_usage": True}, {"continuous_usage_stats": True}, "x"),
            "suffix": self.text, "stop": lambda: self.sampling_value("stop"), "top_k": self.num, "top_p": self.num,
            "min_p": self.num, "seed": self.num, "logit_bias": lambda: self.sampling_value("logit_bias"),
            "frequency_penalty": self.num, "presence_penalty": self.num, "repetition_penalty": self.num,
            "min_tokens": self.num, "temperature": self.num, "regex": lambda: self.sampling_value("regex"),
            "json_schema": lambda: self.sampling_value("json_schema"), "response_format": self.response_format,
            "stop_token_ids": lambda: self.sampling_value("stop_token_ids"), "rid": self.any_, "user": self.any_,
            "lora_path": self.any_, "return_hidden_states": lambda: True, "model": self.junk,
        }
        return self.shaped("/v1/completions", body, fields, "max_tokens", themes=(
            ("prompt", "suffix", "echo"), NUMBERS + ("logprobs", "best_of", "echo"),
            ("stop", "logit_bias", "regex", "json_schema", "response_format", "stop_token_ids")))

    def response_format(self):
        return self.pick({"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
                         {"type": "json_schema"}, {"type": "text"}, {"type": "nope"}, "x", {},
                         {"type": "structural_tag", "structures": [], "triggers": []})

    def content(self):
        """A chat message's content: text, parts (media among them), wrong types."""
        part = self.pick(
            lambda: {"type": "text", "text": self.text()},
            lambda: {"type": "image_url", "image_url": {"url": self.media()}},
            lambda: {"type": "image_url", "image_url": self.media()},
            lambda: {"type": "audio_url", "audio_url": {"url": self.media()}},
            lambda: {"type": "video_url", "video_url": {"url": self.media()}},
            lambda: {"type": "input_audio", "input_audio": {"data": self.media(), "format": "wav"}},
            lambda: {"type": "bogus"}, lambda: {"type": "text", "text": OPEN + DOC + CLOSE}, lambda: {})
        return self.pick(self.text, self.short, lambda: "", lambda: " ", lambda: None, lambda: 7,
                         lambda: [part() for _ in range(self.rng.randint(0, 3))], lambda: [part()])()

    def messages(self):
        def message():
            role = self.pick("user", "user", "system", "assistant", "tool", "developer", "nobody", "", None)
            m = {"role": role, "content": self.content()}
            if self.chance(0.1):
                m[self.pick("tool_calls", "name", "tool_call_id", "reasoning_content", "images")] = self.any_()
            return m
        return self.pick(lambda: [message() for _ in range(self.rng.randint(0, 4))], lambda: [message()],
                         lambda: "hi", lambda: None, lambda: [], lambda: [{}], lambda: [None], lambda: [[]])()

    def chat(self, route: str = "/v1/chat/completions") -> dict:
        body = {"model": "m", "max_tokens": self.rng.randint(1, 4), "temperature": 0,
                "messages": [{"role": "user", "content": self.short()}]}
        fields = {
            "messages": self.messages, "max_tokens": self.length, "max_completion_tokens": self.length, "n": self.num,
            "logprobs": lambda: self.pick(True, False, "x", 1), "top_logprobs": self.count,
            "stream": lambda: self.pick(True, False), "stream_options": lambda: self.pick({"include_usage": True}, "x"),
            "tools": lambda: self.pick([], [{"type": "function", "function": {"name": "f", "parameters": {}}}],
                                       [{"type": "function"}], "x", [{}]),
            "tool_choice": lambda: self.pick("auto", "required", "none", "x", {"type": "function",
                                                                             "function": {"name": "nope"}}),
            "response_format": self.response_format, "stop": lambda: self.sampling_value("stop"),
            "temperature": self.num, "top_p": self.num, "top_k": self.num, "min_p": self.num, "seed": self.num,
            "logit_bias": lambda: self.sampling_value("logit_bias"), "frequency_penalty": self.num,
            "presence_penalty": self.num, "repetition_penalty": self.num, "min_tokens": self.num,
            "continue_final_message": lambda: self.pick(True, "x"),
            "chat_template_kwargs": lambda: self.pick({"enable_thinking": True}, {"x": OPEN}, "x", []),
            "separate_reasoning": lambda: self.pick(True, "x"), "reasoning_effort": lambda: self.pick("low", "x", 5),
            "return_hidden_states": lambda: True, "rid": self.any_, "regex": lambda: self.sampling_value("regex"),
            "ebnf": lambda: self.sampling_value("ebnf"), "model": self.junk,
        }
        body = self.shaped(route, body, fields, "max_tokens", themes=(
            ("messages",), ("messages",), NUMBERS + ("max_completion_tokens", "logprobs", "top_logprobs"),
            ("tools", "tool_choice", "response_format", "stop", "logit_bias", "regex", "ebnf")))
        if body.get("logprobs") is not True and "top_logprobs" in body and self.chance(0.7):
            body["logprobs"] = True
        return body

    def shaped(self, route: str, body: dict, fields: dict, length: str = "", themes=()) -> dict:
        """Mostly one to three fields of one theme (a tuple of field names; the rest are one more) replaced;
        sometimes fields of the route's schema drawn as well."""
        rest = tuple(sorted(set(fields) - {f for theme in themes for f in theme}))
        if self.chance(0.85):
            theme = self.rng.choice([*themes, rest] if rest else list(themes))
            self.mutate(body, {k: fields[k] for k in theme})
        if self.chance(0.25):
            self.schema_extras(route, body, self.rng.randint(1, 2))
        return self.tame(body, length)

    def options(self):
        return self.mutate({"num_predict": self.rng.randint(1, 4), "temperature": 0},
                           {"num_predict": self.length, "temperature": self.num, "top_p": self.num, "top_k": self.num,
                            "seed": self.num, "stop": lambda: self.sampling_value("stop"), "num_ctx": self.num,
                            "repeat_penalty": self.num, "min_p": self.num, "frequency_penalty": self.num},
                           self.pick(1, 1, 2))

    def ollama_generate(self) -> dict:
        body = {"model": "m", "prompt": self.short(), "stream": self.pick(False, True),
                "options": {"num_predict": self.rng.randint(1, 4), "temperature": 0}}
        fields = {"prompt": lambda: self.pick(self.text(), None, 5, [], ["x"]), "system": self.text,
                  "template": self.text, "raw": lambda: self.pick(True, "x"), "images": self.media,
                  "stream": lambda: self.pick(True, False, "x", None),
                  "format": lambda: self.pick("json", "x", {"type": "object"}, ""),
                  "options": lambda: self.pick(self.options(), "x", None, {"num_predict": self.length()}),
                  "keep_alive": self.any_, "context": self.ids, "suffix": self.text, "model": self.junk,
                  "think": lambda: self.pick(True, "x")}
        return self.shaped("/api/generate", body, fields, "num_predict", themes=(
            ("prompt", "system", "template", "raw", "suffix", "context"), ("images", "prompt"), ("options",),
            ("options", "stream")))

    def ollama_chat(self) -> dict:
        def message():
            m = {"role": self.pick("user", "user", "system", "assistant", "tool", "nobody", ""),
                 "content": self.pick(self.text(), self.short(), "", " ", None, 5, [{"type": "text", "text": "x"}])}
            if self.chance(0.15):
                m["images"] = self.media()
            return m
        body = {"model": "m", "messages": [{"role": "user", "content": self.short()}],
                "stream": self.pick(False, True), "options": {"num_predict": self.rng.randint(1, 4), "temperature": 0}}
        fields = {"messages": lambda: self.pick([message() for _ in range(self.rng.randint(0, 3))], [message()],
                                                "hi", None, [], [{}]),
                  "stream": lambda: self.pick(True, False, "x", None),
                  "format": lambda: self.pick("json", "x", {"type": "object"}),
                  "tools": lambda: self.pick([], [{"type": "function", "function": {"name": "f"}}], "x"),
                  "options": lambda: self.pick(self.options(), "x", None), "keep_alive": self.any_,
                  "model": self.junk, "think": lambda: self.pick(True, "x")}
        return self.shaped("/api/chat", body, fields, "num_predict", themes=(
            ("messages",), ("messages", "stream"), ("options",), ("options", "stream")))

    def ollama_show(self) -> dict:
        return self.pick({"model": "m"}, {"name": "m"}, {"model": self.any_()}, {}, {"name": OPEN})

    def anthropic(self, route: str = "/v1/messages") -> dict:
        def block():
            return self.pick({"type": "text", "text": self.text()},
                             {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                          "data": self.pick("", "x", "iVBORw0KGgo=")}},
                             {"type": "image", "source": {"type": "url", "url": self.media()}},
                             {"type": "tool_result", "tool_use_id": "x", "content": self.text()},
                             {"type": "bogus"}, {})
        body = {"model": "m", "messages": [{"role": "user", "content": self.short()}]}
        if route == "/v1/messages":
            body["max_tokens"] = self.rng.randint(1, 4)
        fields = {"messages": lambda: self.pick(
                      [{"role": self.pick("user", "assistant", "system", "x"),
                        "content": self.pick(self.text(), [block() for _ in range(self.rng.randint(0, 3))], None, 5)}
                       for _ in range(self.rng.randint(0, 3))], "hi", None, [{}]),
                  "max_tokens": self.length, "system": lambda: self.pick(self.text(), [block()], 5),
                  "stop_sequences": lambda: self.sampling_value("stop"), "temperature": self.num, "top_k": self.num,
                  "top_p": self.num, "stream": lambda: self.pick(True, False),
                  "tools": lambda: self.pick([], [{"name": "f", "input_schema": {}}], [{}], "x"),
                  "tool_choice": lambda: self.pick({"type": "auto"}, {"type": "tool", "name": "nope"}, "x"),
                  "metadata": self.any_, "thinking": lambda: self.pick({"type": "enabled", "budget_tokens": self.num()},
                                                                       "x"), "model": self.junk}
        return self.shaped(route, body, fields, "max_tokens" if route == "/v1/messages" else "", themes=(
            ("messages", "system"), ("messages",), ("max_tokens", "temperature", "top_k", "top_p", "stop_sequences")))

    def score(self) -> dict:
        body = {"model": "m", "query": self.short(), "items": [" a", " b"], "label_token_ids": [5, 6],
                "apply_softmax": True}
        fields = {"query": lambda: self.pick(self.text(), self.ids(), None, 5, []),
                  "items": lambda: self.pick([self.text()], [self.ids()], [], [[]], "x", None, [self.text()] * 40),
                  "label_token_ids": lambda: self.pick(self.ids(), self.logprob_ids()),
                  "apply_softmax": lambda: self.pick(True, False, "x"), "item_first": lambda: self.pick(True, "x"),
                  "model": self.junk}
        return self.shaped("/v1/score", body, fields)

    def rerank(self) -> dict:
        body = {"query": self.short(), "documents": ["a", "b"]}
        fields = {"query": lambda: self.pick(self.text(), None, 5), "documents": lambda: self.pick(
            [self.text()], [], "x", None, [5]), "top_n": self.num, "return_documents": lambda: self.pick(True, "x")}
        return self.shaped("/v1/rerank", body, fields)

    def tokenize(self, route: str = "/v1/tokenize") -> dict:
        body = {"model": "m", "prompt": self.short()}
        fields = {"prompt": lambda: self.pick(self.text(), [self.text(), self.text()], [], None, 5, self.ids()),
                  "add_special_tokens": lambda: self.pick(True, False, "x"), "model": self.junk}
        return self.shaped(route, body, fields)

    def detokenize(self, route: str = "/v1/detokenize") -> dict:
        body = {"model": "m", "tokens": self.valid_ids()}
        fields = {"tokens": lambda: self.pick(self.ids(), self.logprob_ids(), [self.ids(), self.ids()], "x", None,
                                              [[]], list(range(self.vocab + 2))),
                  "skip_special_tokens": lambda: self.pick(True, False, "x"), "model": self.junk}
        return self.shaped(route, body, fields)

    def embeddings(self, route: str = "/v1/embeddings") -> dict:
        body = {"model": "m", "input": self.short()} if route != "/encode" else {"text": self.short()}
        fields = {"input": lambda: self.pick(self.text(), [self.text()], self.ids(), [self.ids()], [], [[]], None),
                  "text": self.text, "dimensions": self.num,
                  "encoding_format": lambda: self.pick("float", "base64", "x"),
                  "image_data": self.media, "input_ids": self.ids}
        return self.shaped(route, body, fields)

    def responses(self) -> dict:
        body = {"model": "m", "input": self.short(), "max_output_tokens": 2}
        fields = {"input": lambda: self.pick(self.text(), [{"role": "user", "content": self.content()}], [], None),
                  "instructions": self.text, "max_output_tokens": self.length, "temperature": self.num,
                  "top_p": self.num, "top_logprobs": self.count, "stream": lambda: self.pick(True, False),
                  "previous_response_id": lambda: self.pick("resp_x", "", 5), "store": lambda: self.pick(True, "x"),
                  "background": lambda: self.pick(True, "x"), "tools": lambda: self.pick([], "x", [{}])}
        return self.shaped("/v1/responses", body, fields, "max_output_tokens")

    def vertex(self) -> dict:
        body = {"instances": [{"text": self.short()}],
                "parameters": {"sampling_params": {"max_new_tokens": 2, "temperature": 0}}}
        fields = {"instances": lambda: self.pick([], [{}], [{"text": self.text()}], [{"text": "", "image_data": "x"}],
                                                 [{"input_ids": self.ids()}], "x", None, [self.generate()]),
                  "parameters": lambda: self.pick(
                      "x", None, {"sampling_params": {"max_new_tokens": self.length()}}, {"sampling_params": "x"},
                      {"return_logprob": True, "top_logprobs_num": self.count(),
                       "sampling_params": {"max_new_tokens": 2}})}
        return self.shaped("/vertex_generate", body, fields)

    def drawers(self):
        return {"/generate": self.generate, "/v1/completions": self.completions, "/v1/chat/completions": self.chat,
                "/invocations": lambda: self.chat("/invocations"), "/api/generate": self.ollama_generate,
                "/api/chat": self.ollama_chat, "/api/show": self.ollama_show, "/v1/messages": self.anthropic,
                "/v1/messages/count_tokens": lambda: self.anthropic("/v1/messages/count_tokens"),
                "/v1/score": self.score, "/v1/rerank": self.rerank, "/v1/tokenize": self.tokenize,
                "/tokenize": lambda: self.tokenize("/tokenize"), "/v1/detokenize": self.detokenize,
                "/detokenize": lambda: self.detokenize("/detokenize"), "/v1/embeddings": self.embeddings,
                "/encode": lambda: self.embeddings("/encode"), "/v1/responses": self.responses,
                "/vertex_generate": self.vertex, "/open_session": self.open_session}

    # -- any route: its schema, or generic bodies

    def resolve(self, schema: dict) -> dict:
        while isinstance(schema, dict) and "$ref" in schema:
            schema = self.schema.get("components", {}).get("schemas", {}).get(schema["$ref"].rsplit("/", 1)[-1], {})
        return schema if isinstance(schema, dict) else {}

    def body_schema(self, route: str, method: str = "post") -> dict:
        op = self.schema.get("paths", {}).get(route, {}).get(method.lower()) or {}
        content = (op.get("requestBody") or {}).get("content") or {}
        media = content.get("application/json") or next(iter(content.values()), {})
        return self.resolve(media.get("schema") or {})

    def properties(self, route: str) -> dict:
        return self.body_schema(route).get("properties") or {}

    def from_schema(self, schema: dict, depth: int = 0):
        """A value of the schema's type, mostly; else any value."""
        s = self.resolve(schema)
        if depth > 3 or self.chance(0.2):
            return self.any_()
        options = s.get("anyOf") or s.get("oneOf") or s.get("allOf")
        if options:
            return self.from_schema(self.rng.choice(options), depth + 1)
        if "enum" in s:
            return self.rng.choice(s["enum"])
        kind = s.get("type")
        if kind == "integer":
            return self.int_()
        if kind == "number":
            return self.pick(self.int_, self.float_)()
        if kind == "boolean":
            return self.pick(True, False)
        if kind == "string":
            return self.pick(self.text, self.short, lambda: "m")()
        if kind == "array":
            return [self.from_schema(s.get("items") or {}, depth + 1) for _ in range(self.rng.randint(0, 3))]
        if kind == "object" or "properties" in s:
            return self.object_from(s, depth + 1)
        return self.any_()

    def object_from(self, s: dict, depth: int = 0) -> dict:
        props, required = s.get("properties") or {}, set(s.get("required") or ())
        return {k: self.from_schema(v, depth) for k, v in props.items() if k in required or self.chance(0.3)}

    def generic(self, route: str, method: str):
        """A body for a route without a drawer: from its schema, or one of the generic bodies."""
        schema = self.body_schema(route, method if method != "PUT" else "put") or self.body_schema(route)
        if schema and self.chance(0.6):
            return self.object_from(schema)
        return self.pick(
            None, None, "", "{not json", "[]", "null", '"text"', "0", {}, {}, {"text": self.text()},
            {"prompt": self.text()}, {"input": self.text()}, {"messages": self.messages()}, {"model": "m"},
            {"rid": self.any_()}, {"abort_all": True}, {"name": self.any_()}, {"x": self.any_()},
            [self.any_()], {"text": self.text(), "image_data": self.media()}, {"input_ids": self.ids()},
            {"session_id": self.pick(*(self.sessions[-2:] or ["s"]))}, {self.pick("rid", "id", "session_id"): None})

    def fill(self, path: str) -> str:
        """A route's path with its parameters drawn."""
        def value(_):
            return quote(str(self.pick("m", "x", "0", "resp_1", "a/b", "..", "%", OPEN, "é" * 3, "x" * 3000, " ")),
                         safe="/")
        return re.sub(r"\{[^}]+\}", value, path)

    # Nestings drawn: within the server's bound (128, body_types.MAX_JSON_DEPTH) and past it, past orjson's
    # 1,024 and past the stdlib parser's recursion limit (`[` * 5000 was a 500: issue 85.6)
    DEPTHS = (64, 128, 129, 1025, 5000, 100000)

    def deep(self, body=None) -> str:
        """A JSON body nested deep: bare arrays or objects, or `body` (a prompt if it is no object) with one
        field, its own or another, nested so."""
        r = self.deep_rng
        n = r.choice(self.DEPTHS)
        arrays, objects = "[" * n + "]" * n, '{"a": ' * n + "1" + "}" * n
        kind = r.choice(("arrays", "objects", "field", "field"))
        if kind != "field":
            return arrays if kind == "arrays" else objects
        base = body if isinstance(body, dict) and body else {r.choice(("text", "prompt", "input", "messages")): "hi"}
        key = r.choice([*sorted(base), "x"])
        rest = json.dumps({k: v for k, v in base.items() if k != key})
        return rest[:-1] + (", " if rest != "{}" else "") + json.dumps(key) + ": " + r.choice((arrays, objects)) + "}"

    def request(self, route: str, method: str):
        """(method, url path, body) for one request to `route`; a str body is sent as is."""
        drawer = self.drawers().get(route)
        if method in ("GET", "HEAD", "DELETE") or drawer is None or self.chance(0.04):
            body = self.generic(route, method) if method not in ("GET", "HEAD") or self.chance(0.1) else None
            body = self.tame(body, LENGTH_OF.get(route, ""))
        else:
            body = drawer()
        if isinstance(body, (dict, list)) and self.chance(0.03):
            body = self.pick("{not json", "[]", "null", '"text"', "", json.dumps(body)[:-1])
        elif method not in ("GET", "HEAD") and self.deep_rng.random() < 0.02:
            body = self.deep(body)
        return method, self.fill(route), body


# ---------------------------------------------------------------------------------------------
# Sending, judging


class Failure(Exception):
    def __init__(self, kind: str, detail: str, key: str):
        super().__init__(detail)
        self.kind, self.detail, self.key = kind, detail, key


def send(server, method: str, path: str, body) -> tuple[int, str]:
    """The status and the whole answer (a stream read to its end), in REQUEST_TIMEOUT."""
    data = None if body is None else body if isinstance(body, str) else json.dumps(body)
    deadline = time.monotonic() + REQUEST_TIMEOUT
    try:
        with requests.request(method, server.url + path, data=None if data is None else data.encode("utf-8",
                              "surrogatepass"), headers={"content-type": "application/json"}, stream=True,
                              timeout=REQUEST_TIMEOUT) as r:
            chunks = []
            for chunk in r.iter_content(65536):
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    raise Failure("hang", f"the answer did not end in {REQUEST_TIMEOUT:.0f} s", "hang")
            return r.status_code, b"".join(chunks).decode("utf-8", "replace")
    except requests.Timeout:
        raise Failure("hang", f"no answer in {REQUEST_TIMEOUT:.0f} s", "hang") from None
    except requests.RequestException as e:
        raise Failure("dropped", f"no answer ({type(e).__name__}: {str(e)[:200]})", "dropped") from None


def explains(text: str) -> bool:
    try:
        body = json.loads(text)
    except ValueError:  # a plain-text reason (SGLang's admin routes: "Flush cache failed.") says what is wrong too
        return bool(text.strip()) and not text.lstrip().startswith("<")
    return isinstance(body, dict) and any(body.get(k) for k in ("error", "message", "detail", "error_message"))


STREAMED_5XX = re.compile(r'"(?:code|status_code)"\s*:\s*5\d\d|Internal Server Error')


def judge(method: str, status: int, text: str) -> None:
    """Raise Failure unless the answer is a 2xx or a 4xx that says what is wrong."""
    head = text[:600]
    if status >= 500:
        raise Failure("5xx", f"{status} {head}", f"{status} {_gist(text)}")
    if 400 <= status < 500 and method != "HEAD" and not explains(text):
        raise Failure("4xx without a message", f"{status} without a message: {head}", f"{status} bare")
    if status < 300 and STREAMED_5XX.search(text[:200000]):
        at = STREAMED_5XX.search(text).start()
        raise Failure("5xx in the answer", f"{status} with a 5xx inside: {text[max(0, at - 300):at + 300]}",
                      f"{status} streamed 5xx {_gist(text[max(0, at - 300):at + 300])}")


def _gist(text: str) -> str:
    """An error's message with its numbers dropped: failures that differ only there are one failure."""
    try:
        body = json.loads(text)
        if isinstance(body, dict):
            found = body.get("error") or body.get("message") or body.get("detail") or body
            text = json.dumps(found.get("message", found) if isinstance(found, dict) else found)
    except ValueError:
        pass
    return re.sub(r"\d+", "#", text)[:80]


def last_traceback(log: str, lines: int = 30) -> str:
    """The log's last traceback (or its last lines)."""
    rows = log.splitlines()
    starts = [i for i, row in enumerate(rows) if "Traceback (most recent call last)" in row]
    if starts:
        tail = rows[starts[-1]:]
        end = next((i + 1 for i, row in enumerate(tail[1:], 1)
                    if re.match(r"[\w.]*(Error|Exception|Exit|Interrupt)\b", row)), len(tail))
        return "\n".join(tail[:end][-lines:])
    return "\n".join(rows[-lines:])


def log_since(server, offset: int) -> str:
    with open(server.log_path, "rb") as f:
        f.seek(offset)
        return f.read().decode("utf-8", "replace")


def check_alive(server, probe: bool) -> None:
    """Raise Failure("death") unless the server process lives and answers a one-token generation (`probe`:
    with the longer timeout of a request)."""
    why = None
    if server.proc.poll() is not None:
        why = f"the server exited with code {server.proc.returncode}"
    else:
        try:
            # One token through the scheduler: SGLang's GET /health waits a whole second by design, which
            # halved the requests a run could send.
            r = requests.post(server.url + "/generate", timeout=HEALTH_TIMEOUT if not probe else REQUEST_TIMEOUT,
                              json={"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
            if r.status_code != 200:
                why = f"a one-token generation answered {r.status_code}: {r.text[:200]}"
        except requests.RequestException as e:
            why = f"no answer to the health check ({type(e).__name__})"
    if why is None:
        return
    time.sleep(1.0)  # the log's last lines land as the process group dies
    tb = last_traceback(server.log())
    last = next((row for row in reversed(tb.splitlines()) if row.strip()), "")
    raise Failure("death", f"{why}\n--- server log ({server.log_path}) ---\n{tb}",
                  "death " + re.sub(r"\d+", "#", last)[-120:])


def shown(body) -> str:
    return body if isinstance(body, str) else json.dumps(body)


# ---------------------------------------------------------------------------------------------
# The run


MODELS = {"tiny": (models.TEST_MODEL, 4096), "smollm2": ("smollm2-135m", 200)}  # name, cheap prompt tokens


@pytest.fixture(scope="module", params=sorted(MODELS))
def fuzzed(request, registered):
    """A server of the fuzzer's own (it calls every route, administration included), always stopped."""
    name, cheap = MODELS[request.param]
    path = models.build(name)
    server = ServerProcess(path, "--dtype", "float32", startup_timeout=900)  # a start on a loaded 2-core machine
    try:
        server.start()
        yield server, Path(path), cheap
    finally:
        server.stop()


def _model_sizes(path: Path) -> tuple[int, int]:
    config = json.loads((path / "config.json").read_text())
    return int(config["vocab_size"]), int(config["max_position_embeddings"])


def attempt(server, method: str, path: str, body, probe: bool) -> tuple[int, str]:
    """Send one request and check the answer and the server after it; the answer, or Failure."""
    offset = server.log_path.stat().st_size
    try:
        status, text = send(server, method, path, body)
        judge(method, status, text)
    except Failure as failure:
        try:
            check_alive(server, probe=True)
        except Failure as death:
            raise Failure("death", f"{failure.detail}; {death.detail}", death.key) from None
        if failure.kind == "5xx" and "Traceback" in (log := log_since(server, offset)):
            tb = last_traceback(log)
            last = next((row for row in reversed(tb.splitlines()) if row.strip()), "")
            failure = Failure(failure.kind, f"{failure.detail}\n--- server log ---\n{tb}",
                              f"{failure.key.split()[0]} {re.sub(r'[0-9]+', '#', last)[-120:]}")
        raise failure
    check_alive(server, probe)
    return status, text


def _shrink(server, method: str, path: str, body, key: str):
    """A smaller body that fails the same way (keys of the body and of the dicts in it dropped, one at a time)."""
    def fails(candidate) -> bool:
        try:
            attempt(server, method, path, candidate, probe=False)
        except Failure as f:
            return f.key == key
        return False

    def drops(value):
        if isinstance(value, dict):
            for k in list(value):
                yield {x: y for x, y in value.items() if x != k}
                for smaller in drops(value[k]):
                    yield {**value, k: smaller}
        elif isinstance(value, list) and len(value) > 1:
            yield value[:1]
            yield value[: len(value) // 2]

    tries = 0
    improved = True
    while improved and tries < 60:
        improved = False
        for candidate in drops(body):
            tries += 1
            if fails(candidate):
                body, improved = candidate, True
                break
            if tries >= 60:
                break
    return body


def test_request_fuzz(fuzzed, registered):
    server, model_path, cheap = fuzzed
    s = seed()
    vocab, context = _model_sizes(model_path)
    routes, schema, generate_fields = routes_of(server, registered)
    rng = random.Random(s)
    draw = Draw(rng, vocab, context, cheap, schema, generate_fields, deep_rng=random.Random(s ^ 0x856))
    print(f"\n[request-fuzz] {model_path.name}: seed {s} (MEPIC_REQUEST_FUZZ_SEED={s} replays it), vocabulary {vocab}, "
          f"context {context}, {len(routes)} routes fuzzed, {len(SKIP)} skipped, {len(generate_fields)} fields of "
          f"/generate" + (f", avoiding {sorted(AVOID)}"
                                                                                 if AVOID else ""))

    # Every route once, every field of /generate once and every sampling parameter once (in a drawn order),
    # then the prompted routes most often
    if model_path.name in EVERY_ROUTE_FIRST:
        first = [(route, method, None) for route, method in routes]
        first += [("/generate", "POST", {"field": f}) for f in sorted({*draw.fields(), *generate_fields})]
        first += [("/generate", "POST", {"sampling": k}) for k in draw.SAMPLING]
    else:
        first = [(route, "POST", None) for route in PROMPTED]
    rng.shuffle(first)
    # then every route that takes a body sent one deep body (on the tiny model; SmolLM2 draws them as any body)
    deep_first = [(r, m) for r, m in routes if m in BODY_METHODS and r not in AVOID] \
        if model_path.name in EVERY_ROUTE_FIRST else []
    draw.deep_rng.shuffle(deep_first)
    covered = len(first) + len(deep_first)
    prompted = [(p, "POST") for p in PROMPTED]
    weights = list(PROMPTED.values())
    start = time.monotonic()
    seconds = budget(model_path.name)
    deadline = start + seconds
    counts: dict[int, int] = {}
    failures: dict[str, tuple[int, str, str, object, str]] = {}
    quarantined = set(AVOID)  # and, KEEP_GOING, the routes of no prompt that killed the server once
    sent = 0
    slowest: list[tuple[float, str]] = []
    floor = 10 + covered - sum(1 for route, _ in routes if route in quarantined)
    # Every route once and ten drawn requests after, however long they take; then until the budget is spent.
    while first or deep_first or sent < floor or sent < MAX_REQUESTS and time.monotonic() < deadline:
        focus = None
        if first:
            route, method, focus = first.pop()
        elif deep_first:
            (route, method), focus = deep_first.pop(), {"deep": True}
        elif rng.random() < PROMPTED_SHARE:
            route, method = rng.choices(prompted, weights)[0]
        else:
            route, method = rng.choice(routes)
        if route in quarantined:
            continue
        if focus and focus.get("deep"):  # bare brackets, or a prompt-like body with one field nested so
            path, body = re.sub(r"\{[^}]+\}", "x", route), draw.deep()
        else:
            method, path, body = (method, route, draw.generate_one(**focus)) if focus else draw.request(route, method)
        where = f"seed {s}, {model_path.name}, request {sent}: {method} {path} {shown(body)[:1500]}"
        sent += 1
        began = time.monotonic()
        try:
            status, text = attempt(server, method, path, body, probe=sent % PROBE_EVERY == 0)
            slowest = sorted(slowest + [(time.monotonic() - began, where[:300])], reverse=True)[:5]
        except Failure as failure:
            if not KEEP_GOING:
                raise AssertionError(f"{where}\n=> {failure.kind}: {failure.detail}") from None
            key = f"{method} {route} {failure.kind}: {failure.key}"
            print(f"[request-fuzz] FAILURE {key}\n  {where}\n  {failure.detail[:3000]}", flush=True)
            counts[failure.kind] = counts.get(failure.kind, 0) + 1
            if failure.kind == "death":
                if route not in PROMPTED:
                    quarantined.add(route)
                server.stop()
                server.start()
            if key not in failures:
                small = body if failure.kind in ("death", "hang") or isinstance(body, str) else _shrink(
                    server, method, path, body, failure.key)
                failures[key] = (sent - 1, method, path, small, failure.detail)
                if server.proc.poll() is not None:
                    server.stop()
                    server.start()
            continue
        counts[status] = counts.get(status, 0) + 1
        if status < 300 and route == "/open_session" and text.startswith('"'):
            draw.sessions.append(json.loads(text))
        if status < 300 and isinstance(body, dict) and isinstance(body.get("rid"), str):
            draw.rids.append(body["rid"])
    took = time.monotonic() - start
    print(f"[request-fuzz] {model_path.name}, seed {s}: {sent} requests in {took:.0f} s, "
          f"answers {dict(sorted(counts.items(), key=str))}; slowest: "
          + "; ".join(f"{t:.1f} s {w}" for t, w in slowest))
    if failures:
        report = "\n\n".join(f"#{i} {key}\n  request {n}: {m} {p} {shown(b)[:1500]}\n  {d[:2500]}"
                             for i, (key, (n, m, p, b, d)) in enumerate(failures.items()))
        print(f"[request-fuzz] {len(failures)} distinct failures:\n{report}")
        raise AssertionError(f"seed {s}, {model_path.name}: {len(failures)} distinct failures:\n{report}")
    check_alive(server, probe=True)
