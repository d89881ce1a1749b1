"""CacheBlend's choice of recomputed tokens under tensor parallelism (attention/blend.py), without a server.

Each TP rank holds only its own KV heads. Two ranks run in threads, each a backend over its half of the heads,
paired by a SUM all-reduce of their own (as SGLang's TP group pairs them): each must choose exactly the tokens one
backend over all the heads chooses. The case is built so that a rank choosing from its own heads alone chooses
others; and at TP 1 no collective is asked for."""

import dataclasses
import threading
from types import SimpleNamespace

import pytest
import torch

from sglang_mepic import env, modes
from sglang_mepic.attention import blend
from sglang_mepic.attention.backend import MepicAttnBackend
from sglang_mepic.attention.rope import Rope, cos_sin_cache

D = 16
SLOTS = 64


class PairedSum:
    """A TP group's SUM all-reduce for ranks running in threads: each rank's call waits for every other's, and
    all get the same total, in place (as SGLang's CPU all-reduce writes it)."""

    def __init__(self, ranks: int):
        self.barrier = threading.Barrier(ranks)
        self.parts: list = [None] * ranks
        self.calls = [0] * ranks

    def of_rank(self, rank: int):
        def all_reduce(t: torch.Tensor) -> torch.Tensor:
            self.calls[rank] += 1
            self.parts[rank] = t.clone()
            self.barrier.wait(timeout=30)
            total = sum(self.parts[1:], self.parts[0].clone())  # the same order on every rank
            self.barrier.wait(timeout=30)
            return t.copy_(total)
        return all_reduce


def blend_settings(ratio: float) -> env.Settings:
    return dataclasses.replace(env.settings(), mode=modes.parse_mode(f"cacheblend-{ratio}"))


def backend_over(k_pool, v_pool, ratio, rank_sum=None):
    rope = Rope(cos_sin_cache(D, 512), D, D, True)
    return MepicAttnBackend.over_pools(torch.zeros(2, SLOTS, dtype=torch.int32), k_pool, v_pool, rope,
                                       settings=blend_settings(ratio), rank_sum=rank_sum)


def selection(backend, copies, loc, k, v):
    """The extend's tokens that write fresh KV after the check layer, as the backend's `_save` asks at it."""
    backend.copies = copies
    layer = SimpleNamespace(layer_id=backend.blend.check_layer)
    return backend._select(layer, loc, k, v).clone()


def case(tokens: int, heads: int, seed: int, loud: dict[int, list[int]]):
    """Stored KV in the pool at each token's slot, and fresh KV near it, but for `loud`: head -> the tokens whose
    fresh KV deviates much in that head (the later heads' the more)."""
    g = torch.Generator().manual_seed(seed)
    k_pool, v_pool = torch.randn(SLOTS, heads, D, generator=g), torch.randn(SLOTS, heads, D, generator=g)
    loc = torch.randperm(SLOTS, generator=g)[:tokens]
    k = k_pool[loc] + 0.01 * torch.randn(tokens, heads, D, generator=g)
    v = v_pool[loc] + 0.01 * torch.randn(tokens, heads, D, generator=g)
    for head, noisy in loud.items():
        k[noisy, head] += (1 + 3 * head) * torch.randn(len(noisy), D, generator=g)
    return k_pool, v_pool, loc, k.reshape(tokens, -1), v.reshape(tokens, -1)


def by_rank(ranks, k_pool, v_pool, k, v):
    """Each rank's share of the heads: its slice of the pool and of the fresh KV."""
    heads = k_pool.shape[1] // ranks
    k3, v3 = k.view(k.shape[0], -1, D), v.view(v.shape[0], -1, D)
    return [tuple(t[:, r * heads:(r + 1) * heads].contiguous() for t in (k_pool, v_pool, k3, v3))
            for r in range(ranks)]


def run_ranks(ratio, shares, copies, loc, group: PairedSum | None):
    """Each rank's selection, the ranks in threads at once (a rank's all-reduce waits for the others')."""
    out: list = [None] * len(shares)
    errors = []

    def rank(r):
        try:
            k_pool, v_pool, k, v = shares[r]
            backend = backend_over(k_pool, v_pool, ratio, group.of_rank(r) if group else None)
            out[r] = selection(backend, copies, loc, k.reshape(k.shape[0], -1), v.reshape(v.shape[0], -1))
        except Exception as e:  # surfaced below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(shares))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    return out


@pytest.mark.parametrize("ranks", [2, 4])
def test_every_rank_recomputes_the_tokens_all_heads_choose(ranks):
    """One request, 12 tokens read stored KV, 3 recomputed: the tokens loud in the last heads, which a rank
    holding only the first heads cannot see."""
    tokens, heads = 12, 4
    k_pool, v_pool, loc, k, v = case(tokens, heads, seed=1, loud={0: [0, 1, 2], heads - 1: [7, 8, 9]})
    copies = (torch.arange(tokens), torch.zeros(tokens, dtype=torch.long))
    whole = selection(backend_over(k_pool, v_pool, 0.25), copies, loc, k, v)
    assert (~whole).tolist() == [i not in (7, 8, 9) for i in range(tokens)]  # stored: all but the loudest
    shares = by_rank(ranks, k_pool, v_pool, k, v)
    alone = run_ranks(0.25, shares, copies, loc, None)
    assert not torch.equal(alone[0], whole)  # rank 0 by its own heads: the case tells the ranks apart
    group = PairedSum(ranks)
    summed = run_ranks(0.25, shares, copies, loc, group)
    for r, chosen in enumerate(summed):
        assert torch.equal(chosen, whole), f"rank {r} of {ranks}"
    assert group.calls == [1] * ranks  # one all-reduce a forward, at the check layer


def test_each_request_recomputes_its_own_share_across_ranks():
    """Two requests in one extend, some tokens without copies: the summed deviation still selects per request,
    and a token that read no stored KV always writes its fresh KV."""
    tokens = 20
    k_pool, v_pool, loc, k, v = case(tokens, 2, seed=2, loud={0: [1, 3, 12], 1: [4, 14, 15, 16]})
    idx = torch.tensor([0, 1, 3, 4, 5, 6, 10, 12, 13, 14, 15, 16])  # 2, 7-9, 11, 17-19: no copy
    copies = (idx, (idx >= 10).long())
    whole = selection(backend_over(k_pool, v_pool, 0.3), copies, loc, k, v)
    summed = run_ranks(0.3, by_rank(2, k_pool, v_pool, k, v), copies, loc, PairedSum(2))
    assert all(torch.equal(s, whole) for s in summed)
    no_copy = [i for i in range(tokens) if i not in idx.tolist()]
    assert whole[no_copy].all()
    stored = (~whole).nonzero().flatten().tolist()
    assert len([i for i in stored if i < 10]) == 6 - modes.blend_recomputed(modes.parse_mode("cacheblend-0.3"), 6)


def test_no_collective_at_tp_1_and_the_models_group_above_it(monkeypatch):
    """At TP 1 there is no all-reduce to make; above it, the one the model's row-parallel layers make
    (`get_parallel().tp_group`). DP attention, where a rank's heads are shared within a smaller group, is
    refused rather than summed over the wrong ranks."""
    from sglang.srt import runtime_context

    calls = []
    group = SimpleNamespace(all_reduce=lambda t: calls.append(t) or t)
    monkeypatch.setattr(runtime_context, "get_parallel",
                        lambda: SimpleNamespace(tp_size=1, attn_tp_size=1, tp_group=group))
    assert blend.tp_rank_sum() is None
    monkeypatch.setattr(runtime_context, "get_parallel",
                        lambda: SimpleNamespace(tp_size=2, attn_tp_size=2, tp_group=group))
    rank_sum = blend.tp_rank_sum()
    deviation = torch.ones(3)
    assert rank_sum is not None and rank_sum(deviation) is deviation
    assert len(calls) == 1 and calls[0] is deviation
    monkeypatch.setattr(runtime_context, "get_parallel",
                        lambda: SimpleNamespace(tp_size=4, attn_tp_size=2, tp_group=group))
    with pytest.raises(NotImplementedError, match="DP attention"):
        blend.tp_rank_sum()


def test_one_rank_selects_without_asking_for_a_sum():
    """A backend at TP 1 (no rank_sum) gives the selection of `modes.blend_keep_stored` itself."""
    tokens = 10
    k_pool, v_pool, loc, k, v = case(tokens, 2, seed=3, loud={1: [2, 5]})
    copies = (torch.arange(tokens), torch.zeros(tokens, dtype=torch.long))
    backend = backend_over(k_pool, v_pool, 0.2)
    assert backend.rank_sum is None
    assert (~selection(backend, copies, loc, k, v)).tolist() == [i not in (2, 5) for i in range(tokens)]
