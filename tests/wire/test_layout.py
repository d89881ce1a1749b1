import pytest

from support.replay import chunk_hash
from sglang_mepic.wire.layout import NO_POSITION, PAD_ID, Kind, Piece, Placement, SegmentationError, layout

B = 16


def prompt(n, base=1000):
    return Piece(Kind.PROMPT, tuple(range(base, base + n)))


def chunk(n, base=0):
    return Piece(Kind.CHUNK, tuple(range(base, base + n)))


def check_invariants(lay, pieces):
    tokens = lay.slot_tokens()
    positions = lay.slot_positions()
    assert len(tokens) == len(positions) == lay.size
    # Real tokens come out in order, with exactly the positions they would have unpadded.
    real = [t for t in tokens if t != PAD_ID]
    assert real == [t for p in pieces for t in p.tokens]
    assert [p for p in positions if p != NO_POSITION] == list(range(len(real)))
    assert all((t == PAD_ID) == (p == NO_POSITION) for t, p in zip(tokens, positions))
    for i, seg in enumerate(lay.segments):
        assert seg.start % B == 0
        if seg.kind is Kind.CHUNK:
            assert seg.size % B == 0 and len(seg.tokens) > B
        elif i < len(lay.segments) - 1:
            assert seg.size % B == 0 and seg.lead_pad == 0


@pytest.mark.parametrize("placement", list(Placement))
@pytest.mark.parametrize("n", [1, B - 1, B, B + 1, 10 * B, 10 * B + 3])
def test_chunk_lengths(n, placement):
    pieces = [prompt(5), chunk(n), prompt(7)]
    lay = layout(pieces, B, placement)
    check_invariants(lay, pieces)
    if n <= B:
        # Fits in one block: nothing canonical to share, so it is plain prompt.
        assert [s.kind for s in lay.segments] == [Kind.PROMPT]
        assert lay.size == 5 + n + 7
        return
    _, c, q = lay.segments
    assert c.kind is Kind.CHUNK and c.start == B
    pad = -n % B
    if placement is Placement.LEADING:
        assert (c.lead_pad, c.tail_pad) == (pad, 0)
        assert c.padded_tokens()[:pad] == [PAD_ID] * pad
    else:
        assert (c.lead_pad, c.tail_pad) == (0, pad)
        assert c.padded_tokens()[:B] == list(range(B))  # first block is all real tokens
    assert q.tail_pad == 0 and q.start == c.end


def test_empty_chunk_is_rejected():
    with pytest.raises(SegmentationError, match="empty chunk"):
        layout([prompt(3), chunk(0), prompt(3)], B)


@pytest.mark.parametrize("placement", list(Placement))
def test_consecutive_chunks_and_no_prompt(placement):
    pieces = [chunk(40, 0), chunk(17, 100), chunk(33, 200)]
    lay = layout(pieces, B, placement)
    check_invariants(lay, pieces)
    assert [s.start for s in lay.segments] == [0, 48, 80]
    # The final chunk is laid out as prompt: the last slot must be computed in the request
    # (its logits start the answer), and must not be a pad.
    assert [s.kind for s in lay.segments] == [Kind.CHUNK, Kind.CHUNK, Kind.PROMPT]
    assert lay.slot_tokens()[-1] != PAD_ID


def test_pad_runs():
    lay = layout([prompt(5), chunk(20), prompt(3)], B, Placement.LEADING)
    assert lay.pad_runs() == [(5, 11), (16, 12)]
    assert [i for i, t in enumerate(lay.slot_tokens()) if t == PAD_ID] == list(range(5, 16)) + list(range(16, 28))


def test_chunk_layout_does_not_depend_on_position():
    a = layout([prompt(3), chunk(40, 7), prompt(1)], B).segments[1]
    b = layout([prompt(33), chunk(50, 300), chunk(40, 7), prompt(2)], B).segments[2]
    assert a.padded_tokens() == b.padded_tokens()
    assert a.first_position != b.first_position


def test_adjacent_prompts_merge():
    lay = layout([prompt(3), chunk(4), prompt(2)], B)  # the 4-token chunk is demoted to prompt
    assert len(lay.segments) == 1 and len(lay.segments[0].tokens) == 9


def test_chunk_hash_identity():
    seg = layout([chunk(40)], B).segments[0]
    other = layout([chunk(40, 1)], B).segments[0]
    h = chunk_hash(seg, Placement.TRAILING, B, "model-a", None)
    assert h == chunk_hash(seg, Placement.TRAILING, B, "model-a", None)
    assert h != chunk_hash(other, Placement.TRAILING, B, "model-a", None)
    assert h != chunk_hash(seg, Placement.TRAILING, B, "model-b", None)
    assert h != chunk_hash(seg, Placement.TRAILING, B, "model-a", "tenant-1")
    assert h != chunk_hash(seg, Placement.LEADING, B, "model-a", None)


def _strip(text, radix="mepic"):
    from types import SimpleNamespace

    from sglang.srt.managers.io_struct import GenerateReqInput

    from sglang_mepic.frontend.ids_and_hint import strip_markup

    def encode(s, add_special_tokens):  # one id per word, ids 5..94
        return ([1] if add_special_tokens else []) + [5 + len(w) % 90 for w in s.split()]
    manager = SimpleNamespace(tokenizer=SimpleNamespace(encode=encode), model_config=SimpleNamespace(vocab_size=100),
                              context_len=4096, server_args=SimpleNamespace(page_size=16, attention_backend="mepic",
                                                                            radix_cache_backend=radix))
    obj = GenerateReqInput(text=text)
    obj.normalize_batch_and_arguments()
    return strip_markup(manager, obj)


def test_more_chunks_than_max_chunks_is_refused_with_the_count_and_the_flag(monkeypatch):
    from sglang_mepic import config, env
    from sglang_mepic.lang import chunk

    monkeypatch.setenv(config.MAX_CHUNKS.env, "3")
    env.reload()
    docs = lambda n: "intro " + "".join(chunk(" ".join(f"w{i}x{j}" for j in range(20))) for i in range(n)) + " q?"
    assert len(_strip(docs(3)).chunks) == 3  # at the bound: laid out
    with pytest.raises(ValueError, match=r"marks 4 chunks for reuse, more than the 3 .*--mepic-max-chunks"):
        _strip(docs(4))
    assert _strip(docs(4), radix=None) is None  # no reuse, no compiles: no bound
    monkeypatch.delenv(config.MAX_CHUNKS.env)
    assert env.reload().max_chunks == int(config.MAX_CHUNKS.default) == 64
