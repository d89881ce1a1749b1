"""Fuzz every client path of a real server with requests drawn over its schema.

Bodies are drawn from what clients get wrong: empty and whitespace prompts,
markers in every field (text, ids, chat content, stop strings, rid), wrong
types, unicode, huge and negative numbers, forged kv_hints, prompts longer than
the context, batches, streams. Every response must be a 2xx or a 4xx that says
what is wrong (a 5xx, a dropped connection or a timeout fails), and the server
must answer a plain request afterwards.

CI runs a fixed seed, so a failure replays as is; MEPIC_REQUEST_FUZZ_SEED=<n> runs
another and MEPIC_REQUEST_FUZZ_SEED=random draws one. The seed is printed and
named in every failure. MEPIC_REQUEST_FUZZ_SECONDS bounds the run (default 120).
"""

import json
import os
import random
import time

import pytest
import requests

pytestmark = pytest.mark.server
SEED = 20261124
SECONDS = float(os.environ.get("MEPIC_REQUEST_FUZZ_SECONDS", 120))
MAX_REQUESTS = int(os.environ.get("MEPIC_REQUEST_FUZZ_REQUESTS", 1500))

OPEN, CLOSE = "<|chunk|>", "<|/chunk|>"
DOC = " ".join(f"fact{i} is {i * 7 % 13}." for i in range(12))  # about 3 pages


def seed() -> int:
    value = os.environ.get("MEPIC_REQUEST_FUZZ_SEED", str(SEED))
    return random.randrange(2**32) if value == "random" else int(value)


class Draw:
    """One random request body per path, from a seeded generator."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def pick(self, *options):
        return self.rng.choice(options)

    def text(self):
        r = self.rng
        return self.pick(
            "", " ", "\n\t ", "hello", "Answer: " + OPEN + DOC + CLOSE + " why?",
            OPEN + DOC + CLOSE, OPEN, CLOSE, CLOSE + OPEN, OPEN + OPEN + "x" + CLOSE + CLOSE, OPEN + CLOSE,
            OPEN + " " + CLOSE, "x" * r.randint(1, 3000), "naïve 日本語 🚀 " * r.randint(1, 30), "\x00\x01\u202e",
            "word " * 5000, OPEN + "a" + CLOSE + OPEN + DOC + CLOSE, DOC + OPEN + DOC * 3 + CLOSE,
            OPEN + "é" * 40 + CLOSE + "?", "<|im_start|>user\nhi<|im_end|>")

    def ids(self):
        r = self.rng
        plain = [r.randrange(0, 300) for _ in range(r.randint(0, 40))]
        return self.pick(
            [], plain, [-100, -101], [-100, *plain, -101], [1, -100, 5] + plain, [-101, 5, -100], [-100, -100, 5, -101],
            [1, -100, *range(100, 140), -101, 7], [10**12], [-1], [1.5, 2], ["a", "b"], [[1, 2], [3]], [True],
            [5] * r.randint(3000, 9000), [None])

    def value(self):
        return self.pick(None, -1, 0, 1, 2**31, 2**64, 1e308, float("-inf"), "x", "", [], {}, True, -0.5, 3)

    def sampling(self):
        r = self.rng
        # No unbounded lengths: a request may rightly generate up to the context's end, which proves nothing
        params = {"max_new_tokens": self.pick(1, 2, 4, 0, -1, "3", 10**9), "temperature": self.pick(0, 0.7, -1, "hot")}
        for key in r.sample(["top_p", "top_k", "min_p", "stop", "stop_token_ids", "n", "ignore_eos", "regex", "json_schema",
                             "frequency_penalty", "sampling_seed", "skip_special_tokens", "no_such_key"], r.randint(0, 3)):
            params[key] = self.pick(self.value(), OPEN, [OPEN, CLOSE], "[a-z]+", '{"type": "object"}', 0.5, 2)
        return self.pick(params, params, params, "not a dict", None, [])

    def hints(self):
        payload = self.pick({"chunks": [[0, 2]]}, {"chunks": [[16, 48]], "pads": [[48, 1]], "compile": True},
                            {"chunks": "x"}, {}, {"pads": [[-1, 10**9]]})
        return self.pick({"protocol_version": "1", "message_id": "m", "actions": [
            {"action_id": "a", "action_type": "mepic.chunks", "action_version": self.pick("1", "2", 1), "payload": payload}]},
            {"actions": "nope"}, "string", None)

    def generate(self) -> dict:
        r = self.rng
        body = {"sampling_params": self.sampling()}
        prompt = r.random()
        if prompt < 0.45:
            body["text"] = self.text()
        elif prompt < 0.7:
            body["input_ids"] = self.ids()
        elif prompt < 0.85:
            body["text"] = [self.text() for _ in range(r.randint(0, 3))]
        elif prompt < 0.92:
            body["input_ids"] = [self.ids() for _ in range(r.randint(1, 3))]
        else:
            body.update(text=self.text(), input_ids=self.ids())  # both: SGLang refuses
        for key in r.sample(["stream", "return_logprob", "logprob_start_len", "top_logprobs_num", "rid", "kv_hints",
                             "cache_salt", "extra_key", "lora_path", "input_embeds", "return_text_in_logprobs"],
                            r.randint(0, 3)):
            body[key] = self.hints() if key == "kv_hints" else self.pick(True, False, self.value(), OPEN + "r" + CLOSE)
        return body

    def completions(self) -> dict:
        r = self.rng
        body = {"model": self.pick("tiny", "", None), "prompt": self.pick(self.text(), [self.text()], self.ids(), None, 5),
                "max_tokens": self.pick(1, 3, 0, -2, "4", 10**9)}
        for key in r.sample(["echo", "n", "logprobs", "stream", "stop", "temperature", "suffix", "best_of", "seed"],
                            r.randint(0, 3)):
            body[key] = self.pick(True, False, 2, 0, -1, OPEN, self.value())
        return body

    def chat(self) -> dict:
        r = self.rng

        def message():
            content = self.pick(self.text(), "", None, [{"type": "text", "text": self.text()}], [{"type": "bogus"}], 7,
                                [{"type": "text", "text": OPEN + DOC + CLOSE}])
            return {"role": self.pick("user", "system", "assistant", "tool", "nobody"), "content": content}

        body = {"model": "tiny", "messages": self.pick([message() for _ in range(r.randint(0, 4))], "hi", None),
                "max_tokens": self.pick(1, 3, 0, -1, 10**9)}
        for key in r.sample(["n", "stream", "logprobs", "top_logprobs", "stop", "temperature", "tools", "response_format"],
                            r.randint(0, 3)):
            body[key] = self.pick(True, False, 2, 0, -1, OPEN, self.value(), {"type": "json_object"})
        return body

    def well_formed(self, path: str) -> dict:
        """Right types and bounds, edgy content: these reach the model (markup, unicode, streams, n)."""
        r = self.rng
        if path == "/generate":
            prompt = {"text": self.text()} if r.random() < 0.7 else {"input_ids": [r.randrange(0, 300) for _ in range(
                r.randint(1, 40))] + self.pick([], [-100, *range(100, 140), -101], [-100, *range(100, 120), -101, 5])}
            return {**prompt, "stream": r.random() < 0.3, "return_logprob": r.random() < 0.2,
                    "sampling_params": {"max_new_tokens": r.randint(1, 4), "temperature": self.pick(0, 0.7),
                                        "n": self.pick(1, 1, 2)}}
        if path == "/v1/completions":
            return {"model": "tiny", "prompt": self.text(), "max_tokens": r.randint(1, 4), "echo": r.random() < 0.3,
                    "stream": r.random() < 0.3, "n": self.pick(1, 2)}
        return {"model": "tiny", "max_tokens": r.randint(1, 4), "stream": r.random() < 0.3,
                "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": self.text()}]}

    def request(self) -> tuple[str, object]:
        path = self.pick("/generate", "/generate", "/v1/completions", "/v1/chat/completions")
        if self.rng.random() < 0.03:
            return path, self.pick("{not json", "[]", "null", '"text"', "")
        if self.rng.random() < 0.4:
            return path, self.well_formed(path)
        return path, {"/generate": self.generate, "/v1/completions": self.completions,
                      "/v1/chat/completions": self.chat}[path]()


def send(server, path: str, body) -> tuple[int, str]:
    data = body if isinstance(body, str) else json.dumps(body)
    stream = isinstance(body, dict) and body.get("stream") is True
    with requests.post(server.url + path, data=data, headers={"content-type": "application/json"},
                       timeout=120, stream=stream) as r:
        return r.status_code, r.text  # reading a stream to its end: every event must arrive


def explains(text: str) -> bool:
    try:
        body = json.loads(text)
    except ValueError:
        return False
    found = body.get("error") or body.get("message") or body.get("detail") if isinstance(body, dict) else None
    return bool(found)


def test_request_fuzz(tiny_server):
    s = seed()
    print(f"[request-fuzz] seed {s} (MEPIC_REQUEST_FUZZ_SEED={s} replays it)")
    draw = Draw(random.Random(s))
    deadline = time.monotonic() + SECONDS
    counts: dict[int, int] = {}
    sent = 0
    while sent < MAX_REQUESTS and time.monotonic() < deadline:
        path, body = draw.request()
        where = f"seed {s}, request {sent}: POST {path} {json.dumps(body)[:400]}"
        try:
            status, text = send(tiny_server, path, body)
        except requests.RequestException as e:
            raise AssertionError(f"{where}: no answer ({e})") from None
        sent += 1
        counts[status] = counts.get(status, 0) + 1
        assert status < 500, f"{where}: {status} {text[:400]}"
        if status >= 400:
            assert explains(text), f"{where}: {status} without a message: {text[:400]}"
    ok = requests.post(tiny_server.url + "/generate", timeout=60,
                       json={"text": "still there?", "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
    assert ok.status_code == 200, f"seed {s}: the server no longer serves after {sent} requests: {ok.text[:300]}"
    print(f"[request-fuzz] seed {s}: {sent} requests in {SECONDS - max(0.0, deadline - time.monotonic()):.0f} s, "
          f"status counts {dict(sorted(counts.items()))}")
    assert sent >= 50, f"seed {s}: only {sent} requests in {SECONDS} s; the run checked too little"
