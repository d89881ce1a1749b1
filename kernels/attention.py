"""Triton kernels for MEPIC attention: paged KV with RoPE fused on K.

Keys in the pool are NoPE. Inside the kernel each key is rotated at its slot's
position (`req_to_pos`), read from the model's own cos/sin cache; queries come in
already rotated. A query at position p attends to slot j iff
`0 <= req_to_pos[row, j] <= p`. Slots are addressed through `req_to_token`, so
any page size works and the order of pages does not matter.

Layouts (SGLang's):
  q        [tokens, Hq, D]        k_pool, v_pool [slots, Hkv, D]
  req_to_token, req_to_pos [rows, max_context]   cos_sin [positions, ROT] (cos | sin)
RoPE: neox pairs (i, i + ROT/2) or gptj pairs (2i, 2i + 1) over the first ROT
dims; dims past ROT pass through (partial rotary).

Numerics: loads are upcast to fp32, rotation and softmax run in fp32 (the
interpreter gets bf16 arithmetic wrong, and so would a careless kernel).
"""

import os

import torch
import triton
import triton.language as tl


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _pair_index(h, HALF: tl.constexpr, NEOX: tl.constexpr):
    if NEOX:
        return h, h + HALF
    else:
        return 2 * h, 2 * h + 1


@triton.jit
def _rotated_keys(K, ReqToToken, ReqToPos, CosSin, row, tok, seq_len, kvh, stride_rt, stride_rp, stride_ks,
                  stride_kh, stride_cs, h, i1, i2, HALF: tl.constexpr):
    """Slots, positions and RoPE'd key halves (fp32) of one block of a request's slots."""
    in_seq = tok < seq_len
    slot = tl.load(ReqToToken + row * stride_rt + tok, mask=in_seq, other=0).to(tl.int64)
    pos = tl.load(ReqToPos + row * stride_rp + tok, mask=in_seq, other=-1)
    real = in_seq & (pos >= 0)
    cpos = tl.where(real, pos, 0).to(tl.int64)
    cos = tl.load(CosSin + cpos[:, None] * stride_cs + h[None, :]).to(tl.float32)
    sin = tl.load(CosSin + cpos[:, None] * stride_cs + HALF + h[None, :]).to(tl.float32)
    k_base = K + slot[:, None] * stride_ks + kvh * stride_kh
    k1 = tl.load(k_base + i1[None, :], mask=real[:, None], other=0.0).to(tl.float32)
    k2 = tl.load(k_base + i2[None, :], mask=real[:, None], other=0.0).to(tl.float32)
    return slot, pos, real, k_base, k1 * cos - k2 * sin, k2 * cos + k1 * sin


@triton.jit
def _softmax_step(s, m_i):
    """Online softmax: new running max, rescale factor for the old sums, and this block's weights."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)  # a block with nothing visible
    return m_new, tl.exp(m_i - m_safe), tl.exp(s - m_safe[:, None])


@triton.jit
def _mepic_decode_kernel(
    Q, K, V, Out, ReqToToken, ReqToPos, ReqIdx, SeqLens, QPos, CosSin, sm_scale,
    stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_ot, stride_oh,
    stride_rt, stride_rp, stride_cs,
    GROUP: tl.constexpr, GROUP_P: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, ROT: tl.constexpr,
    NEOX: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # One program per (request, kv head); it serves the GROUP query heads of that kv head.
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    HALF: tl.constexpr = ROT // 2
    PASS: tl.constexpr = D - ROT
    g = tl.arange(0, GROUP_P)
    gmask = g < GROUP
    h = tl.arange(0, HALF)
    dv = tl.arange(0, DV)
    n = tl.arange(0, BLOCK_N)
    i1, i2 = _pair_index(h, HALF, NEOX)

    row = tl.load(ReqIdx + b).to(tl.int64)
    seq_len = tl.load(SeqLens + b)
    q_pos = tl.load(QPos + b)
    q_base = Q + b * stride_qt + (kvh * GROUP + g)[:, None] * stride_qh
    q1 = tl.load(q_base + i1[None, :], mask=gmask[:, None], other=0.0).to(tl.float32) * sm_scale
    q2 = tl.load(q_base + i2[None, :], mask=gmask[:, None], other=0.0).to(tl.float32) * sm_scale
    if PASS > 0:
        ip = ROT + tl.arange(0, PASS)
        qp = tl.load(q_base + ip[None, :], mask=gmask[:, None], other=0.0).to(tl.float32) * sm_scale

    m_i = tl.full([GROUP_P], -float("inf"), tl.float32)
    l_i = tl.zeros([GROUP_P], tl.float32)
    acc = tl.zeros([GROUP_P, DV], tl.float32)
    for start in range(0, seq_len, BLOCK_N):
        slot, pos, real, k_base, k1r, k2r = _rotated_keys(
            K, ReqToToken, ReqToPos, CosSin, row, start + n, seq_len, kvh, stride_rt, stride_rp, stride_ks,
            stride_kh, stride_cs, h, i1, i2, HALF)
        valid = real & (pos <= q_pos)
        s = tl.sum(q1[:, None, :] * k1r[None, :, :], 2) + tl.sum(q2[:, None, :] * k2r[None, :, :], 2)
        if PASS > 0:
            kp = tl.load(k_base + ip[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
            s += tl.sum(qp[:, None, :] * kp[None, :, :], 2)
        s = tl.where(valid[None, :], s, -float("inf"))
        m_new, alpha, p = _softmax_step(s, m_i)
        v = tl.load(V + slot[:, None] * stride_vs + kvh * stride_vh + dv[None, :],
                    mask=valid[:, None], other=0.0).to(tl.float32)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], 1)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    out = Out + b * stride_ot + (kvh * GROUP + g)[:, None] * stride_oh + dv[None, :]
    tl.store(out, (acc / l_i[:, None]).to(Out.dtype.element_ty), mask=gmask[:, None])


@triton.jit
def _dot(a, b, DOT_FP32: tl.constexpr, OP_TYPE: tl.constexpr):
    # fp32 operands for fp32 models (no tf32) and under the interpreter, whose
    # bf16 arithmetic is wrong; the input dtype otherwise, for tensor cores.
    if DOT_FP32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a.to(OP_TYPE), b.to(OP_TYPE))


@triton.jit
def _mepic_extend_kernel(
    Q, K, V, Out, ReqToToken, ReqToPos, ReqIdx, SeqLens, QStart, ExtLens, Positions, CosSin, sm_scale,
    stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_ot, stride_oh,
    stride_rt, stride_rp, stride_cs,
    GROUP: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, ROT: tl.constexpr, NEOX: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_FP32: tl.constexpr,
):
    # One program per (request, query head, block of BLOCK_M new tokens).
    b = tl.program_id(0)
    qh = tl.program_id(1)
    mblk = tl.program_id(2)
    ext_len = tl.load(ExtLens + b)
    if mblk * BLOCK_M >= ext_len:
        return
    kvh = qh // GROUP
    HALF: tl.constexpr = ROT // 2
    PASS: tl.constexpr = D - ROT
    h = tl.arange(0, HALF)
    dv = tl.arange(0, DV)
    n = tl.arange(0, BLOCK_N)
    i1, i2 = _pair_index(h, HALF, NEOX)

    row = tl.load(ReqIdx + b).to(tl.int64)
    seq_len = tl.load(SeqLens + b)
    q_start = tl.load(QStart + b)
    m = mblk * BLOCK_M + tl.arange(0, BLOCK_M)
    m_valid = m < ext_len
    q_tok = (q_start + m).to(tl.int64)
    q_pos = tl.load(Positions + q_tok, mask=m_valid, other=-1)
    q_base = Q + q_tok[:, None] * stride_qt + qh * stride_qh
    OP: tl.constexpr = Q.dtype.element_ty
    q1 = tl.load(q_base + i1[None, :], mask=m_valid[:, None], other=0.0).to(tl.float32) * sm_scale
    q2 = tl.load(q_base + i2[None, :], mask=m_valid[:, None], other=0.0).to(tl.float32) * sm_scale
    if PASS > 0:
        ip = ROT + tl.arange(0, PASS)
        qp = tl.load(q_base + ip[None, :], mask=m_valid[:, None], other=0.0).to(tl.float32) * sm_scale

    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DV], tl.float32)
    for start in range(0, seq_len, BLOCK_N):
        slot, pos, real, k_base, k1r, k2r = _rotated_keys(
            K, ReqToToken, ReqToPos, CosSin, row, start + n, seq_len, kvh, stride_rt, stride_rp, stride_ks,
            stride_kh, stride_cs, h, i1, i2, HALF)
        s = _dot(q1, tl.trans(k1r), DOT_FP32, OP) + _dot(q2, tl.trans(k2r), DOT_FP32, OP)
        if PASS > 0:
            kp = tl.load(k_base + ip[None, :], mask=real[:, None], other=0.0)
            s += _dot(qp, tl.trans(kp), DOT_FP32, OP)
        visible = real[None, :] & (pos[None, :] <= q_pos[:, None])
        s = tl.where(visible, s, -float("inf"))
        m_new, alpha, p = _softmax_step(s, m_i)
        v = tl.load(V + slot[:, None] * stride_vs + kvh * stride_vh + dv[None, :], mask=real[:, None], other=0.0)
        acc = acc * alpha[:, None] + _dot(p, v, DOT_FP32, OP)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    l_i = tl.where(l_i == 0.0, 1.0, l_i)  # padding rows of the block
    out = Out + q_tok[:, None] * stride_ot + qh * stride_oh + dv[None, :]
    tl.store(out, (acc / l_i[:, None]).to(Out.dtype.element_ty), mask=m_valid[:, None])


def _check(q, k_pool, cos_sin, rotary_dim):
    d = q.shape[-1]
    if rotary_dim % 2 or rotary_dim > d or cos_sin.shape[-1] != rotary_dim:
        raise ValueError(f"rotary_dim {rotary_dim} does not fit head dim {d} / cos_sin {tuple(cos_sin.shape)}")
    half, rest = rotary_dim // 2, d - rotary_dim
    for size in (half, rest or 1, d):
        if size & (size - 1):
            raise ValueError(f"head dim {d} with rotary_dim {rotary_dim}: sizes must be powers of two")
    if q.shape[1] % k_pool.shape[1]:
        raise ValueError(f"{q.shape[1]} query heads are not a multiple of {k_pool.shape[1]} kv heads")


def decode(q, k_pool, v_pool, req_to_token, req_to_pos, req_idx, seq_lens, q_pos, cos_sin, rotary_dim, neox,
           sm_scale, out=None, block_n=64):
    """One new token per request: q [B, Hq, D] -> out [B, Hq, Dv]."""
    _check(q, k_pool, cos_sin, rotary_dim)
    batch, hq, d = q.shape
    hkv, dv = k_pool.shape[1], v_pool.shape[-1]
    group = hq // hkv
    out = q.new_empty((batch, hq, dv)) if out is None else out
    _mepic_decode_kernel[(batch, hkv)](
        q, k_pool, v_pool, out, req_to_token, req_to_pos, req_idx, seq_lens, q_pos, cos_sin, sm_scale,
        q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1), v_pool.stride(0), v_pool.stride(1),
        out.stride(0), out.stride(1), req_to_token.stride(0), req_to_pos.stride(0), cos_sin.stride(0),
        GROUP=group, GROUP_P=triton.next_power_of_2(group), D=d, DV=dv, ROT=rotary_dim, NEOX=neox,
        BLOCK_N=block_n)
    return out


def extend(q, k_pool, v_pool, req_to_token, req_to_pos, req_idx, seq_lens, q_start, ext_lens, positions, cos_sin,
           rotary_dim, neox, sm_scale, max_ext_len, out=None, block_m=32, block_n=64):
    """New tokens of several requests, packed: q [N, Hq, D] with positions [N] -> out [N, Hq, Dv]."""
    _check(q, k_pool, cos_sin, rotary_dim)
    tokens, hq, d = q.shape
    hkv, dv = k_pool.shape[1], v_pool.shape[-1]
    out = q.new_empty((tokens, hq, dv)) if out is None else out
    grid = (req_idx.shape[0], hq, triton.cdiv(max_ext_len, block_m))
    _mepic_extend_kernel[grid](
        q, k_pool, v_pool, out, req_to_token, req_to_pos, req_idx, seq_lens, q_start, ext_lens, positions, cos_sin,
        sm_scale,
        q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1), v_pool.stride(0), v_pool.stride(1),
        out.stride(0), out.stride(1), req_to_token.stride(0), req_to_pos.stride(0), cos_sin.stride(0),
        GROUP=hq // hkv, D=d, DV=dv, ROT=rotary_dim, NEOX=neox, BLOCK_M=block_m, BLOCK_N=block_n,
        DOT_FP32=q.dtype == torch.float32 or _interpreting())
    return out
