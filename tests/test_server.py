"""End to end: SGLang's real server, started by sglang_mepic.launch_server on the tiny model."""

import os

import pytest
import requests
import torch

pytestmark = pytest.mark.server


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
    assert plain.json()["metadata"]["mepic"] == {"recomputed_tokens": 0, "compiled_tokens": 0, "chunk_hits": 0,
                                                 "chunk_misses": 0, "residency": []}


def test_cached_tokens_exclude_chunks_compiled_for_the_request(tiny_server):
    """A cold request's chunk is computed by its own compile: compiled, not cached. Warm, it is cached."""
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
    assert "1 chunk(s) (" in log and "found 1 absent" in log and "found 1 device" in log  # compiles, logged
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
