"""What a client reads back: echoed prompts carry no chunk markers, and every response
reports every MEPIC figure (issue 34)."""

import json
import os

import requests

from sglang_mepic.frontend.markup import CHUNK_BEGIN_ID as BEG
from sglang_mepic.frontend.markup import CHUNK_END_ID as END
from sglang_mepic.lang import chunk


WORDS = open(os.__file__).read().split()


DOC = " ".join(WORDS[:60])  # several pages: a chunk that is reused


GREEDY = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}


COUNTS = ("mepic_recomputed_tokens", "mepic_compiled_tokens", "mepic_chunk_hits", "mepic_chunk_misses")


def post(server, path, body):
    r = requests.post(server.url + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def stream(server, path, body):
    with requests.post(server.url + path, json={**body, "stream": True}, stream=True, timeout=120) as r:
        assert r.status_code == 200, r.text
        return [json.loads(line[5:]) for line in r.iter_lines()
                if line.startswith(b"data:") and line[5:].strip() != b"[DONE]"]


def test_echo_returns_the_prompt_without_markers(tiny_server):
    from transformers import AutoTokenizer

    prompt = "Docs: " + chunk(DOC) + " Summary:"
    seen = "Docs: " + DOC + " Summary:"
    body = {"model": "tiny", "max_tokens": 2, "temperature": 0, "echo": True}
    one = post(tiny_server, "/v1/completions", {**body, "prompt": prompt})["choices"][0]["text"]
    assert one.startswith(seen) and "chunk|>" not in one
    two = post(tiny_server, "/v1/completions", {**body, "prompt": [prompt, "plain"]})["choices"]
    assert two[0]["text"].startswith(seen) and two[1]["text"].startswith("plain")
    tok = AutoTokenizer.from_pretrained(tiny_server.model_path)
    ids = tok.encode(DOC, add_special_tokens=False)
    by_ids = post(tiny_server, "/v1/completions", {**body, "prompt": [BEG, *ids, END]})["choices"][0]["text"]
    assert by_ids.startswith(tok.decode(ids, skip_special_tokens=True))


def test_streamed_echo_returns_the_prompt_without_markers(tiny_server):
    prompt = "Docs: " + chunk(DOC) + " Summary:"
    body = {"model": "tiny", "max_tokens": 2, "temperature": 0, "echo": True, "prompt": prompt}
    streamed = "".join(c["choices"][0]["text"] for c in stream(tiny_server, "/v1/completions", body))
    assert streamed.startswith("Docs: " + DOC + " Summary:") and "chunk|>" not in streamed


def test_generate_reports_every_figure_even_without_chunk_work(tiny_server):
    short = {"text": "A prompt with no chunk.", "sampling_params": GREEDY}
    tiny_chunk = {"text": "Q: " + chunk("one page") + " A:", "sampling_params": GREEDY}  # treated as prompt
    for request in (short, tiny_chunk):
        metas = [post(tiny_server, "/generate", request)["meta_info"]]
        metas += [c["meta_info"] for c in stream(tiny_server, "/generate", request)]
        metas += [r["meta_info"] for r in post(tiny_server, "/generate",
                                               {**request, "text": [request["text"]] * 2})]
        for meta in metas:
            # No chunk work; the tokens it computed in context are those the prefix cache did not hold.
            assert meta["mepic_recomputed_tokens"] == meta["prompt_tokens"] - meta["cached_tokens"] > 0, meta
            assert all(meta[key] == 0 for key in COUNTS[1:]) and meta["mepic_residency"] == [], meta
        openai = post(tiny_server, "/v1/completions", {"model": "tiny", "prompt": request["text"] + " Again?",
                                                       "max_tokens": 2})
        computed = openai["usage"]["prompt_tokens"] - openai["usage"]["prompt_tokens_details"]["cached_tokens"]
        marked = metas[0]["mepic_chunks"]  # the chunk it marked, if any
        assert len(marked) == (request is tiny_chunk)
        assert openai["metadata"]["mepic"] == {"recomputed_tokens": computed, "compiled_tokens": 0,
                                               "chunk_hits": 0, "chunk_misses": 0, "residency": [],
                                               "chunks": marked}


def test_generate_figures_agree_with_openai_metadata_for_a_chunked_request(tiny_server):
    text = "Docs: " + chunk(DOC + " figures") + " Summary:"
    meta = post(tiny_server, "/generate", {"text": text, "sampling_params": GREEDY})["meta_info"]
    assert meta["mepic_chunk_hits"] + meta["mepic_chunk_misses"] == 1 and len(meta["mepic_residency"]) == 1
    again = post(tiny_server, "/generate", {"text": text, "sampling_params": GREEDY})["meta_info"]
    openai = post(tiny_server, "/v1/completions", {"model": "tiny", "prompt": text, "max_tokens": 2,
                                                   "temperature": 0})["metadata"]["mepic"]
    assert openai == {**{k[len("mepic_"):]: again[k] for k in COUNTS}, "residency": again["mepic_residency"],
                      "chunks": again["mepic_chunks"]}
