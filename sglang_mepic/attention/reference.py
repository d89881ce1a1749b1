"""MEPIC attention semantics in torch: the CPU path and the kernels' reference.

Keys come from the pool in NoPE form. For one request:

    k = RoPE(k_nope, kv_pos)                    # each key at its slot's position
    query at position p attends to slot j  iff  kv_pos[j] != NO_POSITION and kv_pos[j] <= p

Scores depend only on positions, never on slot order, so a reused page can sit
anywhere in the page table.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass

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
    mask = _additive((kv_pos.unsqueeze(0) <= q_pos.unsqueeze(1)) & valid.unsqueeze(0), q.dtype)
    return _attend_masked(q, k, v.to(q.dtype), mask, scaling)


def _attend_masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                   scaling: float) -> torch.Tensor:
    out = scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0),
        attn_mask=mask.unsqueeze(0).unsqueeze(0), scale=scaling, enable_gqa=q.shape[1] != k.shape[1])
    return out.squeeze(0).transpose(0, 1)


@dataclass(frozen=True)
class PagedContext:
    """What every layer of one forward reads of a request's context: its real slots (pads dropped, as they
    never contribute), the cos/sin rows of their positions, and the additive mask of its queries, or None when
    causal by index applies (SDPA's causal path).

    Each depends on the request's maps and the queries' positions only, not on the layer, so a forward finds
    them once (`of`, `plain`) and its layers are left the pool reads, the rotation and SDPA: for a 7-chunk
    request (142 queries over 2,738 real keys, tiny-4l's heads, fp8 pool, one thread) 5.6 against 7.3 ms a
    layer, the mask alone 0.6 ms of the difference.
    """

    slots: torch.Tensor
    cos_sin: torch.Tensor
    mask: torch.Tensor | None

    @classmethod
    def of(cls, slots: torch.Tensor, kv_pos: torch.Tensor, q_pos: torch.Tensor, rope: Rope,
           dtype: torch.dtype) -> "PagedContext":
        """slots, kv_pos [m] from the request's maps; q_pos [n] its queries' positions. When positions then
        increase along the real slots and the queries are the last of them (what a MEPIC layout gives), causal
        by position is causal by index; any other order takes the explicit mask."""
        real = kv_pos != NO_POSITION
        if not bool(real.all()):
            slots, kv_pos = slots[real], kv_pos[real]
        mask = None if _queries_last_in_order(kv_pos, q_pos) else \
            _additive(kv_pos.unsqueeze(0) <= q_pos.unsqueeze(1), dtype)
        return cls(slots, rope.table(kv_pos, kv_pos.shape[0], dtype), mask)

    @classmethod
    def plain(cls, slots: torch.Tensor, rope: Rope, dtype: torch.dtype) -> "PagedContext":
        """A request without chunks, whose slot j is at position j and whose queries are its last slots."""
        return cls(slots, rope.table(None, slots.shape[0], dtype), None)


def attend_context(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, context: PagedContext,
                   rope: Rope, scaling: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [n, Hq, D] rotated, over `context`'s keys and values read from the pools. Returns the output
    [n, Hq, Dv] and the keys (rotated) and values it read, in q's dtype: a decode goes on from them
    (`DecodeKV.seed`)."""
    k = rope.rotate(gather(k_pool, context.slots, q.dtype), cos_sin=context.cos_sin)
    v = gather(v_pool, context.slots, q.dtype)
    if context.mask is None:
        return attend_causal(q, k, v, scaling), k, v
    return _attend_masked(q, k, v, context.mask, scaling), k, v


def attend_paged(q: torch.Tensor, q_pos: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                 slots: torch.Tensor, kv_pos: torch.Tensor, rope: Rope, scaling: float) -> torch.Tensor:
    """`attend` with keys and values gathered from the KV pool through `slots` [m] (`PagedContext.of`)."""
    return attend_context(q, k_pool, v_pool, PagedContext.of(slots, kv_pos, q_pos, rope, q.dtype), rope,
                          scaling)[0]


def _queries_last_in_order(kv_pos: torch.Tensor, q_pos: torch.Tensor) -> bool:
    n = q_pos.shape[0]
    return (kv_pos.shape[0] >= n and bool((kv_pos[1:] > kv_pos[:-1]).all())
            and torch.equal(kv_pos[kv_pos.shape[0] - n:].long(), q_pos.long()))


def attend_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float) -> torch.Tensor:
    """Rotated keys, causal by index: the n queries are the last n of the m slots (one query sees them all)."""
    n, m = q.shape[0], k.shape[0]
    qh, kh, vh = q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)
    gqa = q.shape[1] != k.shape[1]
    if n == 1:
        out = scaled_dot_product_attention(qh, kh, vh, scale=scaling, enable_gqa=gqa)
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
        mask = _additive(torch.ones(n, m, dtype=torch.bool, device=q.device).tril(m - n), q.dtype)
        out = scaled_dot_product_attention(qh, kh, vh, attn_mask=mask[None, None], scale=scaling, enable_gqa=gqa)
    return out.squeeze(0).transpose(0, 1)


def _additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean attention mask as SDPA's additive one (0 or -inf): CPU SDPA took 10-30% less time with it
    (torch 2.13, tiny-4l's heads: 2.41 against 2.67 ms for 256 queries over 2,300 keys). Every query sees
    at least its own key, so no row is all -inf."""
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, float("-inf"))


@dataclass
class DecodeRows:
    """The rows of a decode forward that take the cached path, the same for every layer.

    A row takes it when its new token has the largest position of its context, so every real
    slot is visible and no mask is needed. `new_slots` and `new_positions` [B] are each row's
    new slot and its position; `context(i)` is row i's real slots and their positions (None:
    slot j at position j), pads left out, read from the maps when a layer first needs them.
    """

    index: list[int]  # in the batch
    rows: list[int]
    seq_lens: list[int]
    new_slots: torch.Tensor
    new_positions: torch.Tensor
    context: Callable[[int], tuple[torch.Tensor, torch.Tensor | None]]


class DecodeKV:
    """Rotated keys and widened values of decoding requests, kept across decode steps (CPU path).

    Rotating every key of the context at every step costs more than the attention
    itself on a CPU, and reading every value again (a gather, and over fp8 a widening)
    was the largest share of a decode step after it: 22% of the scheduler's busy time
    for tiny-4l at 6 requests/s over an fp8 pool. A slot's position and contents do not
    change while its request decodes, so a request's keys and values only grow by one
    slot per step, and a step reads the new slots of all its rows at once (one gather and
    one rotation a layer, not one a row). Pad slots are left out: the attention then needs
    no mask (CPU SDPA's unmasked path), reads fewer keys, and whatever another request left
    in a pad slot (inf or NaN over an fp8 pool) cannot reach the output, as the kernels zero
    them for the same reason. An extend seeds its rows' entries with the keys and values its
    attention read (`seed`), so a request's first decode step does not read its context a
    second time; the backend drops a row's entry when it leaves the decode batch and the
    seeds of an extend the next extend replaces, so memory stays within the running
    requests' KV and the last extend's, in the queries' dtype. The GPU kernels rotate and
    widen in registers and need none of this.
    """

    def __init__(self, rope: Rope):
        self.rope = rope
        # (layer, row) -> (keys, values, slots held, the row's seq_len then): buffers with room to grow
        self._entries: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, int, int]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def drop(self, rows: Iterable[int]) -> None:
        rows = set(rows)
        self._entries = {key: e for key, e in self._entries.items() if key[1] not in rows}

    def keep_only(self, rows: Iterable[int]) -> None:
        rows = set(rows)
        self._entries = {key: e for key, e in self._entries.items() if key[1] in rows}

    def seed(self, layer_id: int, row: int, keys: torch.Tensor, values: torch.Tensor, seq_len: int) -> None:
        """Row `row`'s rotated keys and values at this layer, its real slots only, as an extend to `seq_len`
        just read them (`attend_context`): its first decode step then reads one new slot, not its whole
        context again. A step that finds no entry, or one of another length, reads the context itself."""
        self._entries[(layer_id, row)] = (keys, values, keys.shape[0], seq_len)

    def step(self, layer_id: int, k_pool: torch.Tensor, v_pool: torch.Tensor, dtype: torch.dtype,
             batch: DecodeRows) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each row's rotated keys and values in `dtype`, its real slots only, the new one last."""
        new_keys = self.rope.rotate(gather(k_pool, batch.new_slots, dtype), batch.new_positions)
        new_values = gather(v_pool, batch.new_slots, dtype)
        out = []
        for i, (row, seq_len) in enumerate(zip(batch.rows, batch.seq_lens)):
            entry = self._entries.get((layer_id, row))
            if entry is not None and entry[3] == seq_len - 1:
                keys, values, used, _ = entry
                if keys.shape[0] == used:
                    keys, values = _grown(keys, used), _grown(values, used)
                keys[used], values[used] = new_keys[i], new_values[i]
                used += 1
            else:
                slots, positions = batch.context(i)
                used = slots.shape[0]
                room = max(2 * used, 64)
                keys = k_pool.new_empty((room, *k_pool.shape[1:]), dtype=dtype)
                values = v_pool.new_empty((room, *v_pool.shape[1:]), dtype=dtype)
                keys[:used] = self.rope.rotate(gather(k_pool, slots, dtype), positions)
                values[:used] = gather(v_pool, slots, dtype)
            self._entries[(layer_id, row)] = (keys, values, used, seq_len)
            out.append((keys[:used], values[:used]))
        return out


def _grown(buf: torch.Tensor, used: int) -> torch.Tensor:
    grown = buf.new_empty((2 * buf.shape[0], *buf.shape[1:]))
    grown[:used] = buf[:used]
    return grown
