"""Input logprobs per user token: SGLang's per-slot entries, reordered and stripped of pads."""

import random

import pytest
from hypothesis import given, settings, strategies as st

from sglang_mepic.cache.logprobs import next_real_ids, per_token
from sglang_mepic.wire.slots import start_slot
from sglang_mepic.wire.layout import PAD_ID, Kind, Piece, layout


def score(slot, target):
    """A stand-in for log p(target | logits of slot): distinct per pair."""
    return slot * 1000 + target


def sglang_entries(slot_ids, start, targets):
    """What SGLang lists for slots [start, size): None, then each slot's score of its target, the last dropped."""
    return [None] + [score(k, targets[k]) for k in range(start, len(slot_ids) - 1)]


def test_each_token_gets_the_logits_of_the_real_token_before_it():
    lay = layout([Piece(Kind.PROMPT, (1, 2, 3)), Piece(Kind.CHUNK, (10, 11, 12, 13, 14)),
                  Piece(Kind.PROMPT, (7, 8))], 4)
    slots = lay.slot_tokens()  # [1 2 3 _][10 11 12 13][14 _ _ _][7 8]
    assert slots.count(PAD_ID) == 4
    pads = [t == PAD_ID for t in slots]
    ids = [0 if p else t for t, p in zip(slots, pads)]
    targets = next_real_ids(ids, pads)
    assert targets[2] == 10 and targets[8] == 7 and targets[9] == 7 and targets[-1] == 0
    out = per_token(sglang_entries(ids, 0, targets), 0, pads)
    real = lay.real_tokens()
    assert len(out) == len(real) and out[0] is None
    real_slots = [i for i, p in enumerate(pads) if not p]
    assert out[1:] == [score(real_slots[j - 1], real[j]) for j in range(1, len(real))]


def test_start_slot_is_the_slot_of_the_token_and_an_index_past_the_prompt_is_refused():
    slots = [PAD_ID, PAD_ID, 5, 6, PAD_ID, 7]
    assert [start_slot(slots, i) for i in range(4)] == [2, 3, 5, 6]
    with pytest.raises(ValueError, match="logprob_start_len=4 is higher than the number of input tokens"):
        start_slot(slots, 4)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 9)), min_size=1, max_size=8), st.integers(1, 5),
       st.integers(0, 10 ** 6))
def test_entries_from_any_start_match_an_unpadded_prompt(pieces, page_size, seed):
    rng = random.Random(seed)
    lay = layout([Piece(Kind.CHUNK if c else Kind.PROMPT, tuple(rng.randrange(1, 50) for _ in range(n)))
                  for c, n in pieces], page_size)
    slots = lay.slot_tokens()
    pads = [t == PAD_ID for t in slots]
    ids = [0 if p else t for t, p in zip(slots, pads)]
    real = lay.real_tokens()
    real_slots = [i for i, p in enumerate(pads) if not p]
    start = rng.randrange(len(real) + 1)
    at = start_slot(slots, start)
    out = per_token(sglang_entries(ids, at, next_real_ids(ids, pads)) if at < len(slots) else [], at, pads)
    # Without pads, SGLang would give token j the score of token j - 1's logits (None for the first).
    assert out == [None if j == start else score(real_slots[j - 1], real[j]) for j in range(start, len(real))]
