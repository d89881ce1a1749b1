"""The TP ranks' agreement on what the tiers give (tiers/agreement.py, `Tiers.agree_round`) without a server:
one rank's tiers against a stand-in for the other rank's answers, and at TP 1 no collective at all. Two real
processes over gloo: tests/scale_out/test_tp_agreement.py; TP-2 servers: tests/scale_out/e2e/."""

import time
from types import SimpleNamespace

import pytest
import torch

from sglang_mepic.cache import round_digest
from sglang_mepic.tiers.agreement import Agreement, RanksDiverged
from sglang_mepic.tiers.levels import CODES, HostTier, Tiers
from sglang_mepic.tiers.prefetch import ABSENT, PENDING
from sglang_mepic.tiers.storage import Storage
from support.tiers import PAGE, kv_pool, slots  # noqa: F401 (kv_pool: a fixture)


class OtherRank:
    """torch.distributed over a TP group of two, as rank 0 sees it: each collective pairs this rank's tensor
    with the next one the other rank is given to send (`sends`)."""

    ReduceOp = SimpleNamespace(MIN="min")

    def __init__(self, *sends):
        self.sends = list(sends)
        self.calls: list[str] = []

    def all_reduce(self, tensor, op, group):
        assert op == "min" and group == "tp-group"
        self.calls.append("all_reduce")
        tensor.copy_(torch.minimum(tensor, torch.tensor(self.sends.pop(0), dtype=tensor.dtype)))

    def all_gather(self, out, tensor, group):
        self.calls.append("all_gather")
        out[0].copy_(tensor)
        out[1].copy_(torch.tensor(self.sends.pop(0), dtype=tensor.dtype))


def two_ranks(*sends) -> Agreement:
    return Agreement("tp-group", size=2, rank=0, dist=OtherRank(*sends))


def fetched_here(tiers, *keys, deadline_s=10.0):
    """Start this rank's reads and wait until none is pending (as rounds pass while a request waits)."""
    for key in keys:
        tiers._found(key, 2 * PAGE, start=True)
    deadline = time.monotonic() + deadline_s
    while any(isinstance(got := tiers.prefetch.poll(k), str) and got == PENDING for k in keys) \
            and time.monotonic() < deadline:
        time.sleep(0.005)


@pytest.fixture
def storage_dir(kv_pool, tmp_path):
    """A directory holding chunks a, b and d (two pages each), written by another instance."""
    writer = Tiers(kv_pool, PAGE, storage=Storage("file", {"file_storage_path": str(tmp_path)}, "model-a", timeout=10))
    assert writer.storage.connected()
    for key, first in (("a", 1), ("b", 3), ("d", 5)):
        writer.persist(key, slots(first, 2))
    assert writer.storage.drain()
    return tmp_path


def reader(kv_pool, folder, agreement) -> Tiers:
    shared = Storage("file", {"file_storage_path": str(folder)}, "model-a", timeout=10)
    assert shared.connected()
    return Tiers(kv_pool, PAGE, storage=shared, agreement=agreement)


def test_a_chunk_is_loaded_only_where_every_rank_has_it_ready(kv_pool, storage_dir):
    """This rank has a, b and d read and c found absent; the other rank has a ready, its read of b timed out
    (absent), and it still reads c and d. Agreed in one all-reduce: a is loaded, b and c are computed (b though
    this rank has it), d is waited for. Without the agreement this rank would have loaded b and d."""
    other = [CODES["storage"], CODES[ABSENT], CODES[PENDING], CODES[PENDING]]
    dist = OtherRank(other)
    tiers = reader(kv_pool, storage_dir, Agreement("tp-group", size=2, rank=0, dist=dist))
    assert tiers.agrees
    fetched_here(tiers, "a", "b", "c", "d")
    assert [tiers._found(k, 2 * PAGE, start=False) for k in "abcd"] == ["storage", "storage", ABSENT, "storage"]

    tiers.agree_round([(k, 2 * PAGE) for k in "abcd"])
    assert dist.calls == ["all_reduce"]  # one collective for the round, not one per chunk
    assert tiers.agreed() == {"a": "storage", "b": ABSENT, "c": ABSENT, "d": PENDING}
    assert [tiers.want(k, 2 * PAGE) for k in "abcd"] == ["storage", ABSENT, ABSENT, PENDING]
    assert tiers.take("b", 2 * PAGE) is None and tiers.take("d", 2 * PAGE) is None
    tiers.prefetch.clear()  # the prefetch memory drops what it fetched: the round keeps what it agreed
    got = tiers.take("a", 2 * PAGE)
    assert got is not None and got[1] == "storage"
    tiers.place(got, slots(40, 2), "a")
    assert all(torch.equal(k[slots(1, 2)], k[slots(40, 2)]) for k in kv_pool.k_buffer)
    stats = tiers.stats()
    assert stats["tier_rounds_agreed"] == 1 and stats["tier_overruled"] == 1  # b: ready here, computed

    tiers.end_round()  # outside a round a storage answer is this rank's alone: never loaded
    fetched_here(tiers, "b")
    assert tiers._found("b", 2 * PAGE, start=False) == "storage"
    assert tiers.want("b", 2 * PAGE) == ABSENT and tiers.take("b", 2 * PAGE) is None


def test_the_host_tier_keeps_chunks_within_the_smallest_ranks_pool(kv_pool):
    bytes_per_page = 2 * 3 * PAGE * 2 * 8 * 4
    gb = 7.5 * bytes_per_page / 1e9  # 7 pages (+1 padding page) on this rank
    host = HostTier(kv_pool, PAGE, gb, two_ranks([5 * PAGE]))  # the other rank's pool: 4 pages (+1)
    assert host.pool.size == 8 * PAGE and host.size == 5 * PAGE and host.pages_total() == 4
    assert host.put("a", kv_pool_kv(kv_pool, 1, 3)) and not host.put("big", kv_pool_kv(kv_pool, 10, 5))
    assert host.put("b", kv_pool_kv(kv_pool, 4, 3))  # 6 pages > 4: a goes, as on the other rank
    assert "a" not in host and "b" in host and host.evictions == 1 and host.pages_used() == 3


def kv_pool_kv(kv_pool, first, pages):
    from sglang_mepic.tiers.levels import DevicePool

    return DevicePool(kv_pool).gather(slots(first, pages))


def test_the_round_digest_check_names_the_round_and_fails_when_ranks_differ():
    agreement = two_ranks([1, 7], [2, 9])
    mine = (7).to_bytes(7, "big") + b"\0"
    agreement.check_same(mine)  # round 1: the other rank sent round 1, the same digest
    with pytest.raises(RanksDiverged, match=r"round 2: the TP ranks planned differently \(rank 0: round 2 plan "
                                            r"00000000000007, rank 1: round 2 plan 00000000000009\)"):
        agreement.check_same(mine)


@pytest.fixture
def no_collectives(monkeypatch):
    def refused(*args, **kwargs):
        raise AssertionError("a collective ran at TP 1")

    for name in ("all_reduce", "all_gather", "broadcast", "barrier"):
        monkeypatch.setattr(torch.distributed, name, refused)


def test_at_tp_1_nothing_is_agreed_and_no_collective_runs(kv_pool, storage_dir, no_collectives):
    alone = Agreement.of_group(None)
    assert alone.alone and Agreement.of_group("a group, but no torch.distributed set up").alone
    assert alone.min_codes([2, 0, 1]) == [2, 0, 1] and alone.min_int(5) == 5
    alone.check_same(b"anything")
    tiers = reader(kv_pool, storage_dir, alone)
    assert not tiers.agrees
    tiers.agree_round([("a", 2 * PAGE)])  # nothing: the live answers stand, as before the agreement
    assert tiers.agreed() == {} and tiers.want("a", 2 * PAGE) == PENDING
    fetched_here(tiers, "a")
    assert tiers.want("a", 2 * PAGE) == "storage" and tiers.take("a", 2 * PAGE) is not None
    assert "tier_rounds_agreed" not in tiers.stats()
    host = HostTier(kv_pool, PAGE, 0.001, alone)
    assert host.size == host.pool.size
    # The round check hashes nothing at TP 1 (the tree below has nothing a digest could read).
    round_digest.check(SimpleNamespace(tiers=SimpleNamespace(agreement=alone)), None, [], {})
    assert alone.collectives == 0
