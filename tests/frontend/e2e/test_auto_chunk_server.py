"""Chunks without hand-written markup: the separator and chat auto-chunking (sglang_mepic.frontend.auto_chunk).

Unit tests of the rules first; then one server per flag setting shows that the
marker, separator and auto-chunk forms of one prompt give the same layout (the
`mepic_chunks` report, prompt tokens) and the same greedy output, tokens and
logprobs, on `/generate`, `/v1/completions` and `/v1/chat/completions`.
"""

import pytest
import requests

from sglang_mepic.lang import chunk
from sglang_mepic.process.server_process import ServerProcess
from support.chunk_api import post
from support.auto_chunk import DOC_A, DOC_B, GREEDY, SEP, chatted, cold, completed, generated


@pytest.fixture
def sep_server(servers):
    """Both opt-ins at once: the separator governs the requests that use it, auto-chunking the rest."""
    return servers.get("--mepic-separator", SEP, "--mepic-auto-chunk", "messages")


def _numbers(value):
    if isinstance(value, float):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _numbers(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _numbers(v)


def _shape(value):
    if isinstance(value, float):
        return "x"
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_shape(v) for v in value]
    return value


def warm_agrees(warm, alone) -> bool:
    """A warm request computes less (the tree holds its prefix), so only its float32 logprobs may differ,
    and by little, as in test_cache_independence; tokens, layout and figures are equal."""
    return _shape(warm) == _shape(alone) and \
        list(_numbers(warm)) == pytest.approx(list(_numbers(alone)), abs=1e-4)


def test_separator_equals_markup_on_generate_and_completions(sep_server, tok):
    marked = "Use the documents." + chunk(DOC_A) + chunk(DOC_B) + " Question: what is os?"
    separated = f"Use the documents.{SEP}{DOC_A}{SEP}{DOC_B}{SEP} Question: what is os?"
    first = cold(sep_server, generated, separated)
    assert first == cold(sep_server, generated, marked) and len(first["chunks"]) == 2
    assert warm_agrees(generated(sep_server, marked), first)
    a = len(tok.encode(DOC_A, add_special_tokens=False))
    start = len(tok.encode("Use the documents."))
    assert first["chunks"][0] == [start, start + a]
    assert cold(sep_server, completed, separated) == cold(sep_server, completed, marked)
    echo = [post(sep_server, "/v1/completions", {"model": "tiny", "prompt": p, "max_tokens": 1, "echo": True,
                                                 "temperature": 0})["choices"][0]["text"] for p in (separated, marked)]
    assert echo[0] == echo[1] and SEP not in echo[0] and "chunk|>" not in echo[0]  # never shown as the prompt
    batch = post(sep_server, "/generate", {"text": [separated, "plain"], "sampling_params": GREEDY})
    assert batch[0]["output_ids"] == first["ids"] and batch[0]["meta_info"]["mepic_chunks"] == first["chunks"]
    assert batch[1]["meta_info"]["mepic_chunks"] == []


def test_chat_markup_separator_and_auto_chunk_are_one_request(sep_server):
    def conversation(doc_a, doc_b):
        return [{"role": "system", "content": "Answer from the files."},
                {"role": "user", "content": doc_a}, {"role": "assistant", "content": "Read it."},
                {"role": "tool", "content": doc_b}, {"role": "user", "content": "What is os?"}]

    auto, marked, separated = (cold(sep_server, chatted, conversation(*docs)) for docs in (
        (DOC_A, DOC_B), (chunk(DOC_A), chunk(DOC_B)), (f"{SEP}{DOC_A}{SEP}", f"{SEP}{DOC_B}{SEP}")))
    assert auto == marked == separated and len(auto["chunks"]) == 2
    warm = chatted(sep_server, conversation(DOC_A, DOC_B))  # its whole prompt in the tree now
    assert warm_agrees(warm, auto)
    short = chatted(sep_server, conversation("a short file", "a short result"))
    assert short["chunks"] == []  # under two pages: not a chunk


BAD = [
    ("/generate", {"text": f"a{SEP}b", "sampling_params": GREEDY}, "occurs once"),
    ("/generate", {"text": f"a{SEP} {SEP}b", "sampling_params": GREEDY}, "is empty or blank"),
    ("/generate", {"text": f"a{SEP}" + chunk("b") + f"{SEP}c", "sampling_params": GREEDY}, "both the separator"),
    ("/v1/completions", {"model": "tiny", "prompt": f"a{SEP}b", "max_tokens": 2}, "occurs once"),
    ("/v1/completions", {"model": "tiny", "prompt": ["ok", f"a{SEP}{SEP}b"], "max_tokens": 2}, "is empty"),
    ("/v1/chat/completions", {"model": "tiny", "max_tokens": 2, "messages": [
        {"role": "user", "content": f"x{SEP}y"}]}, "messages[0].content: separator"),
    ("/v1/chat/completions", {"model": "tiny", "max_tokens": 2, "messages": [
        {"role": "system", "content": chunk(DOC_A)}, {"role": "user", "content": f"x{SEP}y{SEP}z"}]},
     "holds chunk markup"),
]


@pytest.mark.parametrize("path, body, message", BAD, ids=[f"{b[2]}-{b[0]}" for b in BAD])
def test_bad_separator_use_is_a_400_and_the_server_keeps_serving(sep_server, path, body, message):
    r = requests.post(sep_server.url + path, json=body, timeout=60)
    assert 400 <= r.status_code < 500, r.text
    assert message in r.text
    assert len(post(sep_server, "/generate", {"text": "still alive?", "sampling_params": GREEDY})["output_ids"]) == 6


def test_tools_mode_chunks_tool_results_and_document_parts(tiny_model):
    def conversation(result, doc):
        return [{"role": "system", "content": DOC_B},  # long, but neither a tool result nor a document part
                {"role": "tool", "content": result},
                {"role": "user", "content": [{"type": "text", "text": doc}, {"type": "text", "text": "Summary?"}]}]

    with ServerProcess(tiny_model, "--dtype", "float32", "--mepic-auto-chunk", "tools") as server:
        auto = cold(server, chatted, conversation(DOC_A, DOC_B))
        marked = cold(server, chatted, conversation(chunk(DOC_A), chunk(DOC_B)))
        assert auto == marked and len(auto["chunks"]) == 2
        text = generated(server, "Docs: " + DOC_A)
        assert text["chunks"] == []  # text requests are never auto-chunked


def test_with_the_flags_off_nothing_changes(tiny_server, tok):
    text = f"Use the documents.{SEP}{DOC_A}{SEP}{DOC_B}{SEP} Question?"
    out = generated(tiny_server, text)
    assert out["prompt_tokens"] == len(tok.encode(text)) and out["chunks"] == []  # the separator is text
    chat = chatted(tiny_server, [{"role": "user", "content": DOC_A}, {"role": "assistant", "content": "ok"},
                                 {"role": "user", "content": "What is os?"}])
    assert chat["chunks"] == []
