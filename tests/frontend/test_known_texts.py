"""Registered texts found in plain prompts by content (frontend/known_texts.py)."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_mepic.frontend.known_texts import (ANCHOR, IndexFull, KnownTextError, KnownTexts, anchor_of, text_bytes,
                                               window_hashes)

WORDS = "river stone cloud harbor lantern meadow copper violet summit ember orchard falcon quartz".split()


def doc(seed: int, words: int = 40) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words)) + f" #{seed}"


def test_window_hashes_agree_with_the_anchor_of_each_window():
    text = doc(1, 80) + " é漢字🙂 " + doc(2, 30)
    hashes = window_hashes(text)
    assert len(hashes) == len(text) - ANCHOR + 1
    for i in (0, 1, 17, len(text) // 2, len(text) - ANCHOR):
        assert int(hashes[i]) == anchor_of(text[i:])


def test_a_known_text_is_found_at_any_offset_and_only_where_it_is_whole():
    known = KnownTexts(1 << 20)
    a, b = doc(1), doc(2)
    known.add("ns", a)
    known.add("ns", b)
    prompt = "Answer from the documents.\n" + b + "\n\n" + a + "\nQuestion: why?"
    spans = known.find("ns", prompt)
    assert [prompt[s:e] for s, e in spans] == [b, a]
    # Same first characters, another ending: verified, not found.
    assert known.find("ns", "x" + a[:-3] + "!!!" + " tail") == []
    assert known.find("ns", a[:ANCHOR]) == []


def test_overlaps_take_the_leftmost_then_the_longest_and_never_nest():
    known = KnownTexts(1 << 20)
    outer = doc(3, 60)
    inner = outer[: len(outer) // 2]  # the same start, shorter
    later = outer[len(outer) // 3:]   # starts inside outer
    for t in (inner, later, outer):
        known.add("ns", t)
    prompt = "Q " + outer + " end"
    assert known.find("ns", prompt) == [(2, 2 + len(outer))]
    # Without the outer text the inner one is found first, and the overlapping later one is not.
    fresh = KnownTexts(1 << 20)
    fresh.add("ns", inner)
    fresh.add("ns", later)
    assert fresh.find("ns", prompt) == [(2, 2 + len(inner))]


def test_namespaces_never_see_each_others_texts():
    known = KnownTexts(1 << 20)
    a = doc(4)
    known.add(("tenant-a", None, None), a)
    assert known.find(("tenant-b", None, None), "x " + a) == []
    assert known.find(("tenant-a", None, None), "x " + a) == [(2, 2 + len(a))]
    assert known.size(("tenant-b", None, None)) == 0


def test_the_index_stays_within_its_budget_under_a_stream_of_unique_texts():
    budget = 40_000
    known = KnownTexts(budget)
    for i in range(2_000):
        known.add("ns", doc(100 + i))
        assert known.used <= budget
    space = known.spaces["ns"]
    assert len(space.texts) < 2_000
    index = known.index
    assert len(index.recent) + int(index.main.alive.sum()) == len(space.texts)  # the index holds what is known
    newest = doc(100 + 1_999)
    assert known.find("ns", newest) == [(0, len(newest))]
    assert known.find("ns", doc(100)) == []  # the oldest was dropped


def test_a_namespace_never_pushes_out_another_namespaces_texts():
    known = KnownTexts(40_000)
    a = [doc(500 + i, 60) for i in range(60)]
    while known.used + text_bytes(a[-1]) < 30_000:
        known.add("a", a.pop())
    held = known.size("a")
    with pytest.raises(IndexFull):
        known.add_all("b", [doc(900, 400), doc(901, 400), doc(902, 400)])
    assert known.size("a") == held and known.size("b") == 0  # all or none
    assert known.add("b", doc(903, 20)) and known.used <= 40_000
    # A namespace's own new texts push out its own old ones.
    for i in range(30):
        known.add("b", doc(1000 + i, 20))
    assert known.size("a") == held and known.used <= 40_000 and known.size("b") < 31


def test_bad_registrations_are_refused():
    known = KnownTexts(1_000)
    for bad in ("", "short", "x" * (ANCHOR - 1), "y" * 1_001, None, 5):
        with pytest.raises(KnownTextError):
            known.add("ns", bad)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=6, unique=True), st.data())
def test_every_inserted_text_is_found_exactly_where_it_was_put(seeds, data):
    known = KnownTexts(1 << 22)
    texts = [doc(s, data.draw(st.integers(12, 60))) for s in seeds]
    for t in texts:
        known.add("ns", t)
    order = data.draw(st.permutations(range(len(texts))))
    filler = data.draw(st.lists(st.text(alphabet="xyz \n?", max_size=30), min_size=len(texts) + 1,
                                max_size=len(texts) + 1))
    prompt, expected = filler[0], []
    for i, j in enumerate(order):
        expected.append((len(prompt), len(prompt) + len(texts[j])))
        prompt += texts[j] + filler[i + 1]
    assert known.find("ns", prompt) == expected


def test_what_a_reviewer_tried_stays_cheap_and_correct():
    """Found by review (2026-11-28): a lone surrogate (a valid JSON escape) raised in the hash and left a
    text half-registered; texts sharing one start made every window of a repeating prompt a candidate."""
    from sglang_mepic.frontend.known_texts import MAX_SAME_START, namespace_of

    known = KnownTexts(1 << 24)
    odd = "\ud800" * 70
    known.add("s", odd)
    assert known.find("s", "q" + odd) == [(1, 71)] and known.size("s") == 1
    same = ["A" * 200 + str(i) for i in range(MAX_SAME_START)]
    known.add_all("n", same)
    with pytest.raises(KnownTextError, match="same 64 characters"):
        known.add("n", "A" * 300)
    assert known.size("n") == MAX_SAME_START
    assert known.find("n", "A" * 100_000) == []  # every window starts like them; none is whole
    assert known.find("n", "zz" + same[3] + "!") == [(2, 2 + len(same[3]))]
    with pytest.raises(IndexFull) as full:
        KnownTexts(1_000).add_all("x", [doc(1, 200)])
    assert not any(ch.isdigit() for ch in str(full.value).split("bytes", 1)[1])  # says nothing of others
    assert namespace_of("", "") == namespace_of(None, None) == (None, None)


def test_both_sides_key_a_tenant_as_sglang_does():
    """Issue 72: the tokenizer side (registered texts) and the scheduler side (chunk keys) had a rule each;
    one now (wire/namespace.py), SGLang's: an empty extra_key or cache_salt is none. SGLang makes a request's
    empty extra_key none before any hook of ours reads it, so a registration sent with "" must land where
    those requests look."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    from sglang_mepic.frontend.known_texts import namespace_of
    from sglang_mepic.wire.namespace import tenant_key

    sent = GenerateReqInput(text="x", extra_key="", cache_salt="", sampling_params={})
    sent.normalize_batch_and_arguments()
    assert namespace_of("", "") == tenant_key(sent.extra_key, sent.cache_salt) == (None, None)
    assert tenant_key("a", "") == ("a", None) != tenant_key("a", "s") and tenant_key("", "s") == (None, "s")


# Issue 68: a newcomer/attacker battery against registered texts.


def _traced(call):
    """`call()`, with the most memory it took above what was held before."""
    import tracemalloc

    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        out = call()
        return out, tracemalloc.get_traced_memory()[1] - before
    finally:
        if started:
            tracemalloc.stop()


def test_a_lookup_costs_a_few_array_passes_over_the_prompt_whatever_was_registered(monkeypatch):
    """Eight texts sharing one start ("a" * 100 to "a" * 107) made every window of a prompt of "a"s a candidate
    of each, kept as Python tuples: 2 M characters took 7.2 s and 2.4 GB of the tokenizer process, stalling
    every tenant (about 1,300 bytes a character). Now each window is compared with at most MAX_SAME_START texts,
    in arrays: the memory and the comparisons a lookup takes are a small multiple of the prompt's length."""
    from sglang_mepic.frontend import known_texts
    from sglang_mepic.frontend.known_texts import MAX_SAME_START

    known = KnownTexts(1 << 24)
    known.add_all("n", ["a" * (100 + i) for i in range(MAX_SAME_START)])
    prompt = "a" * 100_000
    found, peak = _traced(lambda: known.find("n", prompt))
    assert found[:2] == [(0, 107), (107, 214)] and len(found) == len(prompt) // 107
    assert peak < 400 * len(prompt), peak
    compared = []
    spans = known_texts._Hashes.spans
    monkeypatch.setattr(known_texts._Hashes, "spans", lambda self, at, n: compared.append(len(at)) or spans(self, at, n))
    assert known.find("n", prompt, limit=3) == found[:3]
    assert sum(compared) <= MAX_SAME_START * len(prompt)
    # Many distinct starts, each in the prompt: still one comparison a window and text under its start.
    many = KnownTexts(1 << 26)
    texts = [doc(20_000 + i, 12) for i in range(2_000)]
    many.add_all("m", texts[:256])
    for i in range(256, len(texts), 256):
        many.add_all("m", texts[i:i + 256])
    compared.clear()
    joined = "".join(texts)
    assert len(many.find("m", joined)) == len(texts)
    assert sum(compared) <= MAX_SAME_START * len(joined)


def test_every_byte_the_index_holds_is_within_its_budget():
    """A namespace cost about 9.7 KB after one lookup (its bit tables), outside the budget, which counted
    characters only: a million namespaces would take 9.7 GB. Now every namespace and text is charged what the
    index holds for it (its name included): once the budget is spent, new namespaces are refused (507), and the
    memory measured stays within it."""
    import gc

    budget = 300_000

    def fill():
        known, held = KnownTexts(budget), 0
        for i in range(5_000):
            namespace, text = (f"tenant-{i}", None), f"{i:08d} " + "x" * 74  # 83 characters
            try:
                known.add(namespace, text)
            except IndexFull:
                break
            assert known.find(namespace, "q " + text + "?") == [(2, 85)]
            held += 1
        gc.collect()
        return known, held

    fill()  # once unmeasured: the hash powers and numpy's own caches grow on first use, not per namespace
    import tracemalloc

    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        known, held = fill()
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert used <= budget, (used, held)
    assert known.used <= budget and 100 <= held < 5_000
    with pytest.raises(IndexFull):  # a namespace's name is the client's to choose: it is charged too
        KnownTexts(budget).add(("k", "s" * budget), doc(1))


def _manager(tok, context_len: int, truncate: bool = False):
    """What ids_and_hint reads of SGLang's tokenizer manager, on the tiny model's tokenizer."""
    from types import SimpleNamespace

    return SimpleNamespace(tokenizer=tok, model_config=SimpleNamespace(vocab_size=len(tok)), context_len=context_len,
                           num_reserved_tokens=0, max_req_input_len=None,
                           server_args=SimpleNamespace(page_size=16, attention_backend="mepic", radix_cache_backend="mepic",
                                                       allow_auto_truncate=truncate))


@pytest.fixture
def registered(monkeypatch):
    """A fresh registry, with registered texts on (--mepic-auto-chunk known)."""
    from sglang_mepic.frontend import known_texts

    monkeypatch.setenv("SGLANG_MEPIC_AUTO_CHUNK", "known")
    monkeypatch.setattr(known_texts, "_REGISTRY", KnownTexts(1 << 24))
    return known_texts._REGISTRY


def _request(text, **fields):
    from sglang.srt.managers.io_struct import GenerateReqInput

    obj = GenerateReqInput(text=text, **fields)
    obj.normalize_batch_and_arguments()
    return obj


def test_a_prompt_too_long_for_the_context_is_refused_before_any_lookup(tok, registered, monkeypatch):
    """A 2 M-character prompt was searched (7.2 s) and only then refused by its tokens. A token of the tiny
    model stands for at most 64 characters, so a prompt of more than 64 x context_len cannot fit."""
    from sglang_mepic.frontend.limits import LimitError, chars_per_token
    from sglang_mepic.frontend.ids_and_hint import strip_markup

    assert chars_per_token(tok) == 64
    registered.add_all((None, None), ["a" * (100 + i) for i in range(8)])
    monkeypatch.setattr(KnownTexts, "find", lambda *a, **k: pytest.fail("searched a prompt that cannot fit"))
    with pytest.raises(LimitError, match="characters"):
        strip_markup(_manager(tok, 64), _request("a" * (64 * 64 + 1)))
    obj = _request("a" * (64 * 64 + 1))  # SGLang cuts it to the context: left to it, plain
    assert strip_markup(_manager(tok, 64, truncate=True), obj) is None and obj.text == "a" * (64 * 64 + 1)


def test_a_session_turn_is_served_as_its_plain_prompt(tok, registered):
    """Another client's registration in the shared namespace turned a session turn holding the text into a 400
    ("chunk markup cannot be used in a session"), though the client sent no markup."""
    from sglang_mepic.frontend.markup import MarkupError
    from sglang_mepic.frontend.ids_and_hint import strip_markup

    text = doc(7, 30)
    registered.add((None, None), text)
    obj = _request("Read:\n" + text + "\nWhy?", session_params={"id": "s1"})
    assert strip_markup(_manager(tok, 4096), obj) is None and obj.text == "Read:\n" + text + "\nWhy?"
    with pytest.raises(MarkupError, match="session"):  # the client's own markup still is refused
        strip_markup(_manager(tok, 4096), _request("Read:\n<|chunk|>" + text + "<|/chunk|>\nWhy?",
                                                   session_params={"id": "s1"}))


def test_found_texts_that_do_not_fit_are_dropped_from_the_end(tok, registered):
    """An unmarked prompt holding 8 registered texts fit the context as plain text but not once each text was
    padded to whole pages: a registration turned a served request into a 400. Now the last found texts stay
    prompt text until the layout fits, or the prompt is served plain."""
    from sglang_mepic.frontend import limits, state
    from sglang_mepic.frontend.ids_and_hint import strip_markup

    docs = [doc(40 + i, 25) for i in range(8)]
    registered.add_all((None, None), docs)
    prompt = "Answer from these.\n" + "\n".join(docs) + "\nWhich one?"
    tokens = len(tok.encode(prompt))
    params = {"max_new_tokens": 1}
    whole = _request(prompt, sampling_params=params)
    strip_markup(_manager(tok, 4096), whole)
    slots = state.marked(whole).slots
    assert len(state.marked(whole).chunks) == 8 and slots > tokens + 40
    for context_len, chunks in ((tokens + 40, range(1, 8)), (tokens + 2, range(0, 8))):
        manager, obj = _manager(tok, context_len), _request(prompt, sampling_params=params)
        strip_markup(manager, obj)
        ids = obj.input_ids if obj.input_ids is not None else tok.encode(obj.text)
        limits.check(manager, obj, ids)  # served, as the plain prompt is
        marked = state.marked(obj)
        found = marked.chunks if marked is not None else ()
        assert len(found) in chunks
        assert list(found) == list(state.marked(whole).chunks[:len(found)])  # the first ones kept


def test_a_text_too_long_for_the_context_is_refused_before_it_is_registered(tok):
    """It was answered 400 "registered, but not warmed" and stayed registered; a 400 registers nothing."""
    from sglang_mepic.frontend.known_routes import RouteError, check_fits

    manager = _manager(tok, 256)
    check_fits(manager, [doc(1, 40)])
    with pytest.raises(RouteError, match="KV slots") as refused:
        check_fits(manager, [doc(1, 40), doc(2, 400)])
    assert refused.value.index == 1
    with pytest.raises(RouteError, match="characters"):  # over the characters bound: not even tokenized
        check_fits(manager, ["y" * (64 * 256 + 1)])


def _registration(monkeypatch, tok, registry, results, body):
    """POST /mepic/chunks in process: `results` is what the warm request answers (or raises)."""
    import asyncio
    import json

    from sglang_mepic.frontend import known_routes

    manager = _manager(tok, 4096)

    async def generate_request(obj, request):
        if isinstance(results, Exception):
            raise results
        yield results

    manager.generate_request = generate_request

    class Request:
        async def json(self):
            return body

    monkeypatch.setattr(known_routes, "_tokenizer_manager", lambda: manager)
    response = asyncio.run(known_routes.register(Request()))
    return response.status_code, json.loads(response.body)


def test_a_registration_says_which_warms_were_aborted(tok, registered, monkeypatch):
    """`abort_all` during a registration: it answered 200 and the aborted texts read "not laid out"."""
    texts = [doc(60), doc(61)]
    aborted = {"meta_info": {"finish_reason": {"type": "abort", "message": "Abort in waiting queue"}}}
    stored = {"meta_info": {"finish_reason": {"type": "length"}, "mepic_residency": ["absent"]}}
    status, out = _registration(monkeypatch, tok, registered, [aborted, stored], {"texts": texts})
    assert status == 503 and out["error"]["type"] == "aborted" and "[0]" in out["error"]["message"]
    assert [t["chunk"] for t in out["texts"]] == ["aborted", "absent"]
    assert registered.size((None, None)) == 2  # registered: registering again warms them


def test_a_warm_request_refused_undoes_the_registration(tok, registered, monkeypatch):
    registered.add((None, None), doc(70))
    status, out = _registration(monkeypatch, tok, registered, ValueError("no"), {"texts": [doc(70), doc(71)]})
    assert status == 400 and "not registered" in out["error"]["message"]
    assert registered.find((None, None), doc(71)) == [] and registered.size((None, None)) == 1  # the known one stays
