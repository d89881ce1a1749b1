"""Requests outside a bound the scheduler relies on are a 400, and the server keeps serving
(sglang_mepic/frontend/limits.py, sglang_mepic/hardening/scheduler_fields.py).

Each of these took a whole server down: a top-logprobs count above the vocabulary
(the sampler's top-k raised in the scheduler), an empty prompt beside a media field
on a model whose tokenizer adds no BOS (an extend of no tokens), and a chunked
request over the input limit that a small KV pool sets (refused by the scheduler
after its compiles, then reported with a negative prompt size, which a Prometheus
counter refused in the tokenizer process).
"""

from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import requests

from sglang_mepic.frontend import limits, state
from sglang_mepic.hardening import scheduler_fields
from sglang_mepic.process.server_process import ServerProcess

GREEDY = {"max_new_tokens": 2, "temperature": 0}
HUGE = 100000


def manager(context=4096, pool=None, reserved=0, vocab=300, mm=None, truncate=False):
    return SimpleNamespace(context_len=context, max_req_input_len=pool, num_reserved_tokens=reserved,
                           model_config=SimpleNamespace(vocab_size=vocab), mm_processor=mm,
                           server_args=SimpleNamespace(allow_auto_truncate=truncate))


def request(**fields):
    return SimpleNamespace(**{"top_logprobs_num": 0, "image_data": None, "audio_data": None, "video_data": None,
                              **fields})


def test_the_smaller_of_context_and_pool_limits_the_input():
    assert limits.max_input_slots(manager(context=4096)) == 4095
    assert limits.max_input_slots(manager(context=4096, pool=2042)) == 2041
    assert limits.max_input_slots(manager(context=1000, pool=2042, reserved=10)) == 989
    limits.check(manager(pool=2042), request(), [1] * 2041)
    with pytest.raises(limits.LimitError, match="2042 tokens, more than the 2041"):
        limits.check(manager(pool=2042), request(), [1] * 2042)
    limits.check(manager(pool=2042, truncate=True), request(), [1] * 3000)  # SGLang truncates it


def test_a_laid_out_request_leaves_room_in_the_pool_for_the_new_tokens_it_asks_for():
    """SGLang clips new tokens to what the pool holds beside the paged input and a page, down to none: a laid-out
    request under the input limit answered with no token, or, behind stored chunks, never joined a batch and
    stalled the queue. Where the pool bounds requests it must leave room for what it asks, at least a token;
    where the context does, nothing changes."""
    tight = manager(context=4096, pool=3066)  # a 3,072-token pool, as SGLang derives max_req_input_len from it
    tight.server_args.page_size = 16
    assert limits.pool_tokens(tight) == 3072 and limits.max_input_slots(tight) == 3065
    limits.check(tight, request(sampling_params={"max_new_tokens": 16}), None)  # not laid out: SGLang's
    limits._check_laid_out(tight, request(sampling_params={"max_new_tokens": 15}), 3040, 2990)  # room 3072-3040-17
    with pytest.raises(limits.LimitError, match=r"3056 KV slots after chunk padding \(3000 real tokens\) and 16 "
                                                r"new tokens, more than the KV pool holds \(3072 tokens"):
        limits._check_laid_out(tight, request(sampling_params={"max_new_tokens": 16}), 3056, 3000)
    with pytest.raises(limits.LimitError, match="ask for at most 15 new tokens"):  # 3072 - 3040 - 16 - 1
        limits._check_laid_out(tight, request(sampling_params={"max_new_tokens": 20}), 3040, 2990)
    with pytest.raises(limits.LimitError, match="and 1 new token, more than"):  # none asked: one must fit
        limits._check_laid_out(tight, request(sampling_params={}), 3056, 3000)
    roomy = manager(context=4096, pool=8000)  # the context bounds: the pool holds a full-length request
    roomy.server_args.page_size = 16
    assert limits.pool_tokens(roomy) is None
    limits._check_laid_out(roomy, request(sampling_params={"max_new_tokens": 16}), 4000, 3900)


def test_a_laid_out_request_is_held_to_the_limit_by_its_slots_even_where_sglang_would_truncate():
    """Cutting a laid-out request would cut its layout: its padded slots must fit, whatever
    --allow-auto-truncate says, and the refusal counts the client's tokens apart from the slots."""
    slots = [1] * 67
    laid_out = request(**{state.ATTR: state.MarkedRequest.made(((3, 43),), 46, 67, slots)})
    for truncate in (False, True):
        with pytest.raises(limits.LimitError, match=r"67 KV slots after chunk padding \(46 real tokens\), "
                                                            "more than the 60"):
            limits.check(manager(context=61, truncate=truncate), laid_out, slots)
    limits.check(manager(context=68), laid_out, slots)
    limits.check(manager(context=61, truncate=True), request(), slots)  # not laid out: SGLang truncates it


def test_top_logprobs_are_bounded_by_the_vocabulary():
    scheduler_fields.check(manager(vocab=300), request(top_logprobs_num=300))
    for bad in (301, HUGE, -1, 1.5, "3", True):
        with pytest.raises(scheduler_fields.FieldError, match="top_logprobs_num"):
            scheduler_fields.check(manager(vocab=300), request(top_logprobs_num=bad))


def test_counts_in_sampling_parameters_are_whole_numbers():
    scheduler_fields.check(manager(), request(sampling_params={"max_new_tokens": 3, "top_k": -1, "n": 1}))
    for key, bad in (("max_new_tokens", 1.5), ("max_new_tokens", 2.0), ("max_new_tokens", "3"),
                     ("min_new_tokens", True), ("top_k", 0.5), ("sampling_seed", "7")):
        with pytest.raises(scheduler_fields.FieldError, match=f"{key}.*whole number"):
            scheduler_fields.check(manager(), request(sampling_params={key: bad}))
    scheduler_fields.check(manager(), request(sampling_params={"top_k": 2**31 - 1}))
    scheduler_fields.check(manager(), request(sampling_params={"stop_regex": ["a+", r"\d{3}"]}))
    scheduler_fields.check(manager(vocab=300), request(sampling_params={"stop_token_ids": [0, 299]}))
    for bad in ([-1], [300], ["1"], 7, [True]):
        with pytest.raises(scheduler_fields.FieldError, match="stop_token_ids"):
            scheduler_fields.check(manager(vocab=300), request(sampling_params={"stop_token_ids": bad}))
    for bad in ("[", ["ok", "(x"], 5, [5]):
        with pytest.raises(scheduler_fields.FieldError, match="stop_regex"):
            scheduler_fields.check(manager(), request(sampling_params={"stop_regex": bad}))
    for key in ("top_k", "min_new_tokens"):
        with pytest.raises(scheduler_fields.FieldError, match="32 bits"):
            scheduler_fields.check(manager(), request(sampling_params={key: 2**31}))


def test_media_only_where_the_model_has_a_processor():
    for field, value in (("image_data", "x"), ("audio_data", ["a"]), ("video_data", "v"), ("image_data", [[]])):
        with pytest.raises(scheduler_fields.FieldError, match=f"text only: {field}"):
            scheduler_fields.check(manager(), request(**{field: value}))
        scheduler_fields.check(manager(mm=object()), request(**{field: value}))
    for absent in (None, "", []):
        scheduler_fields.check(manager(), request(image_data=absent))


def test_cache_key_fields_are_strings_for_one_prompt():
    """`"lora_id": ["x"]` on one prompt took the server down (a TypeError in SGLang's Req; request fuzzer)."""
    for field in ("lora_id", "extra_key", "cache_salt"):
        for bad in (["x"], 3, {"a": 1}):
            with pytest.raises(scheduler_fields.FieldError, match=f"{field} must be a string"):
                scheduler_fields.check(manager(), request(**{field: bad}))
        scheduler_fields.check(manager(), request(**{field: "x"}))
        scheduler_fields.check(manager(), request(**{field: None}))


def alive(server) -> None:
    r = requests.post(server.url + "/generate", timeout=60, json={"text": "still there?", "sampling_params": GREEDY})
    assert r.status_code == 200, r.text


TOP_LOGPROBS = [
    ("/generate", {"text": "hello there", "return_logprob": True, "top_logprobs_num": HUGE, "sampling_params": GREEDY}),
    ("/generate", {"text": ["a", "b"], "return_logprob": True, "top_logprobs_num": HUGE, "sampling_params": GREEDY}),
    ("/generate", {"text": "hi", "return_logprob": True, "top_logprobs_num": HUGE,
                   "sampling_params": {**GREEDY, "n": 2}}),
    ("/v1/completions", {"model": "m", "prompt": "hello", "max_tokens": 2, "logprobs": HUGE}),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2,
                              "logprobs": True, "top_logprobs": HUGE}),
]


@pytest.mark.parametrize("path, body", TOP_LOGPROBS, ids=[f"{p}-{i}" for i, (p, _) in enumerate(TOP_LOGPROBS)])
def test_top_logprobs_beyond_the_vocabulary(tiny_server, path, body):
    r = requests.post(tiny_server.url + path, json=body, timeout=60)
    assert 400 <= r.status_code < 500, r.text
    assert "top_logprobs_num" in r.text or "logprobs" in r.text, r.text
    alive(tiny_server)


def test_top_logprobs_up_to_the_vocabulary_are_served(tiny_server, tiny_model):
    import json
    from pathlib import Path

    vocab = json.loads((Path(tiny_model) / "config.json").read_text())["vocab_size"]
    r = requests.post(tiny_server.url + "/generate", timeout=60, json={
        "text": "hello there", "return_logprob": True, "top_logprobs_num": vocab, "sampling_params": GREEDY})
    assert r.status_code == 200, r.text
    assert len(r.json()["meta_info"]["output_top_logprobs"][0]) == vocab


TENSOR_FIELDS = [
    ("/generate", {"text": "hi", "sampling_params": {**GREEDY, "temperature": 0.7, "top_k": 2**63}}, "32 bits"),
    ("/generate", {"text": "hi", "sampling_params": {**GREEDY, "max_new_tokens": 2**63}}, "64 bits"),
    ("/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 2, "top_k": 2**63}, "32 bits"),
    ("/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 2, "seed": 2**63}, "64 bits"),
    ("/generate", {"text": "hi", "sampling_params": {**GREEDY, "n": 10**6}}, "from 1 to 128"),
    ("/generate", {"text": "hi", "return_logprob": True, "logprob_start_len": [1, 2], "sampling_params": GREEDY},
     "logprob_start_len"),
    ("/generate", {"text": ["a", "b"], "sampling_params": {**GREEDY, "n": 129}}, "from 1 to 128"),
    # checked before SGLang copies the prompts n times: 2**63 overflowed there (a 500), 2**31 ran out of memory
    ("/generate", {"input_ids": [5, 6], "sampling_params": {**GREEDY, "n": 2**63}}, "from 1 to 128"),
    ("/generate", {"text": "hi", "sampling_params": {**GREEDY, "n": 2**31 - 1}}, "from 1 to 128"),
    ("/generate", {"text": ["a", "b"], "sampling_params": [{**GREEDY, "n": 2**31}, {**GREEDY, "n": 2**31}]},
     "from 1 to 128"),
    ("/v1/completions", {"model": "m", "prompt": "hello", "temperature": 0, "best_of": 10**18, "n": 2**31,
                         "max_tokens": 4}, "from 1 to 128"),
    ("/v1/completions", {"model": "m", "prompt": "hello", "temperature": 0, "n": 2**31 - 1, "max_tokens": 4},
     "from 1 to 128"),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                              "n": 5000}, "from 1 to 128"),
    ("/generate", {"input_ids": [35], "sampling_params": {**GREEDY, "temperature": 0.7, "top_k": 2**32}},
     "32 bits"),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2**40, "min_new_tokens": 2**33}},
     "32 bits"),
    # a per-item field shorter than the batch raised when the batch was split (a 500)
    ("/generate", {"text": [""], "image_data": [""], "audio_data": [], "sampling_params": GREEDY}, "malformed batch"),
    ("/generate", {"text": ["a", "b"], "audio_data": ["x"], "sampling_params": GREEDY}, "malformed batch"),
    # an invalid stop_regex raised re.error, no ValueError: a streamed answer was cut off, a plain one a 500
    ("/generate", {"text": "What is 2+2?", "sampling_params": {**GREEDY, "stop_regex": "["}, "stream": True},
     "not a regular expression"),
    ("/generate", {"text": "What is 2+2?", "sampling_params": {**GREEDY, "stop_regex": ["a", "(b"]}},
     "not a regular expression"),
    ("/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 2, "stop_regex": "*"}, "not a regular expression"),
    # stop ids index the logits: -1 with min_new_tokens raised in the scheduler and the server exited
    ("/generate", {"text": "a", "sampling_params": {**GREEDY, "stop_token_ids": [-1], "min_new_tokens": 1}},
     "stop_token_ids"),
    ("/v1/completions", {"model": "m", "prompt": "a", "max_tokens": 2, "stop_token_ids": [10**6]}, "stop_token_ids"),
    # a list inside a batch's texts (a /vertex_generate instance's list text) reached the scheduler (a 500)
    ("/vertex_generate", {"instances": [{"text": [""], "sampling_params": GREEDY, "audio_data": [[]]}]}, "text[0]"),
    ("/vertex_generate", {"instances": [{"text": ["a", "b"], "return_logprob": True}]}, "text[0]"),
    # a tool `type` that is no string crashed the Anthropic request model's discriminator (a 500)
    ("/v1/messages", {"model": "m", "messages": [{"role": "user", "content": "a"}], "max_tokens": 3,
                      "tools": [{"type": 8191, "name": "t"}]}, "malformed request body"),
    ("/v1/messages/count_tokens", {"model": "m", "messages": [{"role": "user", "content": "a"}],
                                   "tools": [{"type": ["x"], "name": "t"}]}, "malformed request body"),
    # an empty positional_embed_overrides counted as absent, and reached the scheduler (it died)
    ("/generate", {"text": "hi", "sampling_params": GREEDY, "positional_embed_overrides": ""}, "text only"),
    # SGLang's normalization asserts a batch's rid is a list (a 500)
    ("/v1/classify", {"input": ["m"], "rid": "3"}, "rid should be a list"),
    ("/v1/embeddings", {"model": "m", "input": ["m", "m"], "image_data": [], "rid": []}, "malformed batch"),
    ("/generate", {"text": ["a", "b"], "rid": ["x"], "sampling_params": GREEDY}, "rids length mismatch"),
    # Vertex parameters SGLang's handler passes to GenerateReqInput as keywords: an unknown one was a 500
    ("/vertex_generate", {"instances": [{}], "parameters": {"a": 1}}, "unknown parameters: 'a'"),
    # a float max_new_tokens became a slice bound when the request finished, in the scheduler
    ("/api/generate", {"model": "m", "prompt": "hello", "stream": True, "options": {"num_predict": 1.5}},
     "whole number"),
    ("/api/generate", {"model": "m", "prompt": "hello", "stream": False, "options": {"num_predict": 1.5}},
     "whole number"),
    # token ids that are not whole numbers reached the markup scan (a 500), on every way in
    ("/vertex_generate", {"instances": [{"input_ids": ["a", "b"]}], "parameters": None}, "whole-number token ids"),
    ("/vertex_generate", {"instances": [{"input_ids": [1, 2]}, {"input_ids": [3, 2.5]}]}, "input_ids[1]"),
    ("/generate", {"input_ids": [[1, 2], 3], "sampling_params": GREEDY}, "input_ids"),
]


@pytest.mark.parametrize("path, body, message", TENSOR_FIELDS, ids=[f"{p}-{i}" for i, (p, _, _) in enumerate(TENSOR_FIELDS)])
def test_numbers_the_scheduler_cannot_hold(tiny_server, path, body, message):
    """`top_k: 2**63` overflowed an int64 tensor while the scheduler built a batch (the server died);
    `n: 10**6` queued a million copies and the server answered nobody for minutes."""
    r = requests.post(tiny_server.url + path, json=body, timeout=60)
    if body.get("stream") and path == "/generate":  # SGLang's stream has begun: the refusal is its one event
        assert r.status_code == 200 and r.text.startswith('data: {"error"') and "[DONE]" in r.text, r.text
        assert message in r.text, r.text
    else:
        assert r.status_code == 400 and message in r.text, r.text
    alive(tiny_server)


MEDIA = [("image_data", "x"), ("audio_data", "x"), ("video_data", "x"), ("image_data", [[]])]


@pytest.mark.parametrize("text", ["", " ", "hello"])
@pytest.mark.parametrize("field, value", MEDIA)
def test_media_on_a_text_only_model(smollm2_server, text, field, value):
    r = requests.post(smollm2_server.url + "/generate", timeout=60,
                      json={"text": text, field: value, "sampling_params": GREEDY})
    assert r.status_code == 400, r.text
    assert "text only" in r.text, r.text
    alive(smollm2_server)


def test_an_empty_prompt_on_smollm2_is_refused(smollm2_server):
    for body in ({"text": ""}, {"text": "<|chunk|><|/chunk|>"}, {"input_ids": []}, {"text": "", "image_data": []}):
        r = requests.post(smollm2_server.url + "/generate", timeout=60, json={**body, "sampling_params": GREEDY})
        assert r.status_code == 400, (body, r.text)
    alive(smollm2_server)


# The pool, not the model (context 4,096), sets the input limit: SGLang allows inputs below 2,042 tokens.
POOL_TOKENS = 2048


def record(i: int, pairs: int = 130) -> str:
    return f"Record {i}: " + " ".join(f"entry{i}x{k} weight {k % 9}" for k in range(pairs))


def chunked(records, question="Which record lists entry1x5?") -> str:
    return "Records:" + "".join(f"<|chunk|>{record(i, pairs)}<|/chunk|>" for i, pairs in records) + " " + question


@pytest.fixture(scope="module")
def small_pool_server(tiny_model):
    with ServerProcess(tiny_model, "--dtype", "float32", "--max-total-tokens", str(POOL_TOKENS)) as server:
        yield server


def generate(server, text, n=4):
    return requests.post(server.url + "/generate", timeout=300, json={
        "text": text, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}})


def test_a_chunked_request_over_the_pool_limit_is_refused_before_its_compiles(small_pool_server):
    server = small_pool_server
    batches = server.log().count("Prefill batch")
    r = generate(server, chunked([(i, 130) for i in range(3)]))  # about 3,000 tokens: the context takes it
    assert r.status_code == 400, r.text
    assert "this server accepts in one request" in r.text, r.text
    assert server.log().count("Prefill batch") == batches, "a compile ran for a request that cannot be served"
    alive(server)


def test_a_chunked_request_without_room_for_its_new_tokens_is_refused(small_pool_server):
    """Under the input limit (2,041) but with no room beside it in the 2,048-token pool for the 4 tokens it asks:
    SGLang answered it with none. One page shorter, it gets all 4."""
    server = small_pool_server
    r = generate(server, chunked([(0, 129), (1, 130)]))
    assert r.status_code == 400, r.text
    assert "more than the KV pool holds (2048 tokens" in r.text, r.text
    r = generate(server, chunked([(0, 129), (1, 129)]))
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["completion_tokens"] == 4
    alive(server)


def test_a_full_small_pool_makes_requests_wait_and_answers_as_alone(small_pool_server):
    """Concurrent chunked requests that together exceed the pool all answer, each as it does alone
    on an empty cache; the server stays up, and a flush gives every page back."""
    server = small_pool_server
    texts = [chunked([(i, 40), (i + 1, 40)], question=f"Question {i}?") for i in range(6)]  # about 700 tokens each
    alone = []
    for text in texts:
        assert requests.post(server.url + "/flush_cache", timeout=60).status_code == 200
        r = generate(server, text, n=8)
        assert r.status_code == 200, r.text
        alone.append(r.json()["output_ids"])
    assert requests.post(server.url + "/flush_cache", timeout=60).status_code == 200
    with ThreadPoolExecutor(len(texts)) as pool:
        together = list(pool.map(lambda t: generate(server, t, n=8), texts))
    assert [r.status_code for r in together] == [200] * len(texts), [r.text[:200] for r in together]
    assert [r.json()["output_ids"] for r in together] == alone
    assert requests.post(server.url + "/flush_cache", timeout=60).status_code == 200
    state = requests.get(server.url + "/server_info", timeout=30).json()["internal_states"][0]["mepic"]
    assert state["kv_pages_free"] == state["kv_pages_total"], state
    assert "Traceback" not in server.log()
    alive(server)


def test_a_refused_laid_out_request_reports_no_negative_prompt_size():
    """SGLang replaces the ids of a request its scheduler refuses by one token; the pads of the
    layout it had are not among them, so its prompt size is that token, not 1 less the pads."""
    from sglang_mepic.cache import output_report

    class Accumulator:
        def __init__(self):
            self.rids, self.prompt_tokens, self.cached_tokens, self.cached_tokens_details = [], [], [], []

    def accept(acc, *, req):
        acc.rids.append(req.rid)
        acc.prompt_tokens.append(len(req.origin_input_ids))
        acc.cached_tokens.append(0)

    from array import array

    from sglang_mepic.cache.link import Link
    from sglang_mepic.cache.shape import Shape

    link = Link(Shape(array("q", [7] * 64), ((5, 11), (32, 15)), (), (), False))
    laid_out = SimpleNamespace(rid="a", mepic=link, customized_info=None, origin_input_ids=[7] * 64)
    refused = SimpleNamespace(rid="b", mepic=link, customized_info=None, origin_input_ids=[0])
    acc = Accumulator()
    output_report.accept(accept, acc, req=laid_out)
    output_report.accept(accept, acc, req=refused)
    assert acc.prompt_tokens == [64 - 26, 1]


# SmolLM2's context is 8,192 tokens; SGLang's scheduler refuses inputs of 8,186 slots or more (its
# max_req_input_len: context - 1 - 5), so 8,185 is the most one request may hold.
SMOLLM2_MOST_SLOTS = 8185
CHUNK = [-100, *range(1000, 1017), -101]  # 17 tokens, padded to 32 slots (two pages)


def chunked_ids(prompt_tokens: int) -> list[int]:
    return CHUNK + [(2000 + i) % 40000 for i in range(prompt_tokens)]


def test_a_chunked_request_just_over_the_context_limit_is_a_400_and_the_server_lives(smollm2_server):
    """8,188 slots once padded (8,173 real tokens): the plugin's own check let it through, the scheduler
    refused it, and the tokenizer reported it with a negative size and the server exited (issue 54)."""
    r = requests.post(smollm2_server.url + "/generate", timeout=120,
                      json={"input_ids": chunked_ids(8156), "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 400, r.text
    assert "request needs 8188 KV slots after chunk padding (8173 real tokens)" in r.text, r.text
    assert f"more than the {SMOLLM2_MOST_SLOTS} this server accepts" in r.text, r.text
    alive(smollm2_server)


# The tiny model's context is 4,096 tokens: the same rule makes 4,089 slots the most a request may hold.
TINY_MOST_SLOTS = 4089


def tiny_chunked_ids(prompt_tokens: int) -> list[int]:
    return CHUNK + [100 + i % 3900 for i in range(prompt_tokens)]  # within its 4,096-token vocabulary


def test_a_chunked_request_at_the_context_limit_is_served(tiny_server):
    """The limit is SGLang's own, not one below it: the largest request the scheduler takes is served, one
    slot more is refused. On the tiny model: prefilling SmolLM2's 8,185 slots took 70 s on 2 cores."""
    r = requests.post(tiny_server.url + "/generate", timeout=600,
                      json={"input_ids": tiny_chunked_ids(TINY_MOST_SLOTS - 32), "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["prompt_tokens"] == TINY_MOST_SLOTS - 32 + 17
    r = requests.post(tiny_server.url + "/generate", timeout=120,
                      json={"input_ids": tiny_chunked_ids(TINY_MOST_SLOTS - 31), "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 400 and f"more than the {TINY_MOST_SLOTS} this server accepts" in r.text, r.text
    alive(tiny_server)


@pytest.mark.parametrize("start", [-2, -5, -(2**40)])
def test_a_logprob_start_below_minus_one_is_a_400(smollm2_server, start):
    """`logprob_start_len: -5` on a prompt of more than 5 tokens tripped an assertion in the scheduler."""
    r = requests.post(smollm2_server.url + "/generate", timeout=60,
                      json={"text": "one two three four five six seven eight", "return_logprob": True,
                            "logprob_start_len": start, "sampling_params": GREEDY})
    assert r.status_code == 400 and "logprob_start_len" in r.text, r.text
    alive(smollm2_server)


def test_refusals_name_real_tokens_and_slots(smollm2_server):
    """Padding pushes the request over the limit: the refusal counts what the client sent (real tokens)
    and what padding made of it (slots), never the slots as if they were the client's tokens."""
    # 8,087 real tokens, 8,192 slots: SGLang said "The input (8192 tokens) is longer than the model's context".
    chunks = [t for k in range(8) for t in (-100, *range(1000 + 17 * k, 1017 + 17 * k), -101)]  # 136 in 256 slots
    ids = chunks + [(2000 + i) % 40000 for i in range(7936)]
    r = requests.post(smollm2_server.url + "/generate", timeout=120, json={"input_ids": ids, "sampling_params": GREEDY})
    assert r.status_code == 400, r.text
    assert "request needs 8192 KV slots after chunk padding (8072 real tokens)" in r.text, r.text
    # Real tokens and new tokens fit the context; slots and new tokens do not.
    r = requests.post(smollm2_server.url + "/generate", timeout=120,
                      json={"input_ids": chunked_ids(7763 - 17), "sampling_params": {"max_new_tokens": 420}})
    assert r.status_code == 400, r.text
    assert "request needs 7778 KV slots after chunk padding (7763 real tokens) and 420 new tokens" in r.text, r.text
    assert "at most 414 new tokens" in r.text, r.text
    # The same through the chat API, whose refusal spoke of "tokens from the input messages".
    doc = " ".join(f"fact{i} is {i * 7 % 13}." for i in range(1200))
    r = requests.post(smollm2_server.url + "/v1/chat/completions", timeout=120,
                      json={"model": "m", "max_tokens": 8000,
                            "messages": [{"role": "user", "content": f"<|chunk|>{doc}<|/chunk|> What is fact3?"}]})
    assert r.status_code == 400, r.text
    assert "KV slots after chunk padding" in r.text and "from the input messages" not in r.text, r.text
    alive(smollm2_server)
