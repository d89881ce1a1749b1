"""Triton kernels for MEPIC attention: paged KV with RoPE fused on K.

Keys in the pool are NoPE. Inside the kernel each key is rotated at its slot's
position (`req_to_pos`); queries come in already rotated. A query at position
p attends to slot j iff `0 <= req_to_pos[row, j] <= p`. Slots are addressed
through `req_to_token`, so any page size works and the order of pages does not
matter.

Layouts (SGLang's):
  q        [tokens, Hq, D]        k_pool, v_pool [slots, Hkv, D]
  req_to_token, req_to_pos [rows, max_context]   cos_sin [positions, ROT] (cos | sin)
RoPE: neox pairs (i, i + ROT/2) or gptj pairs (2i, 2i + 1) over the first ROT
dims; dims past ROT pass through (partial rotary).

Where the cos/sin come from. With `inv_freq` (and `mscale`) the kernels compute
cos(pos * inv_freq) * mscale on chip, the same fp32 product and the same
scaling the model's cache was built from (`Rope.frequencies` checks that it
reproduces the cache before offering it), so a key tile costs no table reads.
Without it they gather rows of the fp32 table, which covers every cache a
model can bring.

Structure, for GPU speed:
- decode is flash-decoding: grid (request, kv head x head tile, split). Each
  program rotates its share of the context once for the whole query group
  (one [BLOCK_H, D] query tile, `tl.dot`) and writes a partial output and its
  log-sum-exp; `_merge_kernel` combines the splits. The split count per request
  is a device tensor (`num_kv_splits`), so nothing syncs with the host and the
  launch can sit in a CUDA graph.
- extend runs one program per (request, kv head, block of new tokens); its
  query tile holds the block's tokens for every query head of the group, so
  each key tile is loaded and rotated once per kv head. Its key loop ends at
  the last slot the block can see (`extend_kv_end`): a fresh prefill does not
  walk its masked half, and reused pages after the queries are not read. Under
  two waves of programs, split-K cuts the key range and `_merge_kernel` merges.
- both read K and V without masks (`_tile_keys`): every slot a tile names is a
  slot of the pool, and a masked score weighs 0. Only the positions decide
  what is seen.

Numerics: rotation and softmax run in fp32 (the softmax in base 2); the dot
products take the model's dtype on tensor cores (fp32 models, and the
interpreter, whose bf16 arithmetic is wrong, take ieee fp32 dots).

An fp8 pool (SGLang's `--kv-cache-dtype fp8_e4m3` / `fp8_e5m2`, stored without
RoPE like any other) is read as it is: a key is widened to fp32 before it is
rotated, so the shared copy stays position-independent, and a value is widened
to the dot's type. The per-layer scales SGLang divides by when it writes
(`k_scale`, `v_scale`) are multiplied back in once: the key's into the scores'
scale, the value's into the output. Over an fp8 pool the value rows of hidden slots
are zeroed (`_load_values`): a cast to fp8 does not saturate, and 0 x inf is NaN.
"""

import functools
import os
from typing import Any

import torch
import triton
import triton.language as tl

MAX_KV_SPLITS = 16  # partial outputs per request at most (the merge's constexpr bound)
MIN_SPLIT_LEN = 256  # keys per split at least: fewer and the merge costs more than the split saves


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _pair_index(h, HALF: tl.constexpr, NEOX: tl.constexpr):
    if NEOX:
        return h, h + HALF
    else:
        return 2 * h, 2 * h + 1


@triton.jit
def _inv_freq(InvFreq, h, TABLE: tl.constexpr):
    if TABLE:
        return h.to(tl.float32)  # unused
    else:
        return tl.load(InvFreq + h)


@triton.jit
def _sincos(angle, FAST: tl.constexpr):
    """(cos, sin) of fp32 angles: one Cody-Waite reduction to [-pi, pi], then the fast path.

    k = rint(angle / 2pi); r = angle - k * C1 - k * C2 with C1 = fp32(2pi) and C2 the
    rest: each fma rounds once and k * C1 is exact inside it, so r is within about
    2e-7 of the exact remainder for every angle a position below 2^24 can give (the
    third term, k * 1e-15, stays under 1e-8 there). `sin.approx` / `cos.approx` are
    accurate to about 5e-7 on [-pi, pi]: no slow path, no local memory. The
    interpreter (FAST off) takes tl.cos / tl.sin of the same reduced angle.
    """
    k = tl.floor(angle * 0.15915494309189535 + 0.5)
    if FAST:
        r = tl.fma(k, -6.2831854820251465, angle)
        r = tl.fma(k, 1.7484555314695172e-07, r)
    else:  # the interpreter's fma rounds twice: the same fused steps in fp64, each rounded once to fp32
        c1 = tl.full([1, 1], -6.2831854820251465, tl.float32).to(tl.float64)
        c2 = tl.full([1, 1], 1.7484555314695172e-07, tl.float32).to(tl.float64)
        r = (k.to(tl.float64) * c1 + angle.to(tl.float64)).to(tl.float32)
        r = (k.to(tl.float64) * c2 + r.to(tl.float64)).to(tl.float32)
    if FAST:
        c = tl.inline_asm_elementwise("cos.approx.f32 $0, $1;", "=r,r", [r], dtype=tl.float32, is_pure=True, pack=1)
        s = tl.inline_asm_elementwise("sin.approx.f32 $0, $1;", "=r,r", [r], dtype=tl.float32, is_pure=True, pack=1)
        return c, s
    else:
        return tl.cos(r), tl.sin(r)


@triton.jit
def _cos_sin(CosSin, stride_cs, inv_freq, mscale, pos, h, HALF: tl.constexpr, TABLE: tl.constexpr,
             FAST: tl.constexpr, SCALED: tl.constexpr):
    """cos and sin [BLOCK_N, HALF] (fp32) of the tile's positions. A pad's (-1) is masked later: the table
    reads row 0 for it, on chip it is computed as is."""
    if TABLE:
        rows = CosSin + tl.maximum(pos, 0).to(tl.int64)[:, None] * stride_cs + h[None, :]
        return tl.load(rows).to(tl.float32), tl.load(rows + HALF).to(tl.float32)
    else:
        c, s = _sincos(pos.to(tl.float32)[:, None] * inv_freq[None, :], FAST)
        if SCALED:
            c, s = c * mscale, s * mscale
        return c, s


@triton.jit
def _tile_keys(ReqToPos, ReqToToken, row, first, n, end, stride_rp, stride_rt):
    """Positions (-1 past `end`) and slots (0 past `end`) of the tile of a request's slots at `first`.

    The range test is n < end - first, a scalar against the tile's lane offsets n, so it stays in 32 bits
    (first + n < end lets the compiler widen the loop counter and test in 64).

    K and V are then read without masks: every slot a tile names is a slot of the pool (pads and keys
    past a query's position included, slot 0 past the end), and masked scores give those keys the
    weight 0. Their values are the model's own K/V (a pad's are its fill token's), so finite."""
    inside = n < end - first
    pos = tl.load(ReqToPos + row * stride_rp + first + n, mask=inside, other=-1)
    slot = tl.load(ReqToToken + row * stride_rt + first + n, mask=inside, other=0)
    return pos, slot


@triton.jit
def _slot_offset(slot, stride, WIDE: tl.constexpr):
    """slot * stride in 64 bits. WIDE (the launch checked that the pool's slot strides are int32 multiples
    of 16): one `mul.wide.s32`, and the alignment the 16-byte copies need. Written as an int64 product, the
    compiler hoists the stride's sign extension out of the loop and is left with a full 64 x 64 multiply
    per slot, seven instructions."""
    if WIDE:
        off = tl.inline_asm_elementwise("mul.wide.s32 $0, $1, $2;", "=l,r,r",
                                        [slot.to(tl.int32), (stride + tl.zeros_like(slot)).to(tl.int32)],
                                        dtype=tl.int64, is_pure=True, pack=1)
        return tl.multiple_of(off, 16)
    else:
        return slot.to(tl.int64) * stride


@triton.jit
def _scores(s0, q1, q2, qp, K, slot, pos, kvh, stride_ks, stride_kh, CosSin, stride_cs, inv_freq, mscale,
            h, i1, i2, HALF: tl.constexpr, PASS: tl.constexpr, TABLE: tl.constexpr, DOT_FP32: tl.constexpr,
            FAST: tl.constexpr, SCALED: tl.constexpr, WIDE: tl.constexpr):
    """q . RoPE(k, pos) for a query tile [R, D] (split in halves) and one key tile [BLOCK_N]: [R, BLOCK_N] fp32.

    s0 is a zero [R, BLOCK_N] fp32 tile, the dots' accumulator."""
    cos, sin = _cos_sin(CosSin, stride_cs, inv_freq, mscale, pos, h, HALF, TABLE, FAST, SCALED)
    k_base = K + _slot_offset(slot, stride_ks, WIDE)[:, None] + kvh * stride_kh
    k1 = tl.load(k_base + i1[None, :]).to(tl.float32)
    k2 = tl.load(k_base + i2[None, :]).to(tl.float32)
    s = _dot(q1, tl.trans(k1 * cos - k2 * sin), s0, DOT_FP32)
    s = _dot(q2, tl.trans(k2 * cos + k1 * sin), s, DOT_FP32)
    if PASS > 0:
        ip = 2 * HALF + tl.arange(0, PASS)
        kp = tl.load(k_base + ip[None, :])
        s = _dot(qp, tl.trans(kp), s, DOT_FP32)
    return s


@triton.jit
def _dot(a, b, acc, DOT_FP32: tl.constexpr):
    # a is the query side, already in the dot's operand type; b follows it. Accumulating into
    # acc (rather than adding two dots) keeps one score tile live, not two.
    if DOT_FP32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b.to(a.dtype), acc)


@triton.jit
def _load_values(V, slot, pos, kvh, dv, stride_vs, stride_vh, WIDE: tl.constexpr, ZERO_V: tl.constexpr):
    """A value tile [BLOCK_N, DV], read without a mask (a masked key weighs 0). ZERO_V (an fp8 pool): the rows of
    slots no query may see (pads, and slot 0 read past a request's end) are zeros, since 0 x inf is NaN and a cast
    to fp8 turns large values into inf or NaN: what another request left in such a slot cannot reach this one."""
    v = tl.load(V + _slot_offset(slot, stride_vs, WIDE)[:, None] + kvh * stride_vh + dv[None, :])
    if ZERO_V:
        v = tl.where((pos >= 0)[:, None], v.to(tl.float32), 0.0)
    return v


@triton.jit
def _load_query(Q, tok, head, mask, stride_qt, stride_qh, i1, i2, HALF: tl.constexpr, PASS: tl.constexpr):
    base = Q + tok[:, None] * stride_qt + head[:, None] * stride_qh
    q1 = tl.load(base + i1[None, :], mask=mask[:, None], other=0.0)
    q2 = tl.load(base + i2[None, :], mask=mask[:, None], other=0.0)
    if PASS > 0:
        qp = tl.load(base + (2 * HALF + tl.arange(0, PASS))[None, :], mask=mask[:, None], other=0.0)
    else:
        qp = q1  # unused
    return q1, q2, qp


LOG2E = tl.constexpr(1.4426950408889634)  # scores are kept in base 2: sm_scale * LOG2E, then exp2
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _exp2(x, FAST: tl.constexpr):
    """2^x; on the GPU `ex2.approx.ftz` alone (tl.exp and tl.exp2 add a subnormal fix-up around it, three
    instructions a score). Flushing results under 2^-126 to zero changes no softmax weight that counts."""
    if FAST:
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return tl.exp2(x)


@triton.jit
def _online_softmax(s, m_i, l_i, acc, FAST: tl.constexpr):
    """Fold one tile's base-2 scores s [R, N] into the running max, sum and (rescaled) accumulator; returns p too."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)  # nothing visible yet in this row
    alpha = _exp2(m_i - m_safe, FAST)
    p = _exp2(s - m_safe[:, None], FAST)
    return m_new, l_i * alpha + tl.sum(p, 1), acc * alpha[:, None], p


@triton.jit
def _lse(m_i, l_i, seen):
    """The natural log-sum-exp of a row kept in base 2 (what the merge reads)."""
    return tl.where(seen, (m_i + tl.log2(tl.where(seen, l_i, 1.0))) * LN2, -float("inf"))


@triton.jit
def _split_range(seq_len, splits, split, BLOCK_N: tl.constexpr):
    # Splits are whole tiles long, so no tile straddles two of them.
    per_split = tl.cdiv(tl.cdiv(seq_len, splits), BLOCK_N) * BLOCK_N
    start = split * per_split
    return start, tl.minimum(start + per_split, seq_len)


@triton.jit
def _mepic_decode_kernel(
    Q, K, V, PartialOut, PartialLse, ReqToToken, ReqToPos, ReqIdx, SeqLens, QPos, NumSplits, CosSin, InvFreq,
    mscale, sm_scale, v_scale,
    stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_pb, stride_ph, stride_ps,
    stride_lb, stride_lh, stride_rt, stride_rp, stride_cs,
    GROUP: tl.constexpr, HEAD_TILES: tl.constexpr, BLOCK_H: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    ROT: tl.constexpr, NEOX: tl.constexpr, BLOCK_N: tl.constexpr, TABLE: tl.constexpr, DOT_FP32: tl.constexpr,
    FAST: tl.constexpr, SCALED: tl.constexpr, WIDE: tl.constexpr, ZERO_V: tl.constexpr = False,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1) // HEAD_TILES
    tile = tl.program_id(1) % HEAD_TILES
    split = tl.program_id(2)
    splits = tl.load(NumSplits + b)
    if split >= splits:
        return
    seq_len = tl.load(SeqLens + b).to(tl.int32)
    start, end = _split_range(seq_len, splits, split, BLOCK_N)
    if start >= end:
        return
    HALF: tl.constexpr = ROT // 2
    PASS: tl.constexpr = D - ROT
    g = tile * BLOCK_H + tl.arange(0, BLOCK_H)
    gmask = g < GROUP
    head = kvh * GROUP + g
    h = tl.arange(0, HALF)
    dv = tl.arange(0, DV)
    n = tl.arange(0, BLOCK_N)
    i1, i2 = _pair_index(h, HALF, NEOX)
    inv_freq = _inv_freq(InvFreq, h, TABLE)

    row = tl.load(ReqIdx + b).to(tl.int64)
    q_pos = tl.load(QPos + b).to(tl.int32)
    q1, q2, qp = _load_query(Q, b + 0 * g, head, gmask, stride_qt, stride_qh, i1, i2, HALF, PASS)

    m_i = tl.full([BLOCK_H], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, DV], tl.float32)
    for first in range(start, end, BLOCK_N):
        pos, slot = _tile_keys(ReqToPos, ReqToToken, row, first, n, end, stride_rp, stride_rt)
        visible = (pos >= 0) & (pos <= q_pos)
        s = _scores(tl.zeros([BLOCK_H, BLOCK_N], tl.float32), q1, q2, qp, K, slot, pos, kvh, stride_ks,
                    stride_kh, CosSin, stride_cs, inv_freq, mscale, h, i1, i2, HALF, PASS, TABLE, DOT_FP32, FAST,
                    SCALED, WIDE) * (sm_scale * LOG2E)
        s = tl.where(visible[None, :], s, -float("inf"))
        m_i, l_i, acc, p = _online_softmax(s, m_i, l_i, acc, FAST)
        v = _load_values(V, slot, pos, kvh, dv, stride_vs, stride_vh, WIDE, ZERO_V)
        acc = _dot(p.to(q1.dtype), v, acc, DOT_FP32)
    seen = l_i > 0.0
    out = PartialOut + b * stride_pb + head[:, None] * stride_ph + split * stride_ps + dv[None, :]
    tl.store(out, acc * (v_scale / tl.where(seen, l_i, 1.0))[:, None], mask=gmask[:, None])
    lse = _lse(m_i, l_i, seen)
    tl.store(PartialLse + b * stride_lb + head * stride_lh + split, lse, mask=gmask)


@triton.jit
def _merge_kernel(PartialOut, PartialLse, Out, SeqLens, NumSplits, stride_pb, stride_ph, stride_ps, stride_lb,
                  stride_lh, stride_ot, stride_oh, DV: tl.constexpr, MAX_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr,
                  FIXED: tl.constexpr = False):
    """Out[b, head] from the row's partial outputs, weighted by their log-sum-exp.

    Decode (FIXED off): row b is a request with NumSplits[b] splits of SeqLens[b] keys.
    Split extend (FIXED on): row b is a token, every one of its MAX_SPLITS partials is
    written, and an empty one carries lse = -inf (SeqLens, NumSplits unused)."""
    b = tl.program_id(0)
    head = tl.program_id(1)
    if FIXED:
        splits = MAX_SPLITS
        seq_len = MAX_SPLITS * BLOCK_N
    else:
        splits = tl.load(NumSplits + b)
        seq_len = tl.load(SeqLens + b)
    dv = tl.arange(0, DV)
    m = -float("inf")
    total = 0.0
    acc = tl.zeros([DV], tl.float32)
    for split in range(0, MAX_SPLITS):
        start, end = _split_range(seq_len, splits, split, BLOCK_N)
        if (split < splits) & (start < end):
            lse = tl.load(PartialLse + b * stride_lb + head * stride_lh + split)
            if lse > -float("inf"):
                part = tl.load(PartialOut + b * stride_pb + head * stride_ph + split * stride_ps + dv)
                m_new = tl.maximum(m, lse)
                scale = tl.exp(m - m_new)
                w = tl.exp(lse - m_new)
                acc = acc * scale + w * part
                total = total * scale + w
                m = m_new
    out = acc / tl.where(total > 0.0, total, 1.0)
    tl.store(Out + b * stride_ot + head * stride_oh + dv, out.to(Out.dtype.element_ty))


@triton.jit
def _mepic_extend_kernel(
    Q, K, V, Out, PartialOut, PartialLse, ReqToToken, ReqToPos, ReqIdx, SeqLens, QStart, ExtLens, Positions, KvEnd,
    CosSin, InvFreq, mscale, sm_scale, v_scale,
    stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_ot, stride_oh,
    stride_pt, stride_ph, stride_ps, stride_lt, stride_lh, stride_rt, stride_rp, stride_cs,
    GROUP: tl.constexpr, GROUP_P: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, ROT: tl.constexpr,
    NEOX: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TABLE: tl.constexpr,
    DOT_FP32: tl.constexpr, FAST: tl.constexpr, SCALED: tl.constexpr, WIDE: tl.constexpr, SPLITS: tl.constexpr,
    HAS_KV_END: tl.constexpr, ZERO_V: tl.constexpr = False,
):
    # Query tile: BLOCK_M rows = BLOCK_M // GROUP_P new tokens x GROUP_P heads of kv head `kvh`.
    TOKENS: tl.constexpr = BLOCK_M // GROUP_P
    b = tl.program_id(0)
    kvh = tl.program_id(1) // SPLITS
    split = tl.program_id(1) % SPLITS
    mblk = tl.program_id(2)
    ext_len = tl.load(ExtLens + b)
    if mblk * TOKENS >= ext_len:
        return
    HALF: tl.constexpr = ROT // 2
    PASS: tl.constexpr = D - ROT
    r = tl.arange(0, BLOCK_M)
    m = mblk * TOKENS + r // GROUP_P
    g = r % GROUP_P
    rmask = (m < ext_len) & (g < GROUP)
    head = kvh * GROUP + g
    h = tl.arange(0, HALF)
    dv = tl.arange(0, DV)
    n = tl.arange(0, BLOCK_N)
    i1, i2 = _pair_index(h, HALF, NEOX)
    inv_freq = _inv_freq(InvFreq, h, TABLE)

    row = tl.load(ReqIdx + b).to(tl.int64)
    seq_len = tl.load(SeqLens + b).to(tl.int32)
    q_tok = (tl.load(QStart + b) + m).to(tl.int64)
    q_pos = tl.load(Positions + q_tok, mask=rmask, other=-1).to(tl.int32)
    # The loop ends at the last slot any query of the block can see: on an identity row
    # (KvEnd < 0: slot j at position j) the block's last position + 1; on a planned row the
    # precomputed last visible slot of the request + 1. No tile is read only to be skipped.
    end = seq_len
    if HAS_KV_END:
        bound = tl.load(KvEnd + b)
        end = tl.minimum(seq_len, tl.where(bound < 0, tl.max(q_pos, 0) + 1, bound))
    start, stop = _split_range(end, SPLITS, split, BLOCK_N)
    q1, q2, qp = _load_query(Q, q_tok, head, rmask, stride_qt, stride_qh, i1, i2, HALF, PASS)

    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DV], tl.float32)
    for first in range(start, stop, BLOCK_N):
        pos, slot = _tile_keys(ReqToPos, ReqToToken, row, first, n, stop, stride_rp, stride_rt)
        s = _scores(tl.zeros([BLOCK_M, BLOCK_N], tl.float32), q1, q2, qp, K, slot, pos, kvh, stride_ks,
                    stride_kh, CosSin, stride_cs, inv_freq, mscale, h, i1, i2, HALF, PASS, TABLE, DOT_FP32, FAST,
                    SCALED, WIDE) * (sm_scale * LOG2E)
        s = tl.where((pos[None, :] >= 0) & (pos[None, :] <= q_pos[:, None]), s, -float("inf"))
        m_i, l_i, acc, p = _online_softmax(s, m_i, l_i, acc, FAST)
        v = _load_values(V, slot, pos, kvh, dv, stride_vs, stride_vh, WIDE, ZERO_V)
        acc = _dot(p.to(q1.dtype), v, acc, DOT_FP32)
    seen = l_i > 0.0
    if SPLITS == 1:
        out = Out + q_tok[:, None] * stride_ot + head[:, None] * stride_oh + dv[None, :]
        tl.store(out, (acc * (v_scale / tl.where(seen, l_i, 1.0))[:, None]).to(Out.dtype.element_ty),
                 mask=rmask[:, None])
    else:  # partial output and log-sum-exp of this split; _merge_kernel (FIXED) combines them
        out = PartialOut + q_tok[:, None] * stride_pt + head[:, None] * stride_ph + split * stride_ps + dv[None, :]
        tl.store(out, acc * (v_scale / tl.where(seen, l_i, 1.0))[:, None], mask=rmask[:, None])
        lse = _lse(m_i, l_i, seen)
        tl.store(PartialLse + q_tok * stride_lt + head * stride_lh + split, lse, mask=rmask)


def check_shapes(head_dim: int, rotary_dim: int, q_heads: int, kv_heads: int) -> None:
    """Refuse what the kernels cannot run, with the reason (the server calls this at start-up)."""
    half, rest = rotary_dim // 2, head_dim - rotary_dim
    if rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(f"rotary_dim {rotary_dim} does not fit head dim {head_dim}")
    for size in (half, rest or 16, head_dim):
        if size & (size - 1) or size < 16:
            raise ValueError(f"head dim {head_dim} with rotary_dim {rotary_dim}: the GPU kernels need the rotary "
                             f"half, the pass-through part and the head dim to be powers of two of at least 16")
    if q_heads % kv_heads:
        raise ValueError(f"{q_heads} query heads are not a multiple of {kv_heads} kv heads")


def _check(q: torch.Tensor, k_pool: torch.Tensor, cos_sin: torch.Tensor, rotary_dim: int,
           inv_freq: torch.Tensor | None) -> None:
    check_shapes(q.shape[-1], rotary_dim, q.shape[1], k_pool.shape[1])
    if cos_sin.shape[-1] != rotary_dim:
        raise ValueError(f"cos_sin {tuple(cos_sin.shape)} does not match rotary_dim {rotary_dim}")
    if inv_freq is not None and inv_freq.shape != (rotary_dim // 2,):
        raise ValueError(f"inv_freq {tuple(inv_freq.shape)} does not match rotary_dim {rotary_dim}")


def _rope_args(cos_sin: torch.Tensor, inv_freq: torch.Tensor | None,
               mscale: float) -> tuple[torch.Tensor, torch.Tensor, float, bool, bool]:
    """(table, inv_freq or the table, mscale, TABLE, SCALED) of a launch."""
    table = inv_freq is None
    return cos_sin, (cos_sin if table else inv_freq), float(mscale), table, (not table) and float(mscale) != 1.0


def _wide_slots(k_pool: torch.Tensor, v_pool: torch.Tensor) -> bool:
    """Slot offsets by `mul.wide.s32` with a 16-element alignment hint (`_slot_offset`): on the GPU, for pools
    whose slot strides are int32 multiples of 16 (every contiguous pool of a head dim the kernels take)."""
    return not _interpreting() and all(p.stride(0) % 16 == 0 and p.stride(0) < 2 ** 31 for p in (k_pool, v_pool))


def _fp8(pool: torch.Tensor) -> bool:
    return pool.element_size() == 1 and pool.dtype.is_floating_point


def _dot_fp32(dtype: torch.dtype, dot_fp32: bool | None) -> bool:
    """fp32 models take ieee fp32 dots; so does the interpreter unless a test asks for the model dtype's dot."""
    if dot_fp32 is not None:
        return dot_fp32 or dtype == torch.float32
    return dtype == torch.float32 or _interpreting()


def whole_wave_splits(programs_per_split: int, capacity: int, max_splits: int = MAX_KV_SPLITS) -> int:
    """Splits that fill the machine in whole waves: the count with the least time per key.

    capacity is the CTAs the GPU runs at once (CTAs per SM of the compiled kernel x SMs).
    Time ~ waves rounded up x keys per program, so the cost of s splits is
    ceil(P s / capacity) / s, with 1% per extra split for its merge and prologue; more
    splits are taken for a gain of 2% at least. Calibrated on an H200
    (eval/results/gpu/h200.md, `eval/gpu/sweep_decode.py`): it picks the fastest
    measured count, or one within 2% of it, at batch 1/8/64 and 4k/32k context;
    the former 3% and 10% kept batch 64 at 2 splits, 9% slower than 3.
    """
    p, cap = max(programs_per_split, 1), max(capacity, 1)
    best, best_cost = 1, float("inf")
    for s in range(1, max_splits + 1):
        cost = -(-p * s // cap) / s * (1 + 0.01 * (s - 1))
        if cost < 0.98 * best_cost:
            best, best_cost = s, cost
    return best


def num_kv_splits(seq_lens: torch.Tensor, programs_per_split: int, sm_count: int, out: torch.Tensor | None = None,
                  max_splits: int = MAX_KV_SPLITS, ctas_per_sm: int | None = None) -> torch.Tensor:
    """Splits per request [B] (int32), on the device and without a host sync.

    The count for the longest request fills the decode kernel's real capacity
    (`ctas_per_sm`: on a GPU, the compiled kernel's, `decode_ctas_per_sm`; when not
    given, `launch_config`'s static figure) in whole waves
    (`whole_wave_splits`); splits of about MIN_SPLIT_LEN keys at least (whole key
    tiles, so a request's last split may be shorter),
    and each request's splits in proportion to its length, so a short request in
    a long batch is not cut into slivers.
    """
    if ctas_per_sm is None:
        ctas_per_sm = launch_config("decode", 128, torch.bfloat16, device_arch(seq_lens.device))["ctas_per_sm"]
    lens = seq_lens.to(torch.int32)
    wanted = whole_wave_splits(programs_per_split, sm_count * ctas_per_sm, max_splits)
    longest = lens.max().clamp(min=1)
    per_split = torch.maximum(torch.div(longest + wanted - 1, wanted, rounding_mode="floor"),
                              torch.full_like(longest, MIN_SPLIT_LEN))
    splits = torch.div(lens + per_split - 1, per_split, rounding_mode="floor").clamp(1, max_splits).to(torch.int32)
    if out is None:
        return splits
    out[: splits.numel()].copy_(splits)
    return out[: splits.numel()]


class DecodeWorkspace:
    """Partial outputs and log-sum-exps of split decode; fixed addresses for CUDA graphs.

    One workspace serves one stream: every layer's decode reuses it, which is safe
    because launches on one stream run in order. The backend keeps one per CUDA stream.
    """

    def __init__(self, batch: int, heads: int, dv: int, device: torch.device | str | int,
                 max_splits: int = MAX_KV_SPLITS) -> None:
        self.partial = torch.empty((batch, heads, max_splits, dv), dtype=torch.float32, device=device)
        self.lse = torch.empty((batch, heads, max_splits), dtype=torch.float32, device=device)
        self.max_splits = max_splits

    def fits(self, batch: int, heads: int, dv: int) -> bool:
        return self.partial.shape[0] >= batch and self.partial.shape[1] == heads and self.partial.shape[3] == dv


def sm_count(device: torch.device | str | int) -> int:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132  # an H100's, so the interpreter exercises the same split counts


def launch_config(kind: str, head_dim: int, dtype: torch.dtype | None, arch: int = 90) -> dict[str, int]:
    """Tile sizes, warps, pipeline stages and CTAs per SM of a launch on Hopper (arch 90) or Ampere (80).

    Chosen with `python -m eval.bench.kernel_model` (registers, shared memory and the
    inner loop's SASS of each candidate, compiled as Triton compiles at launch)
    and checked by `python -m sglang_mepic.kernels.aot`, which fails on any
    spill. For decode, `ctas_per_sm` is only the fallback where no compiled
    kernel is at hand (CPU, the interpreter): on a GPU split counts are sized
    from the kernel Triton built there (`decode_ctas_per_sm`). Speed is
    measured on a GPU (`eval/bench/attention.py --device cuda`), not here.
    """
    if kind == "decode":  # on sm_80, 4 warps spill (partial rotary, table)
        # 64-key tiles on sm_90 in 16 bits: 1.3-1.4x faster than 32 at equal splits at every point (H200 sweep,
        # eval/results/gpu/h200.md); fp32, sm_80 and newer chips keep 32, not measured with 64.
        wide = arch == 90 and dtype in (torch.bfloat16, torch.float16)
        return dict(block_n=64 if wide else 32, block_h=16, num_warps=4 if arch >= 90 else 8, num_stages=2,
                    ctas_per_sm=DECODE_CTAS_PER_SM.get(arch, 2))
    if dtype == torch.float32:  # 8 warps: ptxas caps at 128 registers and spills 16 bytes
        return dict(block_m=32, block_n=16, num_warps=4, num_stages=1, ctas_per_sm=1)
    if arch >= 90:
        return dict(block_m=EXTEND_TILE_90[0], block_n=EXTEND_TILE_90[1], num_warps=8, num_stages=2, ctas_per_sm=1)
    return dict(block_m=32, block_n=32, num_warps=8, num_stages=1, ctas_per_sm=1)


# CTAs per SM of the decode kernel where none is compiled (CPU, the interpreter, the static model's
# fallback): the default variant's (on-chip cos/sin, 64-key tiles on sm_90), head dim 128, bf16, as the
# venv's Triton 3.7.1 compiles it (sm_90: 168 registers, 4 warps, 3 CTAs/SM; sm_80: 128 registers, 8 warps,
# 2). tests/attention/test_kernels.py keeps it equal to the compiled kernel's. On a GPU the backend sizes splits from
# the kernel compiled there (`decode_ctas_per_sm`): the H200 run's Triton 3.6.0 also fits 3 CTAs/SM of it.
DECODE_CTAS_PER_SM = {90: 3, 80: 2}
EXTEND_TILE_90 = (128, 32)  # rows x keys of the sm_90 extend tile (eval/results/gpu/model.md: 128 x 64 sits at
# 255 registers and spills in two of its four variants; 64-row tiles cost twice the rotation per score)
# The backend computes cos/sin on chip (where the model's cache is cos(p * inv_freq) * mscale;
# MEPIC_ROPE_TABLE=1 forces the table). Measured on an H100 (eval/results/gpu/after.md), on chip was
# faster than the fp32 table in 8 of 10 cases: the table took 6-18% longer on every extend and 1-10%
# longer at decode B>=8, and was faster only at decode B=1. The static SASS count of model.md ranked
# them the other way (it leaves out the table's per-key gathers from global memory).
DEFAULT_TABLE_ROPE = False
MIN_EXTEND_SPLIT_TILES = 4  # key tiles per extend split at least


FP8_MIN_ARCH = 89  # Triton's fp8 types (e4m3 as fp8e4nv) start at sm_89


def device_arch(device: torch.device | str | int) -> int:
    device = torch.device(device)
    return _cuda_arch(device.index) if device.type == "cuda" else 90


@functools.lru_cache(maxsize=None)
def _cuda_arch(index: int | None) -> int:  # asked at every launch; a device's capability never changes
    major, minor = torch.cuda.get_device_capability(index)
    return 10 * major + minor


def decode_tiles(group: int, block_h: int | None = None) -> tuple[int, int]:
    """(rows of the query tile, tiles per kv head) for a GQA group of `group` query heads."""
    # tl.dot needs 16 rows at least; more than the group would be idle rows.
    block_h = max(16, min(block_h or launch_config("decode", 0, None)["block_h"], triton.next_power_of_2(group)))
    return block_h, triton.cdiv(group, block_h)


def decode_programs_per_split(batch: int, q_heads: int, kv_heads: int) -> int:
    """Programs one split of every request takes: what `num_kv_splits` divides the SMs by."""
    return batch * kv_heads * decode_tiles(q_heads // kv_heads)[1]


def decode(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, req_to_token: torch.Tensor,
           req_to_pos: torch.Tensor, req_idx: torch.Tensor, seq_lens: torch.Tensor, q_pos: torch.Tensor,
           cos_sin: torch.Tensor, rotary_dim: int, neox: bool, sm_scale: float, out: torch.Tensor | None = None,
           block_n: int | None = None, inv_freq: torch.Tensor | None = None, mscale: float = 1.0,
           splits: torch.Tensor | None = None, workspace: "DecodeWorkspace | None" = None,
           block_h: int | None = None, num_warps: int | None = None, num_stages: int | None = None,
           dot_fp32: bool | None = None, k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """One new token per request: q [B, Hq, D] -> out [B, Hq, Dv].

    `splits` [B] int32 (default: `num_kv_splits` for the kernel's capacity,
    `decode_ctas_per_sm`) says how many programs share each request's context;
    `workspace` (a DecodeWorkspace) holds their partial results. Both may be
    fixed buffers, for CUDA graphs. `dot_fp32` (tests) overrides the choice of
    ieee fp32 dots. `k_scale`, `v_scale`: what the pool's keys and values are
    multiplied by when read (SGLang's per-layer scales of a quantized cache).
    """
    _check(q, k_pool, cos_sin, rotary_dim, inv_freq)
    batch, hq, _ = q.shape
    dv = v_pool.shape[-1]
    if workspace is None:
        workspace = DecodeWorkspace(batch, hq, dv, q.device)
    elif not workspace.fits(batch, hq, dv):
        raise ValueError(f"decode workspace {tuple(workspace.partial.shape)} does not fit batch {batch}, "
                         f"{hq} heads, head dim {dv}")
    options: dict[str, Any] = dict(inv_freq=inv_freq, mscale=mscale, block_n=block_n, block_h=block_h,
                                   num_warps=num_warps, num_stages=num_stages, dot_fp32=dot_fp32, k_scale=k_scale,
                                   v_scale=v_scale)
    tensors = (q, k_pool, v_pool, req_to_token, req_to_pos, req_idx, seq_lens, q_pos, cos_sin)
    if splits is None:
        ctas = decode_ctas_per_sm(*tensors, rotary_dim, neox, sm_scale, workspace=workspace, **options)
        programs = batch * k_pool.shape[1] * decode_tiles(hq // k_pool.shape[1], block_h)[1]
        splits = num_kv_splits(seq_lens, programs, sm_count(q.device), ctas_per_sm=ctas)
    out = q.new_empty((batch, hq, dv)) if out is None else out
    grid, args, kwargs = _decode_launch(*tensors, rotary_dim, neox, sm_scale, splits, workspace, **options)
    _mepic_decode_kernel[grid](*args, **kwargs)
    partial, lse = workspace.partial, workspace.lse
    _merge_kernel[(batch, hq)](
        partial, lse, out, seq_lens, splits, partial.stride(0), partial.stride(1), partial.stride(2),
        lse.stride(0), lse.stride(1), out.stride(0), out.stride(1), DV=dv, MAX_SPLITS=workspace.max_splits,
        BLOCK_N=kwargs["BLOCK_N"])
    return out


def decode_ctas_per_sm(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, req_to_token: torch.Tensor,
                       req_to_pos: torch.Tensor, req_idx: torch.Tensor, seq_lens: torch.Tensor, q_pos: torch.Tensor,
                       cos_sin: torch.Tensor, rotary_dim: int, neox: bool, sm_scale: float,
                       splits: torch.Tensor | None = None, workspace: "DecodeWorkspace | None" = None,
                       **options: Any) -> int:
    """CTAs per SM of the decode kernel that `decode(...)` launches for these arguments.

    On a GPU: of the kernel Triton builds for them on this device (`JITFunction.warmup`: compiled, or taken
    from Triton's cache, and not launched), from its registers, warps and shared memory and the device's
    limits (`occupancy`). So split counts follow the Triton version and GPU actually running: the previous
    32-key source compiled to 138 registers with Triton 3.7.1 and to 109 with the H100 run's 3.6.0. Elsewhere
    (CPU, the interpreter) `launch_config`'s static figure. Host work only, no stream sync; the backend
    asks once, at start-up.
    """
    if q.device.type != "cuda" or _interpreting():
        return launch_config("decode", q.shape[-1], q.dtype, device_arch(q.device))["ctas_per_sm"]
    from sglang_mepic.kernels import occupancy

    if splits is None:
        splits = torch.ones(q.shape[0], dtype=torch.int32, device=q.device)
    if workspace is None:
        workspace = DecodeWorkspace(q.shape[0], q.shape[1], v_pool.shape[-1], q.device)
    grid, args, kwargs = _decode_launch(q, k_pool, v_pool, req_to_token, req_to_pos, req_idx, seq_lens, q_pos,
                                        cos_sin, rotary_dim, neox, sm_scale, splits, workspace, **options)
    with torch.cuda.device(q.device):
        return occupancy.compiled_ctas_per_sm(_mepic_decode_kernel.warmup(*args, grid=grid, **kwargs),
                                              occupancy.SmLimits.of_device(q.device))


def _decode_launch(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, req_to_token: torch.Tensor,
                   req_to_pos: torch.Tensor, req_idx: torch.Tensor, seq_lens: torch.Tensor, q_pos: torch.Tensor,
                   cos_sin: torch.Tensor, rotary_dim: int, neox: bool, sm_scale: float, splits: torch.Tensor,
                   workspace: "DecodeWorkspace", inv_freq: torch.Tensor | None = None, mscale: float = 1.0,
                   block_n: int | None = None, block_h: int | None = None, num_warps: int | None = None,
                   num_stages: int | None = None, dot_fp32: bool | None = None, k_scale: float = 1.0,
                   v_scale: float = 1.0) -> tuple[tuple[int, int, int], tuple[Any, ...], dict[str, Any]]:
    """(grid, args, kwargs) of the split decode kernel's launch: what `decode` runs and
    `decode_ctas_per_sm` compiles."""
    batch, hq, d = q.shape
    hkv, dv = k_pool.shape[1], v_pool.shape[-1]
    group = hq // hkv
    cfg = launch_config("decode", d, q.dtype, device_arch(q.device))
    block_h, head_tiles = decode_tiles(group, block_h or cfg["block_h"])
    table, freq, mscale, is_table, scaled = _rope_args(cos_sin, inv_freq, mscale)
    partial, lse = workspace.partial, workspace.lse
    # A key's scale multiplies its every score, so it folds into sm_scale; a value's, the output.
    args = (q, k_pool, v_pool, partial, lse, req_to_token, req_to_pos, req_idx, seq_lens, q_pos, splits,
            table, freq, mscale, sm_scale * k_scale, v_scale,
            q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1), v_pool.stride(0), v_pool.stride(1),
            partial.stride(0), partial.stride(1), partial.stride(2), lse.stride(0), lse.stride(1),
            req_to_token.stride(0), req_to_pos.stride(0), table.stride(0))
    kwargs = dict(GROUP=group, HEAD_TILES=head_tiles, BLOCK_H=block_h, D=d, DV=dv, ROT=rotary_dim, NEOX=neox,
                  BLOCK_N=block_n or cfg["block_n"], TABLE=is_table, DOT_FP32=_dot_fp32(q.dtype, dot_fp32),
                  FAST=not _interpreting(), SCALED=scaled, WIDE=_wide_slots(k_pool, v_pool), ZERO_V=_fp8(v_pool),
                  num_warps=num_warps or cfg["num_warps"], num_stages=num_stages or cfg["num_stages"])
    return (batch, hkv * head_tiles, workspace.max_splits), args, kwargs


def extend_tile(group: int, block_m: int) -> tuple[int, int]:
    """(GROUP_P, tokens per program) for a query tile of block_m rows (raised to one token's heads)."""
    group_p = triton.next_power_of_2(group)
    return group_p, max(1, block_m // group_p)


def extend_kv_end(req_to_pos: torch.Tensor, req_idx: torch.Tensor, seq_lens: torch.Tensor, ext_lens: torch.Tensor,
                  positions: torch.Tensor, width: int | None = None) -> torch.Tensor:
    """Where each request's extend loop ends [B] int32, on the device and without a host sync.

    -1 for an identity row (slot j at position j for every slot): the kernel then
    ends each block's loop at the block's last query position + 1. Otherwise the
    last slot whose position some new token of the request can see (0 <= pos <=
    the request's largest new position), + 1. `width` (a host int >= the longest
    request, e.g. from seq_lens_cpu) bounds the slots read; default: the whole row.
    """
    batch = req_idx.shape[0]
    width = req_to_pos.shape[1] if width is None else min(int(width), req_to_pos.shape[1])
    pos = req_to_pos[req_idx.long(), :width].long()
    j = torch.arange(width, device=pos.device)
    inside = j[None, :] < seq_lens.long()[:, None]
    identity = ((pos == j[None, :]) | ~inside).all(1)
    owner = torch.repeat_interleave(torch.arange(batch, device=pos.device), ext_lens.long(),
                                    output_size=positions.shape[0])
    last_q = torch.full((batch,), -1, dtype=torch.long, device=pos.device).scatter_reduce(
        0, owner, positions.long(), "amax")
    visible = inside & (pos >= 0) & (pos <= last_q[:, None])
    last = torch.where(visible, j[None, :] + 1, 0).amax(1)
    return torch.where(identity, -1, last).to(torch.int32)


def extend_splits(programs: int, longest: int, block_n: int, capacity: int) -> int:
    """Split-K for extend: enough programs for two waves when the grid is smaller, each split
    MIN_EXTEND_SPLIT_TILES key tiles at least."""
    if programs >= 2 * capacity:
        return 1
    by_len = max(1, longest // (block_n * MIN_EXTEND_SPLIT_TILES))
    return max(1, min(MAX_KV_SPLITS, by_len, -(-2 * capacity // max(programs, 1))))


def extend(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, req_to_token: torch.Tensor,
           req_to_pos: torch.Tensor, req_idx: torch.Tensor, seq_lens: torch.Tensor, q_start: torch.Tensor,
           ext_lens: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, rotary_dim: int, neox: bool,
           sm_scale: float, max_ext_len: int, out: torch.Tensor | None = None, block_m: int | None = None,
           block_n: int | None = None, inv_freq: torch.Tensor | None = None, mscale: float = 1.0,
           num_warps: int | None = None, num_stages: int | None = None, kv_end: torch.Tensor | None = None,
           max_seq_len: int | None = None, splits: int | None = None, dot_fp32: bool | None = None,
           k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """New tokens of several requests, packed: q [N, Hq, D] with positions [N] -> out [N, Hq, Dv].

    block_m is the query tile's rows: block_m / next_pow2(group) tokens of every
    query head in a kv head's group. `kv_end` [B] int32 (`extend_kv_end`; computed
    here when not given) bounds each program's key loop; `max_seq_len` (a host
    int; default: read from seq_lens, a sync) sizes split-K, which `splits` can force.
    `k_scale`, `v_scale` as in `decode`.
    """
    _check(q, k_pool, cos_sin, rotary_dim, inv_freq)
    tokens, hq, d = q.shape
    hkv, dv = k_pool.shape[1], v_pool.shape[-1]
    group = hq // hkv
    cfg = launch_config("extend", d, q.dtype, device_arch(q.device))
    block_n, num_warps, num_stages = block_n or cfg["block_n"], num_warps or cfg["num_warps"], \
        num_stages or cfg["num_stages"]
    group_p, per_program = extend_tile(group, block_m or cfg["block_m"])
    out = q.new_empty((tokens, hq, dv)) if out is None else out
    if kv_end is None:
        kv_end = extend_kv_end(req_to_pos, req_idx, seq_lens, ext_lens, positions, max_seq_len)
    table, freq, mscale, is_table, scaled = _rope_args(cos_sin, inv_freq, mscale)
    blocks = triton.cdiv(max_ext_len, per_program)
    if splits is None:
        longest = int(seq_lens.max()) if max_seq_len is None else int(max_seq_len)
        splits = extend_splits(req_idx.shape[0] * hkv * blocks, longest, block_n,
                               cfg["ctas_per_sm"] * sm_count(q.device))
    if splits > 1:
        partial = torch.empty((tokens, hq, splits, dv), dtype=torch.float32, device=q.device)
        lse = torch.empty((tokens, hq, splits), dtype=torch.float32, device=q.device)
    else:
        partial, lse = out, out  # unused
    _mepic_extend_kernel[(req_idx.shape[0], hkv * splits, blocks)](
        q, k_pool, v_pool, out, partial, lse, req_to_token, req_to_pos, req_idx, seq_lens, q_start, ext_lens,
        positions, kv_end, table, freq, mscale, sm_scale * k_scale, v_scale,
        q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1), v_pool.stride(0), v_pool.stride(1),
        out.stride(0), out.stride(1), partial.stride(0), partial.stride(1), partial.stride(-2) if splits > 1 else 0,
        lse.stride(0), lse.stride(1), req_to_token.stride(0), req_to_pos.stride(0), table.stride(0),
        GROUP=group, GROUP_P=group_p, D=d, DV=dv, ROT=rotary_dim, NEOX=neox, BLOCK_M=per_program * group_p,
        BLOCK_N=block_n, TABLE=is_table, DOT_FP32=_dot_fp32(q.dtype, dot_fp32), FAST=not _interpreting(),
        SCALED=scaled, WIDE=_wide_slots(k_pool, v_pool), SPLITS=splits, HAS_KV_END=True, ZERO_V=_fp8(v_pool),
        num_warps=num_warps,
        num_stages=num_stages)
    if splits > 1:
        _merge_kernel[(tokens, hq)](
            partial, lse, out, seq_lens, seq_lens, partial.stride(0), partial.stride(1), partial.stride(2),
            lse.stride(0), lse.stride(1), out.stride(0), out.stride(1), DV=dv, MAX_SPLITS=splits, BLOCK_N=block_n,
            FIXED=True)
    return out
