"""MEPIC attention semantics in torch: the CPU path and the kernels' reference.

Keys come from the pool in NoPE form. For one request:

    k = RoPE(k_nope, kv_pos)                    # each key at its slot's position
    query at position p attends to slot j  iff  kv_pos[j] != NO_POSITION and kv_pos[j] <= p

Scores depend only on positions, never on slot order, so a reused page can sit
anywhere in the page table.
"""

import torch
from torch.nn.functional import scaled_dot_product_attention

from sglang_mepic.rope import Rope
from sglang_mepic.segments import NO_POSITION


def attend(q: torch.Tensor, q_pos: torch.Tensor, k_nope: torch.Tensor, v: torch.Tensor,
           kv_pos: torch.Tensor, rope: Rope, scaling: float) -> torch.Tensor:
    """q [n, Hq, D] already rotated at q_pos [n]; k_nope, v [m, Hkv, D]; kv_pos [m]. Returns [n, Hq, Dv]."""
    valid = kv_pos != NO_POSITION
    k = rope.rotate(k_nope.to(q.dtype), torch.where(valid, kv_pos, 0))
    mask = (kv_pos.unsqueeze(0) <= q_pos.unsqueeze(1)) & valid.unsqueeze(0)
    out = scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.to(q.dtype).transpose(0, 1).unsqueeze(0),
        attn_mask=mask.unsqueeze(0).unsqueeze(0), scale=scaling, enable_gqa=q.shape[1] != k.shape[1])
    return out.squeeze(0).transpose(0, 1)


def attend_paged(q: torch.Tensor, q_pos: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                 slots: torch.Tensor, kv_pos: torch.Tensor, rope: Rope, scaling: float) -> torch.Tensor:
    """`attend` with keys and values gathered from the KV pool through `slots` [m]."""
    return attend(q, q_pos, k_pool[slots], v_pool[slots], kv_pos, rope, scaling)


def attend_plain(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor,
                 rope: Rope, scaling: float) -> torch.Tensor:
    """`attend_paged` for a request without chunks, whose slot j is at position j.

    The same attention, cheaper: RoPE reads the cache by slicing, and the mask is
    causal by index (the n queries are the last n slots), so SDPA's own causal
    path applies. Results equal `attend_paged` with kv_pos = arange(m).
    """
    n, m = q.shape[0], slots.shape[0]
    k = rope.rotate(k_pool[slots].to(q.dtype))
    v = v_pool[slots].to(q.dtype)
    qh, kh, vh = q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)
    gqa = q.shape[1] != k.shape[1]
    if n == 1:
        out = scaled_dot_product_attention(qh, kh, vh, scale=scaling, enable_gqa=gqa)
    elif n == m:
        out = scaled_dot_product_attention(qh, kh, vh, scale=scaling, enable_gqa=gqa, is_causal=True)
    else:
        mask = torch.ones(n, m, dtype=torch.bool, device=q.device).tril(m - n)
        out = scaled_dot_product_attention(qh, kh, vh, attn_mask=mask[None, None], scale=scaling, enable_gqa=gqa)
    return out.squeeze(0).transpose(0, 1)
