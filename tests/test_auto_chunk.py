"""Chunks without hand-written markup: the separator and chat auto-chunking (sglang_mepic.frontend.auto_chunk).

Unit tests of the rules first; then one server per flag setting shows that the
marker, separator and auto-chunk forms of one prompt give the same layout (the
`mepic_chunks` report, prompt tokens) and the same greedy output, tokens and
logprobs, on `/generate`, `/v1/completions` and `/v1/chat/completions`.
"""

import os

import pytest
import requests
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

from sglang_mepic import config
from sglang_mepic.frontend.auto_chunk import (MIN_PAGES, any_may_split, as_markup, candidates, chat_messages, split_separated,
                                     text_pieces)
from sglang_mepic.frontend.markup import Marked, MarkupError, split_text, tokenize_pieces, tokenize_text
from sglang_mepic.lang import chunk
from sglang_mepic.process.server_process import ServerProcess
from sglang_mepic.wire.segments import Kind
from test_chunk_api import post

P, C = Kind.PROMPT, Kind.CHUNK
SEP = " # # "


@pytest.mark.parametrize("separated, marked", [
    (f"A{SEP}B{SEP}C{SEP}D", "A" + chunk("B") + chunk("C") + "D"),
    (f"{SEP}B{SEP}", chunk("B")),                        # no instruction, no question
    (f"sys:{SEP}doc{SEP}", "sys:" + chunk("doc")),
    ("plain text", "plain text"),
])
def test_separator_pieces_are_the_markup_a_user_would_write(separated, marked):
    pieces = split_separated(separated, SEP)
    assert pieces == split_text(marked)
    assert split_text(as_markup(pieces)) == pieces


@pytest.mark.parametrize("text, message", [
    (f"A{SEP}B", "occurs once"),
    (f"A{SEP}{SEP}B", "chunk 1, after the separator at character 1, is empty"),
    (f"A{SEP}x{SEP}  {SEP}B", "chunk 2, after the separator at character 7, is empty or blank"),
])
def test_separator_refuses_what_has_no_chunk_layout(text, message):
    with pytest.raises(MarkupError, match=message):
        split_separated(text, SEP)


def test_separator_layout_equals_markup_token_for_token():
    encode = lambda s, special: ([1] if special else []) + [len(w) for w in s.split()]  # noqa: E731
    separated = Marked.from_pieces(tokenize_pieces(split_separated(f"q a{SEP}bb ccc{SEP}dddd{SEP} e", SEP), encode))
    marked = Marked.from_pieces(tokenize_text("q a" + chunk("bb ccc") + chunk("dddd") + " e", encode))
    assert separated == marked and marked.chunks == [(3, 5), (5, 6)]


def test_text_requests_split_by_markup_or_separator_never_both(env):
    assert text_pieces(f"a{SEP}b{SEP}c") is None  # no separator configured: plain text
    assert not any_may_split(["plain", f"a{SEP}b"])
    env(separator=SEP)
    assert text_pieces(f"a{SEP}b{SEP}c") == [(P, "a"), (C, "b"), (P, "c")]
    assert text_pieces("no separator") is None
    assert any_may_split(["plain", f"a{SEP}b"]) and not any_may_split(["plain"])
    with pytest.raises(MarkupError, match="both the separator"):
        text_pieces(f"a{SEP}" + chunk("b") + f"{SEP}c")
    env(text_markup="off")  # typed markers are text then, but next to a separator they would be ambiguous
    with pytest.raises(MarkupError, match="both the separator"):
        text_pieces(f"a{SEP}<|chunk|>{SEP}c")
    assert text_pieces("<|chunk|>x<|/chunk|>") is None


def request(*messages) -> list:
    return ChatCompletionRequest(model="m", messages=list(messages)).messages


def words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


PAGE = 4
LONG, SHORT = words(MIN_PAGES * PAGE, "long"), words(MIN_PAGES * PAGE - 1, "short")


def count(text: str) -> int:
    return len(text.split())


def contents(messages) -> list:
    return [m.content if isinstance(m.content, str) else [getattr(p, "text", None) for p in m.content]
            for m in messages]


def test_messages_mode_chunks_every_long_message_but_the_last_user_turn(env):
    env(auto_chunk="messages")
    sent = request({"role": "system", "content": LONG}, {"role": "user", "content": LONG},
                   {"role": "assistant", "content": SHORT}, {"role": "tool", "content": LONG},
                   {"role": "user", "content": LONG}, {"role": "assistant", "content": LONG})
    marked = chat_messages(sent, count, PAGE)
    assert contents(marked) == [chunk(LONG), chunk(LONG), SHORT, chunk(LONG), LONG, chunk(LONG)]
    assert contents(sent)[0] == LONG  # the client's messages are left as sent
    parts = request({"role": "user", "content": [{"type": "text", "text": LONG}, {"type": "text", "text": SHORT}]},
                    {"role": "user", "content": "q?"})
    assert contents(chat_messages(parts, count, PAGE)) == [[chunk(LONG), SHORT], "q?"]  # each part on its own


def test_tools_mode_chunks_tool_results_and_documents_passed_as_parts(env):
    env(auto_chunk="tools")
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
    sent = request({"role": "system", "content": LONG},
                   {"role": "user", "content": [{"type": "text", "text": LONG}, image,
                                                {"type": "text", "text": LONG}, {"type": "text", "text": LONG}]},
                   {"role": "tool", "content": LONG}, {"role": "tool", "content": SHORT},
                   {"role": "user", "content": [{"type": "text", "text": LONG}]})  # its own words, not a document
    assert [(t.message, t.part) for t in candidates(sent, "tools")] == [(1, 0), (1, 2), (2, None), (3, None)]
    assert contents(chat_messages(sent, count, PAGE)) == [
        LONG, [chunk(LONG), None, chunk(LONG), LONG], chunk(LONG), SHORT, [LONG]]


def test_auto_chunking_leaves_marked_requests_to_their_markup_and_stops_at_max_chunks(env):
    env(auto_chunk="messages", max_chunks="2")
    typed = request({"role": "system", "content": LONG}, {"role": "user", "content": "what is <|chunk|>?"})
    assert chat_messages(typed, count, PAGE) is None
    many = request(*({"role": "tool", "content": words(MIN_PAGES * PAGE, f"t{i}")} for i in range(3)),
                   {"role": "user", "content": "q"})
    assert [isinstance(c, str) and c.startswith("<|chunk|>") for c in contents(chat_messages(many, count, PAGE))] \
        == [True, True, False, False]  # the first ones: a growing conversation keeps its earlier layout
    env(auto_chunk="off")
    assert chat_messages(many, count, PAGE) is None


def test_chat_separator_splits_each_content_and_locates_errors(env):
    env(separator=SEP, auto_chunk="messages")
    sent = request({"role": "system", "content": LONG},
                   {"role": "user", "content": f"Docs:{SEP}one{SEP}two{SEP}Question?"})
    assert contents(chat_messages(sent, count, PAGE)) == [LONG, "Docs:" + chunk("one") + chunk("two") + "Question?"]
    with pytest.raises(MarkupError, match=r"messages\[1\].content: separator ' # # ' occurs once"):
        chat_messages(request({"role": "system", "content": "s"}, {"role": "user", "content": f"a{SEP}b"}),
                      count, PAGE)
    with pytest.raises(MarkupError, match=r"messages\[1\].content\[0\] uses the separator .* messages\[0\].content "
                                          "holds chunk markup"):
        chat_messages(request({"role": "system", "content": chunk("s")},
                              {"role": "user", "content": [{"type": "text", "text": f"a{SEP}b{SEP}c"}]}),
                      count, PAGE)


# --- On a server: the three forms of one prompt are one request to the model. ---

WORDS = open(os.__file__).read().split()
DOC_A = " ".join(WORDS[:70])       # several pages each
DOC_B = " ".join(WORDS[200:290])
GREEDY = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}


@pytest.fixture
def sep_server(servers):
    """Both opt-ins at once: the separator governs the requests that use it, auto-chunking the rest."""
    return servers.get("--mepic-separator", SEP, "--mepic-auto-chunk", "messages")


def cold(server, ask, prompt):
    """`ask(server, prompt)` on an empty cache: two forms of one prompt then run the very same computation,
    so even their float32 logprobs must be equal."""
    assert requests.post(server.url + "/flush_cache", timeout=60).status_code == 200
    return ask(server, prompt)


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


def generated(server, text):
    out = post(server, "/generate", {"text": text, "sampling_params": GREEDY, "return_logprob": True,
                                     "top_logprobs_num": 2})
    meta = out["meta_info"]
    return {"ids": out["output_ids"], "logprobs": meta["output_token_logprobs"],
            "top": meta["output_top_logprobs"], "prompt_tokens": meta["prompt_tokens"], "chunks": meta["mepic_chunks"]}


def completed(server, prompt, **extra):
    out = post(server, "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": 6, "temperature": 0,
                                           "logprobs": 2, **extra})
    choice = out["choices"][0]
    return {"text": choice["text"], "logprobs": choice["logprobs"], "prompt_tokens": out["usage"]["prompt_tokens"],
            "chunks": out["metadata"]["mepic"]["chunks"]}


def chatted(server, messages):
    out = post(server, "/v1/chat/completions", {"model": "tiny", "messages": messages, "max_tokens": 6,
                                                "temperature": 0, "logprobs": True, "top_logprobs": 2})
    choice = out["choices"][0]
    return {"text": choice["message"]["content"], "logprobs": choice["logprobs"],
            "prompt_tokens": out["usage"]["prompt_tokens"], "chunks": out["metadata"]["mepic"]["chunks"]}


@pytest.mark.server
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


@pytest.mark.server
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


@pytest.mark.server
@pytest.mark.parametrize("path, body, message", BAD, ids=[f"{b[2]}-{b[0]}" for b in BAD])
def test_bad_separator_use_is_a_400_and_the_server_keeps_serving(sep_server, path, body, message):
    r = requests.post(sep_server.url + path, json=body, timeout=60)
    assert 400 <= r.status_code < 500, r.text
    assert message in r.text
    assert len(post(sep_server, "/generate", {"text": "still alive?", "sampling_params": GREEDY})["output_ids"]) == 6


@pytest.mark.server
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


@pytest.mark.server
def test_with_the_flags_off_nothing_changes(tiny_server, tok):
    text = f"Use the documents.{SEP}{DOC_A}{SEP}{DOC_B}{SEP} Question?"
    out = generated(tiny_server, text)
    assert out["prompt_tokens"] == len(tok.encode(text)) and out["chunks"] == []  # the separator is text
    chat = chatted(tiny_server, [{"role": "user", "content": DOC_A}, {"role": "assistant", "content": "ok"},
                                 {"role": "user", "content": "What is os?"}])
    assert chat["chunks"] == []
