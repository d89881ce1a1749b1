"""Chunk markup through every client path, against a real server with the mepic cache.

The server recomputes every chunk block (`exact_server`), so a marked-up request
must give exactly the tokens of its plain prompt: markers never reach the model,
pads are invisible. Reuse itself is tested in tests/cache/e2e/test_link.py."""

import os
import pytest
import requests

from sglang_mepic.frontend.markup import CHUNK_BEGIN_ID as BEG
from sglang_mepic.frontend.markup import CHUNK_END_ID as END
from sglang_mepic.frontend.markup import split_text
from sglang_mepic.lang import chunk
from sglang_mepic.process.server_process import ServerProcess
from support.chunk_api import post


GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
WORDS = open(os.__file__).read().split()
DOC_A = " ".join(WORDS[:60])
DOC_B = " ".join(WORDS[200:290])


def piecewise_ids(tok, text, bos=True):
    """What the server must feed the model: each piece tokenized alone, markers dropped."""
    ids = []
    for i, (_, part) in enumerate(split_text(text)):
        ids += tok.encode(part, add_special_tokens=bos and i == 0)
    return ids


def test_generate_text_markup_never_reaches_the_model(exact_server, tok):
    text = "Use the documents. " + chunk(DOC_A) + chunk(DOC_B) + " Question: what is os?"
    marked = post(exact_server, "/generate", {"text": text, "sampling_params": GREEDY})
    plain = post(exact_server, "/generate", {"input_ids": piecewise_ids(tok, text), "sampling_params": GREEDY})
    assert marked["meta_info"]["prompt_tokens"] == len(piecewise_ids(tok, text))
    assert marked["output_ids"] == plain["output_ids"]
    assert "chunk|>" not in marked["text"]


def test_input_ids_markup(exact_server, tok):
    a, b = tok.encode(DOC_A, add_special_tokens=False), tok.encode(DOC_B, add_special_tokens=False)
    head, tail = tok.encode("Context:"), tok.encode(" Answer:", add_special_tokens=False)
    marked = post(exact_server, "/generate",
                  {"input_ids": head + [BEG, *a, END, BEG, *b, END] + tail, "sampling_params": GREEDY})
    plain = post(exact_server, "/generate", {"input_ids": head + a + b + tail, "sampling_params": GREEDY})
    assert marked["output_ids"] == plain["output_ids"]
    assert marked["meta_info"]["prompt_tokens"] == len(head + a + b + tail)


def test_completions_markup(exact_server, tok):
    prompt = "Docs: " + chunk(DOC_A) + " Summary:"
    body = post(exact_server, "/v1/completions",
                {"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0})
    assert body["usage"]["prompt_tokens"] == len(piecewise_ids(tok, prompt))
    assert "chunk|>" not in body["choices"][0]["text"]


def test_chat_markup(exact_server, tok):
    messages = [{"role": "system", "content": "Answer from the documents."},
                {"role": "user", "content": chunk(DOC_A) + chunk(DOC_B) + "What is os?"}]
    body = post(exact_server, "/v1/chat/completions",
                {"model": "tiny", "messages": messages, "max_tokens": 4, "temperature": 0})
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert body["usage"]["prompt_tokens"] == len(piecewise_ids(tok, rendered, bos=False))
    assert "chunk|>" not in body["choices"][0]["message"]["content"]


def test_frontend_program_with_chunks(exact_server):
    import sglang as sgl

    @sgl.function
    def rag(s, docs, question):
        s += "Use the documents.\n"
        for doc in docs:
            s += chunk(doc)
        s += "Question: " + question + "\nAnswer:" + sgl.gen("answer", max_tokens=6, temperature=0)

    backend = sgl.RuntimeEndpoint(exact_server.url)
    state = rag.run(docs=[DOC_A, DOC_B], question="what is os?", backend=backend)
    assert state["answer"] and "chunk|>" not in state["answer"]
    direct = post(exact_server, "/generate", {
        "text": "Use the documents.\n" + chunk(DOC_A) + chunk(DOC_B) + "Question: what is os?\nAnswer:",
        "sampling_params": {"max_new_tokens": 6, "temperature": 0}})
    assert state["answer"] == direct["text"]
    states = rag.run_batch([{"docs": [DOC_B, DOC_A], "question": f"q{i}"} for i in range(3)], backend=backend)
    assert all(s["answer"] for s in states)


MALFORMED = [
    ("/generate", {"text": "a <|chunk|> b", "sampling_params": GREEDY}, "never closed"),
    ("/generate", {"text": "a <|/chunk|> b", "sampling_params": GREEDY}, "no matching"),
    ("/generate", {"text": "<|chunk|>a<|chunk|>b<|/chunk|><|/chunk|>", "sampling_params": GREEDY}, "nested"),
    ("/generate", {"text": "a <|chunk|><|/chunk|> b", "sampling_params": GREEDY}, "empty chunk"),
    ("/generate", {"input_ids": [1, BEG, 5], "sampling_params": GREEDY}, "never closed"),
    ("/generate", {"input_ids": [1, -7, 5], "sampling_params": GREEDY}, "neither a token id"),
    ("/generate", {"input_ids": [1, 99999], "sampling_params": GREEDY}, "neither a token id"),
    ("/generate", {"input_ids": [BEG, *([5] * 5000), END], "sampling_params": GREEDY}, "context length"),
    ("/v1/completions", {"model": "tiny", "prompt": "x <|chunk|>y", "max_tokens": 2}, "never closed"),
    ("/v1/chat/completions", {"model": "tiny", "max_tokens": 2,
                              "messages": [{"role": "user", "content": "<|chunk|>a<|chunk|>b"}]}, "nested"),
]


@pytest.mark.parametrize("path, body, message", MALFORMED, ids=[m[2] + "-" + m[0] for m in MALFORMED])
def test_malformed_markup_is_a_400_and_the_server_keeps_serving(exact_server, path, body, message):
    r = requests.post(exact_server.url + path, json=body, timeout=60)
    assert 400 <= r.status_code < 500, r.text
    assert message in r.text
    ok = post(exact_server, "/generate", {"text": "still alive?", "sampling_params": GREEDY})
    assert len(ok["output_ids"]) == GREEDY["max_new_tokens"]


def test_no_markup_equals_sglang_default_cache(exact_server, tiny_model, run_prompt_set):
    mepic_seq, mepic_conc = run_prompt_set(exact_server)
    with ServerProcess(tiny_model, "--dtype", "float32", "--page-size", "16",
                       "--radix-cache-backend", "sglang") as default:
        default_seq, default_conc = run_prompt_set(default)
    assert mepic_seq == default_seq
    assert mepic_conc == default_conc
    assert any(cached > 0 for _, cached in mepic_seq)  # the set does exercise prefix hits


def test_repeated_chunked_request_hits_the_tree(exact_server, tok):
    """Laid out with pad slots, a repeated request matches its own earlier layout in the
    radix tree (pads key as PAD_ID) and reports cached tokens in real tokens."""
    text = "Context: " + chunk(" ".join(WORDS[500:560])) + chunk(" ".join(WORDS[600:680])) + " So?"
    first = post(exact_server, "/generate", {"text": text, "sampling_params": GREEDY})
    second = post(exact_server, "/generate", {"text": text, "sampling_params": GREEDY})
    real = len(piecewise_ids(tok, text))
    assert second["output_ids"] == first["output_ids"]
    assert first["meta_info"]["prompt_tokens"] == second["meta_info"]["prompt_tokens"] == real
    assert first["meta_info"]["cached_tokens"] < real // 2
    # All whole pages but the last are reused; what is left is the unaligned question.
    assert real - 16 <= second["meta_info"]["cached_tokens"] < real


def test_leading_placement_equals_the_plain_prompt(tiny_model, tok):
    """The paper's placement (pads before each chunk) through the whole server path."""
    text = "Use the documents. " + chunk(DOC_A) + chunk(DOC_B) + " Question: what is os?"
    with ServerProcess(tiny_model, "--dtype", "float32", "--mepic-recompute-blocks", "all",
                       "--mepic-placement", "leading") as server:
        assert "SGLANG_MEPIC_PLACEMENT" not in server.env  # the launcher's flag, not an inherited setting
        marked = post(server, "/generate", {"text": text, "sampling_params": GREEDY})
        plain = post(server, "/generate", {"input_ids": piecewise_ids(tok, text), "sampling_params": GREEDY})
    assert marked["output_ids"] == plain["output_ids"]
    assert marked["meta_info"]["prompt_tokens"] == len(piecewise_ids(tok, text))


def test_chat_markup_errors_point_into_the_message(exact_server):
    content = "What does the tag <|chunk|> mean?"
    r = requests.post(exact_server.url + "/v1/chat/completions", timeout=60, json={
        "model": "tiny", "max_tokens": 2,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": content}]})
    assert 400 <= r.status_code < 500, r.text
    assert "messages[1].content" in r.text
    assert f"at character {content.index('<|chunk|>')} is never closed" in r.text  # within the message
    assert "--mepic-text-markup off" in r.text


def test_text_markup_off_passes_typed_markers_through_as_text(tiny_model, tok):
    typed = "Explain <|chunk|> and <|/chunk|> tags."
    with ServerProcess(tiny_model, "--dtype", "float32", "--mepic-text-markup", "off") as server:
        r = post(server, "/generate", {"text": typed, "sampling_params": GREEDY})
        assert r["meta_info"]["prompt_tokens"] == len(tok.encode(typed))  # the markers are tokens of text
        assert r["meta_info"]["mepic_chunk_hits"] == r["meta_info"]["mepic_chunk_misses"] == 0  # no chunk
        assert r["meta_info"]["mepic_residency"] == []
        lone = post(server, "/v1/chat/completions", {"model": "tiny", "max_tokens": 2, "messages": [
            {"role": "user", "content": "What does <|chunk|> mean?"}]})  # malformed markup if it were on
        assert lone["choices"][0]["message"]["role"] == "assistant"
        ids = post(server, "/generate", {"input_ids": [1, BEG, *tok.encode(DOC_A, add_special_tokens=False), END, 5],
                                         "sampling_params": GREEDY})
        assert ids["meta_info"]["mepic_chunk_hits"] + ids["meta_info"]["mepic_chunk_misses"] == 1  # ids still mark
