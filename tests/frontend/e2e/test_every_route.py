"""Every POST route of the server answers chunk markup as `/generate` does (issue 48.3, 48.4).

The routes are those the live server lists (`/openapi.json`): each is classified below,
so a route a new SGLang adds fails the first test until it is. A route that builds a
prompt from client text reads the markup there and refuses malformed markup with a 400
that names the fault; one that cannot carry chunks takes the markers as text (docs/chunks.md,
"Marking chunks"). None answers a 5xx. Before: `/api/chat` tokenized the markers as text,
so it served unclosed markup and blank chunks that `/v1/chat/completions` refuses, and
`/v1/responses` (not started without `openai_harmony`) answered every request with a 500.
"""

import json

import pytest
import requests


BAD = {
    "unclosed": ("Hello <|chunk|>unclosed doc", "never closed"),
    "blank": ("Hello <|chunk|> \n  <|/chunk|> there", "only whitespace"),
    "only_blank": ("<|chunk|>   <|/chunk|>", "only whitespace"),
    "stray": ("Hello <|/chunk|> there", "no matching"),
    "nested": ("<|chunk|>a<|chunk|>b<|/chunk|><|/chunk|>", "cannot nest"),
}
TWO = {"num_predict": 2, "temperature": 0}


def chat(text):
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]


# Routes that build a prompt from client text: markup marks chunks there, and bad markup is a 400.
READS = {
    "/generate": lambda t: {"text": t, "sampling_params": {"max_new_tokens": 2}},
    "/vertex_generate": lambda t: {"instances": [{"text": t}],
                                   "parameters": {"sampling_params": {"max_new_tokens": 2}}},
    "/v1/completions": lambda t: {"model": "m", "prompt": t, "max_tokens": 2},
    "/v1/chat/completions": lambda t: {"model": "m", "messages": chat(t), "max_tokens": 2},
    "/invocations": lambda t: {"model": "m", "messages": chat(t), "max_tokens": 2},
    "/v1/messages": lambda t: {"model": "m", "messages": [{"role": "user", "content": t}], "max_tokens": 2},
    "/v1/messages/count_tokens": lambda t: {"model": "m", "messages": [{"role": "user", "content": t}]},
    "/v1/score": lambda t: {"model": "m", "query": t, "items": [" a", " b"], "label_token_ids": [5, 6]},
    "/api/generate": lambda t: {"model": "m", "prompt": t, "stream": False, "options": TWO},
    "/api/generate stream": lambda t: {"model": "m", "prompt": t, "stream": True, "options": TWO},
    "/api/chat": lambda t: {"model": "m", "messages": chat(t), "stream": False, "options": TWO},
    "/api/chat stream": lambda t: {"model": "m", "messages": chat(t), "stream": True, "options": TWO},
}
# Routes that cannot carry chunks (no generation from the text, or a prompt the server words
# itself): the markers are text, as documented.
TEXT = {
    "/v1/tokenize": lambda t: {"model": "m", "prompt": t},
    "/v1/decisions": lambda t: {"model": "m", "input": t,
                                "questions": [{"id": "q", "type": "yes_no", "question": "ok?"}]},
    "/v1/systemone": lambda t: {"model": "m", "state": t, "questions": {"q": {"type": "noul", "instructions": "ok?"}}},
}
# Routes this server does not serve with the tiny model (embedding and rerank routes need an
# embedding model; /v1/responses needs openai_harmony): a 4xx whatever the body.
NOT_HERE = {
    "/encode": lambda t: {"text": t},
    "/classify": lambda t: {"text": t},
    "/v1/embeddings": lambda t: {"model": "m", "input": t},
    "/v1/classify": lambda t: {"model": "m", "input": t},
    "/v1/rerank": lambda t: {"query": t, "documents": ["a", "b"]},
    "/v1/responses": lambda t: {"model": "m", "input": t},
    "/v1/responses/{response_id}/cancel": None,
}
# Routes that take no prompt text (administration, sessions, weights, token ids, audio files,
# parsing model output). /mepic/chunks takes documents to register, never a prompt: markup in one
# is refused (tests/frontend/e2e/test_known_texts_server.py).
NO_PROMPT = {
    "/mepic/chunks",
    "/abort_request", "/add_external_corpus", "/api/show", "/begin_weight_update", "/close_session",
    "/configure_logging", "/continue_generation", "/destroy_weights_update_group", "/dump_expert_distribution_record",
    "/end_weight_update", "/flush_cache", "/freeze_gc", "/get_weights_by_name", "/hicache/storage-backend",
    "/hicache/storage-backend/clear", "/init_weights_send_group_for_remote_instance", "/init_weights_update_group",
    "/load_lora_adapter", "/load_lora_adapter_from_tensors", "/open_session", "/parse_function_call",
    "/pause_generation", "/pd_role_switch", "/release_memory_occupation", "/remove_external_corpus",
    "/resume_memory_occupation", "/scale_elastic_ep", "/send_weights_to_remote_instance", "/separate_reasoning",
    "/set_internal_state", "/set_trace_level", "/slow_down", "/start_expert_distribution_record", "/start_profile",
    "/stop_expert_distribution_record", "/stop_profile", "/unload_lora_adapter", "/update_weight_version",
    "/update_weights_from_disk", "/update_weights_from_distributed", "/update_weights_from_ipc",
    "/update_weights_from_tensor", "/v1/audio/transcriptions", "/v1/detokenize", "/weights_checker",
}


def post(server, route, body):
    path = route.split(" ")[0]
    with requests.post(server.url + path, json=body, timeout=120, stream=bool(body.get("stream"))) as r:
        return r.status_code, r.text


def test_every_post_route_is_classified(tiny_server):
    paths = requests.get(tiny_server.url + "/openapi.json", timeout=30).json()["paths"]
    posted = {path for path, methods in paths.items() if {"post", "put"} & set(methods)}
    known = {r.split(" ")[0] for r in (*READS, *TEXT, *NOT_HERE)} | NO_PROMPT
    assert posted - known == set(), "routes no test here sends markup to: classify them above"


@pytest.mark.parametrize("case", BAD)
@pytest.mark.parametrize("route", READS)
def test_bad_markup_is_a_400_that_names_the_fault(tiny_server, route, case):
    text, reason = BAD[case]
    status, body = post(tiny_server, route, READS[route](text))
    assert status == 400 and reason in body, (status, body)


@pytest.mark.parametrize("case", BAD)
@pytest.mark.parametrize("route", TEXT)
def test_markup_is_text_where_a_route_cannot_carry_chunks(tiny_server, route, case):
    status, body = post(tiny_server, route, TEXT[route](BAD[case][0]))
    assert status == 200, (status, body)


@pytest.mark.parametrize("route", [r for r in NOT_HERE if NOT_HERE[r]])
def test_routes_not_served_here_answer_4xx(tiny_server, route):
    status, body = post(tiny_server, route, NOT_HERE[route](BAD["unclosed"][0]))
    assert 400 <= status < 500, (status, body)


def test_responses_api_not_started_is_a_404_with_the_reason(tiny_server):
    for path in ("/v1/responses", "/v1/responses/resp_1/cancel"):
        r = requests.post(tiny_server.url + path, json={"model": "m", "input": "hi"}, timeout=30)
        assert r.status_code == 404 and "openai_harmony" in r.json()["message"], r.text
    r = requests.get(tiny_server.url + "/v1/responses/resp_1", timeout=30)
    assert r.status_code == 404 and "not served" in r.text, r.text


def test_ollama_chat_reads_chunks_as_chat_completions_does(tiny_server):
    doc = " ".join(f"line{i} says {i * 5 % 11}." for i in range(40))
    messages = chat(f"<|chunk|>{doc}<|/chunk|> What does line3 say?")
    ollama = requests.post(tiny_server.url + "/api/chat", timeout=120, json={
        "model": "m", "messages": messages, "stream": False, "options": {"num_predict": 6, "temperature": 0}})
    openai = requests.post(tiny_server.url + "/v1/chat/completions", timeout=120, json={
        "model": "m", "messages": messages, "max_tokens": 6, "temperature": 0})
    assert ollama.status_code == 200 and openai.status_code == 200, (ollama.text, openai.text)
    # The markers are not prompt tokens on either route, and the model answers the same prompt.
    assert ollama.json()["prompt_eval_count"] == openai.json()["usage"]["prompt_tokens"]
    assert ollama.json()["message"]["content"] == openai.json()["choices"][0]["message"]["content"]


def test_ollama_chat_without_markup_is_sglangs_own(tiny_server):
    for stream in (False, True):
        status, body = post(tiny_server, "/api/chat", {"model": "m", "messages": chat("hi"), "stream": stream,
                                                       "options": TWO})
        assert status == 200 and json.loads(body.splitlines()[-1])["done"], body


def test_server_still_serves(tiny_server):
    status, body = post(tiny_server, "/generate", {"text": "still?", "sampling_params": {"max_new_tokens": 1}})
    assert status == 200, body


SEP = " # # "
DOC_A = " ".join(f"line{i} says {i * 5 % 11}." for i in range(40))
DOC_B = " ".join(f"row{i} holds {i * 7 % 13}." for i in range(40))


@pytest.fixture
def sep_server(servers):
    """The separator and chat auto-chunking on: /api/chat takes them as /v1/chat/completions does."""
    return servers.get("--mepic-separator", SEP, "--mepic-auto-chunk", "messages")


def mepic_figure(server, name):
    lines = requests.get(server.url + "/metrics", timeout=30).text.splitlines()
    return max(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(f"sglang_mepic:{name}"))


def test_ollama_chat_takes_the_separator_and_auto_chunking(sep_server):
    def conversation(doc_a, doc_b):
        return [{"role": "system", "content": "Answer from the files."}, {"role": "user", "content": doc_a},
                {"role": "assistant", "content": "Read it."}, {"role": "user", "content": doc_b},
                {"role": "user", "content": "What is os?"}]

    for docs in ((DOC_A, DOC_B), (f"{SEP}{DOC_A}{SEP}", f"{SEP}{DOC_B}{SEP}")):  # auto-chunked, separated
        assert requests.post(sep_server.url + "/flush_cache", timeout=60).status_code == 200
        compiled = mepic_figure(sep_server, "chunks_compiled")
        ollama = requests.post(sep_server.url + "/api/chat", timeout=120, json={
            "model": "m", "messages": conversation(*docs), "stream": False,
            "options": {"num_predict": 6, "temperature": 0}})
        assert ollama.status_code == 200, ollama.text
        assert mepic_figure(sep_server, "chunks_compiled") == compiled + 2  # two chunks, on a cold cache
        openai = requests.post(sep_server.url + "/v1/chat/completions", timeout=120, json={
            "model": "m", "messages": conversation(*docs), "max_tokens": 6, "temperature": 0})
        assert len(openai.json()["metadata"]["mepic"]["chunks"]) == 2
        assert ollama.json()["prompt_eval_count"] == openai.json()["usage"]["prompt_tokens"]
        assert ollama.json()["message"]["content"] == openai.json()["choices"][0]["message"]["content"]
    status, body = post(sep_server, "/api/chat", {"model": "m", "messages": chat(f"a{SEP}b"), "stream": False})
    assert status == 400 and "messages[1].content: separator" in body and "occurs once" in body, body
