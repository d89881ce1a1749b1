import pytest

from support.replay import chunks_from_hints
from sglang_mepic.lang import chunk
from sglang_mepic.wire import hint
from sglang_mepic.wire.hint import HintError
from sglang_mepic.frontend.markup import (CHUNK_BEGIN_ID as BEG, CHUNK_END_ID as END, MarkupError, split_ids,
                                 split_text, tokenize_text)
from sglang_mepic.wire.layout import Kind, Piece, layout

P, C = Kind.PROMPT, Kind.CHUNK


def test_split_text():
    text = "intro " + chunk("doc a") + chunk("doc b") + " question"
    assert split_text(text) == [(P, "intro "), (C, "doc a"), (C, "doc b"), (P, " question")]
    assert split_text("no markup") == [(P, "no markup")]
    assert split_text(chunk("only")) == [(C, "only")]


@pytest.mark.parametrize("text, message", [
    ("a <|/chunk|> b", "no matching"),
    ("a <|chunk|> b", "never closed"),
    ("<|chunk|>a<|chunk|>b<|/chunk|><|/chunk|>", "nested"),
    ("x<|chunk|><|/chunk|>y", "empty chunk"),
    ("x<|chunk|> \n\t <|/chunk|>y", "empty chunk at character 1 \\(only whitespace\\)"),
    ("<|chunk|>a<|/chunk|><|/chunk|>", "no matching"),
])
def test_malformed_text(text, message):
    with pytest.raises(MarkupError, match=message):
        split_text(text)


def test_split_ids():
    assert split_ids([1, 2, BEG, 5, 6, END, 7], 10) == [
        Piece(P, (1, 2)), Piece(C, (5, 6)), Piece(P, (7,))]
    assert split_ids([BEG, 5, END, BEG, 6, END], 10) == [Piece(C, (5,)), Piece(C, (6,))]


@pytest.mark.parametrize("ids, message", [
    ([1, BEG, 2], "never closed"),
    ([1, END], "no matching begin"),
    ([BEG, 1, BEG, 2, END, END], "nested"),
    ([BEG, END], "empty chunk"),
    ([1, -5], "neither a token id"),
    ([1, 10], "neither a token id"),
])
def test_malformed_ids(ids, message):
    with pytest.raises(MarkupError, match=message):
        split_ids(ids, 10)


def test_tokenize_pieces_separately_with_bos_once():
    calls = []

    def encode(s, special):
        calls.append((s, special))
        return ([0] if special else []) + [len(w) for w in s.split()]

    pieces = tokenize_text("a bb " + chunk("ccc dddd") + " ee", encode)
    assert [p.kind for p in pieces] == [P, C, P]
    assert pieces[0].tokens == (0, 1, 2) and pieces[1].tokens == (3, 4)
    assert [special for _, special in calls] == [True, False, False]


def test_marked_round_trip_and_hint():
    pieces = [Piece(P, (1, 2)), Piece(C, (5, 6, 7)), Piece(C, (8,)), Piece(P, (9,))]
    marked = layout(pieces, 1)  # the request's real tokens and the chunks as marked, whatever the page size
    assert marked.real_tokens() == [1, 2, 5, 6, 7, 8, 9]
    assert marked.marked_chunks == ((2, 5), (5, 6))

    action = hint.encode(hint.Hint(chunks=marked.marked_chunks))  # as ids_and_hint builds a request's hint

    class Action:
        action_type = action["action_type"]
        action_version = action["action_version"]
        payload = action["payload"]

    class Envelope:
        actions = [Action]

    assert chunks_from_hints(Envelope, 7) == [(2, 5), (5, 6)]
    with pytest.raises(HintError, match="out of range"):
        chunks_from_hints(Envelope, 5)


def test_chunk_helper_rejects_bad_text():
    with pytest.raises(MarkupError):
        chunk("")
    with pytest.raises(MarkupError):
        chunk("a <|chunk|> b")


@pytest.mark.parametrize("radix, laid_out", [("mepic", True), (None, False)])
def test_tokenize_hook_lays_out_slots_only_with_the_mepic_cache(radix, laid_out):
    from types import SimpleNamespace

    from sglang.srt.managers.io_struct import GenerateReqInput

    from support.replay import pad_runs
    from sglang_mepic.frontend.ids_and_hint import strip_markup
    from sglang_mepic.wire.slots import PAD_FILL_ID

    encode = {"intro ": [5, 6], "doc " * 10: list(range(10, 30)), " q?": [7]}
    tokenizer = SimpleNamespace(encode=lambda s, add_special_tokens: ([1] if add_special_tokens else []) + encode[s])
    manager = SimpleNamespace(tokenizer=tokenizer, model_config=SimpleNamespace(vocab_size=100), context_len=512,
                              server_args=SimpleNamespace(page_size=16, attention_backend="mepic",
                                                          radix_cache_backend=radix))
    obj = GenerateReqInput(text="intro " + chunk("doc " * 10) + " q?")
    obj.normalize_batch_and_arguments()
    strip_markup(manager, obj)
    real = [1, 5, 6] + list(range(10, 30)) + [7]
    assert obj.text is None
    if laid_out:
        # prompt (3) + 13 pads | chunk (20) + 12 pads | question (1)
        assert obj.input_ids == [1, 5, 6] + [PAD_FILL_ID] * 13 + list(range(10, 30)) + [PAD_FILL_ID] * 12 + [7]
        assert pad_runs(obj.kv_hints) == [(3, 13), (36, 12)]
        assert chunks_from_hints(obj.kv_hints, len(obj.input_ids)) == [(16, 48)]
    else:
        assert obj.input_ids == real
        assert pad_runs(obj.kv_hints) == []
        assert chunks_from_hints(obj.kv_hints, len(obj.input_ids)) == [(3, 23)]


def test_markup_in_a_session_is_refused_where_it_would_be_laid_out():
    from types import SimpleNamespace

    from sglang.srt.managers.io_struct import GenerateReqInput

    from sglang_mepic.frontend.markup import MarkupError
    from sglang_mepic.frontend.ids_and_hint import strip_markup

    encode = {"intro ": [5, 6], "doc " * 10: list(range(10, 30)), " q?": [7]}
    tokenizer = SimpleNamespace(encode=lambda s, add_special_tokens: ([1] if add_special_tokens else []) + encode[s])
    for radix in ("mepic", None):
        manager = SimpleNamespace(tokenizer=tokenizer, model_config=SimpleNamespace(vocab_size=100), context_len=512,
                                  server_args=SimpleNamespace(page_size=16, attention_backend="mepic",
                                                              radix_cache_backend=radix))
        obj = GenerateReqInput(text="intro " + chunk("doc " * 10) + " q?", session_params={"id": "s1"})
        obj.normalize_batch_and_arguments()
        if radix == "mepic":  # pads would reach the model as tokens: refused with a reason
            with pytest.raises(MarkupError, match="session"):
                strip_markup(manager, obj)
        else:  # not laid out: plain ids, as without markup
            strip_markup(manager, obj)
            assert obj.input_ids == [1, 5, 6] + list(range(10, 30)) + [7]


def test_slot_positions_and_keys_of_a_laid_out_request():
    from sglang_mepic.wire.slots import masked_key, slot_positions

    runs = [(3, 2), (8, 1)]
    # 10 prompt slots then 2 generated tokens: positions continue after the prompt.
    assert slot_positions(12, runs).tolist() == [0, 1, 2, -1, -1, 3, 4, 5, -1, 6, 7, 8]
    assert masked_key([7] * 12, runs) == [7, 7, 7, -1, -1, 7, 7, 7, -1, 7, 7, 7]
    assert masked_key([7] * 4, runs) == [7, 7, 7, -1]  # a prefix of the layout
