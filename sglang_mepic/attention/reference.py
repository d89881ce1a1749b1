"""MEPIC attention semantics in torch: the CPU path and the kernels' reference.

Keys come from the pool in NoPE form. For one request:

    k = RoPE(k_nope, kv_pos)                    # each key at its slot's position
    query at position p attends to slot j  iff  kv_pos[j] != NO_POSITION and kv_pos[j] <= p

Scores depend only on positions, never on slot order, so a reused page can sit
anywhere in the page table.
"""

from collections.abc import Iterable

import torch
from torch.nn.functional import scaled_dot_product_attention

from sglang_mepic.attention.rope import Rope
from sglang_mepic.wire.layout import NO_POSITION

# attend_causal pads n queries over m keys to m when REDUNDANT_QUERIES * n >= m (see there).
REDUNDANT_QUERIES = 3


def gather(pool: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows `slots` of a KV pool, widened to `dtype`.

    Every read of the CPU path goes through here, so its two costs are paid once per read: `index_select`
    rather than `pool[slots]`, whose advanced-indexing kernel took 94 against 20 us for a decode's 2,300
    float32 value rows (tiny-4l's 2 heads of 32); and fp8_e5m2, the CPU's fp8 pool, widened through fp16,
    whose bit pattern is e5m2's followed by a zero byte: 36 against 75 us for `.to(float32)` on those rows,
    bit for bit the same values (inf and NaN included).
    """
    rows = pool.index_select(0, slots)
    if rows.dtype == torch.float8_e5m2 and dtype != torch.float8_e5m2:
        return (rows.view(torch.uint8).to(torch.int16) << 8).view(torch.float16).to(dtype)
    return rows.to(dtype)


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
    """`attend` with keys and values gathered from the KV pool through `slots` [m].

    Pad slots never contribute, so they are dropped before anything is gathered.
    When positions then increase along the slots and the queries are the last
    slots (what a MEPIC layout gives), causal by position is causal by index and
    SDPA's causal path applies; any other order takes the explicit mask.
    """
    real = kv_pos != NO_POSITION
    if not bool(real.all()):
        slots, kv_pos = slots[real], kv_pos[real]
    if _queries_last_in_order(kv_pos, q_pos):
        k = rope.rotate(gather(k_pool, slots, q.dtype), kv_pos)
        return attend_causal(q, k, gather(v_pool, slots, q.dtype), scaling)
    return attend(q, q_pos, gather(k_pool, slots, q.dtype), gather(v_pool, slots, q.dtype), kv_pos, rope, scaling)


def _queries_last_in_order(kv_pos: torch.Tensor, q_pos: torch.Tensor) -> bool:
    n = q_pos.shape[0]
    return (kv_pos.shape[0] >= n and bool((kv_pos[1:] > kv_pos[:-1]).all())
            and torch.equal(kv_pos[kv_pos.shape[0] - n:].long(), q_pos.long()))


def attend_plain(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor,
                 rope: Rope, scaling: float) -> torch.Tensor:
    """`attend_paged` for a request without chunks, whose slot j is at position j.

    The same attention, cheaper: RoPE reads the cache by slicing, and the mask is
    causal by index (the n queries are the last n slots), so SDPA's own causal
    path applies. Results equal `attend_paged` with kv_pos = arange(m).
    """
    k = rope.rotate(gather(k_pool, slots, q.dtype))
    return attend_causal(q, k, gather(v_pool, slots, q.dtype), scaling)


def attend_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float,
                  pads: torch.Tensor | None = None) -> torch.Tensor:
    """Rotated keys, causal by index: the n queries are the last n of the m slots.

    For one query (decode) every key is visible but pad slots, given as a mask in `pads`.
    """
    n, m = q.shape[0], k.shape[0]
    qh, kh, vh = q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)
    gqa = q.shape[1] != k.shape[1]
    if pads is not None and n != 1:
        raise ValueError("pad masks are only for single-query attention")
    if n == 1:
        mask = None if pads is None else (~pads)[None, None, None, :]
        out = scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scaling, enable_gqa=gqa)
    elif n == m:
        out = scaled_dot_product_attention(qh, kh, vh, scale=scaling, enable_gqa=gqa, is_causal=True)
    elif REDUNDANT_QUERIES * n >= m:
        # An explicit mask sends CPU SDPA down its math path: 21 ms for 1,411 queries over 1,590
        # keys against 7 ms on the causal flash path (tiny-4l's heads), and the mepic backend's
        # forward 1.65x torch_native's under eval.experiments.overload. As SGLang's torch_native does, pad
        # the queries to m (zeros for the prefix) and keep the last n rows, each computed as a
        # fresh request's would be. Below m / 3 the math path over n x m costs less (1.8 against
        # 6.9 ms for 193 queries over 1,590 keys).
        padded = qh.new_zeros((1, qh.shape[1], m, qh.shape[3]))
        padded[:, :, m - n:] = qh
        out = scaled_dot_product_attention(padded, kh, vh, scale=scaling, enable_gqa=gqa,
                                           is_causal=True)[:, :, m - n:]
    else:
        mask = torch.ones(n, m, dtype=torch.bool, device=q.device).tril(m - n)
        out = scaled_dot_product_attention(qh, kh, vh, attn_mask=mask[None, None], scale=scaling, enable_gqa=gqa)
    return out.squeeze(0).transpose(0, 1)


class DecodeKV:
    """Rotated keys and widened values of decoding requests, kept across decode steps (CPU path).

    Rotating every key of the context at every step costs more than the attention
    itself on a CPU, and reading every value again (a gather, and over fp8 a widening)
    was the largest share of a decode step after it: 22% of the scheduler's busy time
    for tiny-4l at 6 requests/s over an fp8 pool. A slot's position and contents do not
    change while its request decodes, so a request's keys and values only grow by one
    slot per step. The backend drops a row's entry when the row is extended (a new or
    resumed request) and when it leaves the decode batch, so memory stays within the
    running requests' KV, in the queries' dtype. Pads are held as zeros: whatever
    another request left in a pad slot (inf or NaN over an fp8 pool) would otherwise
    reach the output through the mask (NaN + -inf is NaN, and 0 x NaN too), as the
    kernels zero them for the same reason. The GPU kernels rotate and widen in
    registers and need none of this.
    """

    def __init__(self, rope: Rope):
        self.rope = rope
        # (layer, row) -> (keys, values, length): buffers with room to grow
        self._entries: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, int]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def drop(self, rows: Iterable[int]) -> None:
        rows = set(rows)
        self._entries = {key: e for key, e in self._entries.items() if key[1] not in rows}

    def keep_only(self, rows: Iterable[int]) -> None:
        rows = set(rows)
        self._entries = {key: e for key, e in self._entries.items() if key[1] in rows}

    def get(self, layer_id: int, row: int, k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor,
            dtype: torch.dtype, positions: torch.Tensor | None = None,
            pads: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys of `slots` rotated at `positions` (default: slot j at position j; pads: any position) and
        their values, zero where `pads`: the new slot of a step is a token, never a pad."""
        n = slots.shape[0]
        entry = self._entries.get((layer_id, row))
        if entry is not None and entry[2] == n - 1:
            keys, values, _ = entry
            if keys.shape[0] < n:
                keys, values = _grown(keys, n - 1), _grown(values, n - 1)
            new_pos = torch.tensor([n - 1], device=slots.device) if positions is None else positions[n - 1:]
            keys[n - 1:n] = self.rope.rotate(gather(k_pool, slots[n - 1:], dtype), new_pos)
            values[n - 1:n] = gather(v_pool, slots[n - 1:], dtype)
        else:
            room = max(2 * n, 64)
            keys = k_pool.new_empty((room, *k_pool.shape[1:]), dtype=dtype)
            values = v_pool.new_empty((room, *v_pool.shape[1:]), dtype=dtype)
            keys[:n] = self.rope.rotate(gather(k_pool, slots, dtype), positions)
            values[:n] = gather(v_pool, slots, dtype)
            if pads is not None:
                keys[:n][pads] = 0
                values[:n][pads] = 0
        self._entries[(layer_id, row)] = (keys, values, n)
        return keys[:n], values[:n]


def _grown(buf: torch.Tensor, used: int) -> torch.Tensor:
    grown = buf.new_empty((2 * buf.shape[0], *buf.shape[1:]))
    grown[:used] = buf[:used]
    return grown
