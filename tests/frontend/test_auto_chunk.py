"""Chunks without hand-written markup: the separator and chat auto-chunking (sglang_mepic.frontend.auto_chunk). The unit half: the whole description, and the tests on a server, are in
e2e/test_auto_chunk_server.py."""


import pytest
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

from sglang_mepic import config
from sglang_mepic.frontend.auto_chunk import (MIN_PAGES, any_may_split, as_markup, candidates, chat_messages, split_separated,
                                     text_pieces)
from sglang_mepic.frontend.markup import MarkupError, split_text, tokenize_pieces, tokenize_text
from sglang_mepic.lang import chunk
from sglang_mepic.wire.layout import Kind, layout
from support.auto_chunk import SEP

P, C = Kind.PROMPT, Kind.CHUNK


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
    separated = layout(tokenize_pieces(split_separated(f"q a{SEP}bb ccc{SEP}dddd{SEP} e", SEP), encode), 1)
    marked = layout(tokenize_text("q a" + chunk("bb ccc") + chunk("dddd") + " e", encode), 1)
    assert separated == marked and marked.marked_chunks == ((3, 5), (5, 6))


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
