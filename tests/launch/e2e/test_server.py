"""End to end: SGLang's real server, started by sglang_mepic.launch_server on the tiny model."""

import os
import re

import pytest
import requests
import torch

from support.server_log import prefill_logged



def generate(server, **body):
    r = requests.post(server.url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def served_model(server):
    return requests.get(server.url + "/v1/models", timeout=30).json()["data"][0]["id"]


def test_generate(tiny_server):
    out = generate(tiny_server, text="def hello(x):",
                   sampling_params={"max_new_tokens": 8, "temperature": 0, "ignore_eos": True})
    assert len(out["output_ids"]) == 8
    assert out["meta_info"]["completion_tokens"] == 8
    assert out["text"]


def test_completions(tiny_server):
    r = requests.post(tiny_server.url + "/v1/completions", timeout=120, json={
        "model": served_model(tiny_server), "prompt": "import os\nimport", "max_tokens": 6,
        "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion"
    assert body["usage"]["completion_tokens"] > 0
    assert isinstance(body["choices"][0]["text"], str)


def test_chat_completions(tiny_server):
    r = requests.post(tiny_server.url + "/v1/chat/completions", timeout=120, json={
        "model": served_model(tiny_server), "max_tokens": 6, "temperature": 0,
        "messages": [{"role": "system", "content": "You write Python."},
                     {"role": "user", "content": "Open a file."}]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["prompt_tokens"] > 10
    assert body["usage"]["completion_tokens"] > 0


DOC = " ".join(f"fact{i} is {i * 7 % 13}." for i in range(60))  # about 400 tokens


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_openai_responses_carry_cached_tokens_and_mepic_figures_by_default(tiny_server, api):
    """No --enable-cache-report given: the launcher adds it. The MEPIC figures ride in metadata.mepic."""
    from sglang_mepic.lang import chunk

    text = "Use the document. " + chunk(DOC) + " Question: what is fact3?"
    if api == "chat":
        path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": text}]}
    else:
        path, body = "/v1/completions", {"prompt": text}
    body.update(model=served_model(tiny_server), max_tokens=4, temperature=0)
    first, again = (requests.post(tiny_server.url + path, timeout=120, json=body) for _ in range(2))
    for r in (first, again):
        assert r.status_code == 200, r.text
    figures = [r.json()["metadata"]["mepic"] for r in (first, again)]
    usage = again.json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] > 300  # the chunk, reused
    for f in figures:
        assert f["chunk_hits"] + f["chunk_misses"] == 1 and len(f["residency"]) == 1
        assert f["recomputed_tokens"] > 0
    assert figures[1]["chunk_hits"] == 1 and figures[1]["residency"] == ["device"]
    plain = requests.post(tiny_server.url + path, timeout=120, json={**body, **(
        {"messages": [{"role": "user", "content": "Say hi."}]} if api == "chat" else {"prompt": "Say hi."})})
    usage = plain.json()["usage"]
    computed = usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"]  # no chunk work
    assert plain.json()["metadata"]["mepic"] == {"recomputed_tokens": computed, "compiled_tokens": 0,
                                                 "chunk_hits": 0, "chunk_misses": 0, "residency": [], "chunks": []}


def test_cached_tokens_exclude_chunks_compiled_for_the_request(tiny_server):
    """A cold request's chunk is computed by a compile row in its batch: compiled, not cached. Warm, cached."""
    from sglang_mepic.lang import chunk

    doc = " ".join(f"item{i} costs {i * 11 % 17}." for i in range(60))
    body = {"text": "Prices. " + chunk(doc) + " Question: item5?",
            "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    cold, warm = (requests.post(tiny_server.url + "/generate", timeout=120, json=body).json()["meta_info"]
                  for _ in range(2))
    assert cold["mepic_residency"] == ["absent"] and warm["mepic_residency"] == ["device"]
    assert cold["mepic_compiled_tokens"] > 300 and warm["mepic_compiled_tokens"] == 0
    assert cold["cached_tokens"] < 32  # at most a shared opening: the chunk was not a hit
    assert warm["cached_tokens"] >= cold["cached_tokens"] + cold["mepic_compiled_tokens"]
    assert warm.get("cached_tokens_details")  # SGLang's breakdown, which counted pad slots before
    log = tiny_server.log()
    for meta, where, computed in ((cold, "absent", 1), (warm, "device", 0)):
        assert re.search(rf"MEPIC request {meta['id']}: 1 chunk\(s\) found 1 {where}; {computed} computed in its "
                         "batch", log), meta["id"]
    # The prefill log counts real tokens, as the response does. The cold request shares its prefill
    # batch with the compile row computing its chunk (the chunk's real tokens, its first block too).
    lines = re.findall(r"#new-seq: 2, #new-token: (\d+), #cached-token: (\d+),", log)
    assert any(int(new) > cold["mepic_recomputed_tokens"] + cold["mepic_compiled_tokens"]
               and int(hit) == cold["cached_tokens"] for new, hit in lines), lines
    assert prefill_logged(log, warm["mepic_recomputed_tokens"], warm["cached_tokens"])
    for meta in (cold, warm):
        details = meta.get("cached_tokens_details")
        if details:
            assert details["device"] + details.get("host", 0) + details.get("storage", 0) == meta["cached_tokens"]


def test_repeated_prompt_hits_the_prefix_cache(tiny_server):
    # Text no other test sends, so the first request finds nothing cached.
    text = " ".join(open(os.__file__).read().split()[2000:2200])
    params = {"max_new_tokens": 4, "temperature": 0}
    first = generate(tiny_server, text=text, sampling_params=params)
    second = generate(tiny_server, text=text, sampling_params=params)
    prompt_tokens = second["meta_info"]["prompt_tokens"]
    assert first["meta_info"]["cached_tokens"] < prompt_tokens // 2
    # Every whole page (16 tokens) short of the last prompt token, which must be recomputed
    # for its logits, is reused.
    assert second["meta_info"]["cached_tokens"] == (prompt_tokens - 1) // 16 * 16
    assert second["output_ids"] == first["output_ids"]


def test_frontend_program(tiny_server):
    import sglang as sgl

    @sgl.function
    def qa(s, question):
        s += "Question: " + question + "\n"
        s += "Answer:" + sgl.gen("answer", max_tokens=8, temperature=0)
        s += "\nMore:" + sgl.gen("more", max_tokens=4, temperature=0, stop="\n")

    backend = sgl.RuntimeEndpoint(tiny_server.url)
    state = qa.run(question="What does os.path.join do?", backend=backend)
    assert isinstance(state["answer"], str) and state["answer"]
    assert isinstance(state["more"], str)
    states = qa.run_batch([{"question": f"q{i}"} for i in range(4)], backend=backend)
    assert len(states) == 4
    assert all(isinstance(s["answer"], str) and s["answer"] for s in states)
    # Greedy and deterministic: the same question answers the same through run and run_batch.
    again = qa.run_batch([{"question": "What does os.path.join do?"}], backend=backend)[0]
    assert again["answer"] == state["answer"]


def test_greedy_tokens_equal_hf_transformers(tiny_server, tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    words = open(os.__file__).read().split()
    prompts = ["def hello(x):", " ".join(words[:120]), " ".join(words[:400]) + " tail"]
    lengths = []
    for prompt in prompts:
        ids = tok(prompt, return_tensors="pt").input_ids
        lengths.append(ids.shape[1])
        with torch.no_grad():
            hf = model.generate(ids, max_new_tokens=32, do_sample=False)[0, ids.shape[1]:].tolist()
        out = generate(tiny_server, input_ids=ids[0].tolist(),
                       sampling_params={"max_new_tokens": 32, "temperature": 0, "ignore_eos": True})
        assert out["output_ids"] == hf, f"prompt of {ids.shape[1]} tokens diverges from HF"
    assert max(lengths) > 500


def test_input_logprobs_with_chunks_are_the_users_tokens_in_order(tiny_server, exact_server, tiny_model):
    """Input logprobs of a chunked request: natural order, no pads, as many as without chunks;
    from token 0 every token is computed, so the values are those of full recompute."""
    from transformers import AutoTokenizer

    from sglang_mepic.frontend.markup import split_text
    from sglang_mepic.lang import chunk

    words = open(os.__file__).read().split()
    text = ("Read these. " + chunk(" ".join(words[3000:3050])) + " and " + chunk(" ".join(words[3100:3170]))
            + " Question: which one?")
    tok = AutoTokenizer.from_pretrained(tiny_model)
    pieces = [tok.encode(part, add_special_tokens=i == 0) for i, (_, part) in enumerate(split_text(text))]
    ids = [t for piece in pieces for t in piece]

    def logprobs(server, start, **prompt):
        meta = generate(server, **prompt, return_logprob=True, logprob_start_len=start, top_logprobs_num=2,
                        sampling_params={"max_new_tokens": 1, "temperature": 0})["meta_info"]
        assert len(meta["input_top_logprobs"]) == len(meta["input_token_logprobs"])
        return [(v, t) for v, t, _ in meta["input_token_logprobs"]], meta

    generate(tiny_server, text=text, sampling_params={"max_new_tokens": 1})  # the chunks are stored now
    plain, _ = logprobs(exact_server, 0, input_ids=ids)
    exact, _ = logprobs(exact_server, 0, text=text)
    reused, meta = logprobs(tiny_server, 0, text=text)
    assert [t for _, t in plain] == [t for _, t in exact] == [t for _, t in reused] == ids
    assert plain[0][0] is None and reused[0][0] is None
    for (a, _), (b, _), (c, _) in zip(plain[1:], exact[1:], reused[1:]):
        assert abs(a - b) < 1e-4 and abs(b - c) < 1e-4
    assert meta["mepic_chunk_hits"] == 2 and meta["cached_tokens"] == 0  # from token 0, all computed

    question = len(ids) - 5
    tail, both = logprobs(tiny_server, question, text=text)
    assert [t for _, t in tail] == ids[question:] and tail[0][0] is None
    inside = sum(map(len, pieces[:3])) + 3  # in the second chunk
    mid, first = logprobs(tiny_server, inside, text=text)
    assert [t for _, t in mid] == ids[inside:]
    # Chunks that end before the logprob start are reused: both, then the first one only.
    assert both["mepic_chunk_hits"] == first["mepic_chunk_hits"] == 2
    assert 0 < first["cached_tokens"] < both["cached_tokens"]

    r = requests.post(tiny_server.url + "/generate", timeout=60, json={
        "text": text, "return_logprob": True, "logprob_start_len": len(ids) + 1, "sampling_params": {}})
    assert r.status_code == 400 and "higher than the number of input tokens" in r.text
