"""CacheBlend's choice of the tokens it recomputes (`--mepic-mode cacheblend-R`), on one rank or on all.

The tokens that read stored KV found it in their own slots, copied there when they were allocated
(admission.copy_sources). At the check layer, which every token computes, the ones whose fresh KV deviates
most from it (the `ratio` share per request, `modes.blend_keep_stored`) are selected for recompute; in the
layers after it every other one keeps the stored KV.

Under tensor parallelism each rank holds only its own heads, so its deviation is a partial sum. Ranks that
chose from their partial sums would recompute different tokens, and a token would then read stored KV in
some heads and fresh KV in others: an output no single-rank server gives. So the per-token deviation is
summed over the ranks first (`tp_rank_sum`: an all-reduce over SGLang's TP group, the one the model's own
row-parallel layers reduce over), and every rank selects from the same totals. At TP 1 no collective runs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from sglang_mepic import modes

# Sums a per-token vector over the TP ranks (SGLang's all_reduce, SUM; in place on a CPU): its result is read.
RankSum = Callable[[torch.Tensor], torch.Tensor]


def tp_rank_sum() -> RankSum | None:
    """SGLang's SUM all-reduce over its TP group where the model runs on more than one rank, else None.

    The TP group is the one RowParallelLinear (`o_proj`, `down_proj`) all-reduces over, so this collective
    is called by every rank of the group in the same place of the same forward and pairs with itself. Each
    rank's share of the heads is its share within the attention-TP group; the two are one group because the
    launcher refuses DP attention (checks.py::check_parallelism), and a process where they differ is refused
    here rather than summed over the wrong ranks."""
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    if parallel.tp_size <= 1:
        return None
    if parallel.attn_tp_size != parallel.tp_size:
        raise NotImplementedError(f"--mepic-mode cacheblend: attention TP {parallel.attn_tp_size} within TP "
                                  f"{parallel.tp_size} (DP attention) is not served")
    return parallel.tp_group.all_reduce


def kv_deviation(fresh_k: torch.Tensor, fresh_v: torch.Tensor, stored_k: torch.Tensor,
                 stored_v: torch.Tensor) -> torch.Tensor:
    """Per token, the squared distance between its fresh and its stored KV over the heads given ([tokens, heads,
    dim] each), in float32."""
    return ((fresh_k.float() - stored_k) ** 2).sum((1, 2)) + ((fresh_v.float() - stored_v) ** 2).sum((1, 2))


def fresh_tokens(mode: modes.Mode, copies: tuple[torch.Tensor, torch.Tensor], loc: torch.Tensor,
                 k: torch.Tensor, v: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                 scales: tuple[float, float], rank_sum: RankSum | None) -> torch.Tensor:
    """At the check layer: which of an extend's tokens write their fresh KV in the layers after it (True), the
    others keeping what their slots hold.

    copies: (index among the extend's tokens, batch row) of the tokens whose slots hold copied KV, never empty
    (`PositionMap.copies_for_extend` gives None then), the same on every rank since each plans alike; loc:
    each extend token's slot; k, v: this rank's fresh keys and values; k_pool, v_pool: this layer's pool
    ([slots, heads, dim], this rank's heads), read at the copied slots with the layer's `scales`; rank_sum:
    None on one rank."""
    idx, batch = copies
    dst = loc[idx].long()
    k_scale, v_scale = scales
    stored_k, stored_v = k_pool[dst].float() * k_scale, v_pool[dst].float() * v_scale
    deviation = kv_deviation(k[idx].reshape(-1, *k_pool.shape[1:]), v[idx].reshape(-1, *v_pool.shape[1:]),
                             stored_k, stored_v)
    if rank_sum is not None:
        deviation = rank_sum(deviation)
    stored = modes.blend_keep_stored(mode, deviation, batch)
    fresh = torch.ones(k.shape[0], dtype=torch.bool, device=k.device)
    fresh[idx[stored]] = False
    return fresh
