"""Triton kernels under TRITON_INTERPRET=1 against the torch path (sglang_mepic.attention)."""

import math
import os

import pytest
import torch

from sglang_mepic.attention import attend
from sglang_mepic.rope import Rope, cos_sin_cache

assert os.environ.get("TRITON_INTERPRET") == "1", "conftest sets TRITON_INTERPRET before the kernels load"
from sglang_mepic.kernels import attention as kernels  # noqa: E402

MAX_POS = 1024


def make_batch(seq_lens, ext_lens, hq, hkv, d, page_size, dtype, seed, pads=True):
    """A ragged batch over a shared paged pool with shuffled pages, gappy positions and pad slots."""
    g = torch.Generator().manual_seed(seed)
    max_len = max(seq_lens)
    pages_per_row = math.ceil(max_len / page_size)
    num_pages = len(seq_lens) * pages_per_row + 3
    page_order = torch.randperm(num_pages, generator=g)
    k_pool = torch.randn(num_pages * page_size, hkv, d, generator=g).to(dtype)
    v_pool = torch.randn(num_pages * page_size, hkv, d, generator=g).to(dtype)
    rows = len(seq_lens) + 2
    req_to_token = torch.zeros(rows, max_len + 5, dtype=torch.int32)
    req_to_pos = torch.full((rows, max_len + 5), -1, dtype=torch.int32)
    req_idx = torch.randperm(rows, generator=g)[: len(seq_lens)].to(torch.int32)
    for i, (row, n) in enumerate(zip(req_idx.tolist(), seq_lens)):
        pages = page_order[i * pages_per_row:(i + 1) * pages_per_row]
        slots = (pages[:, None] * page_size + torch.arange(page_size)).flatten()[:n]
        req_to_token[row, :n] = slots.to(torch.int32)
        # Increasing positions with gaps (as after skipped pads), then some slots made pads,
        # then the slots shuffled: only positions may matter, never slot order.
        pos = torch.cumsum(torch.randint(1, 3, (n,), generator=g), 0) + 3
        if pads:
            is_pad = torch.rand(n, generator=g) < 0.15
            is_pad[-ext_lens[i]:] = False  # the new tokens are real
            pos = torch.where(is_pad, -1, pos)
        perm = torch.cat([torch.randperm(n - ext_lens[i], generator=g), torch.arange(n - ext_lens[i], n)])
        req_to_token[row, :n] = req_to_token[row, :n][perm]
        req_to_pos[row, :n] = pos[perm].to(torch.int32)
    return k_pool, v_pool, req_to_token, req_to_pos, req_idx


def reference(q, q_pos_per_token, k_pool, v_pool, req_to_token, req_to_pos, req_idx, seq_lens, ext_lens, rope, scale):
    outs, start = [], 0
    for row, n, e in zip(req_idx.tolist(), seq_lens, ext_lens):
        slots = req_to_token[row, :n].long()
        outs.append(attend(q[start:start + e].float(), q_pos_per_token[start:start + e].long(),
                           k_pool[slots].float(), v_pool[slots].float(), req_to_pos[row, :n].long(), rope, scale))
        start += e
    return torch.cat(outs)


CASES = [  # (head dim, query heads, kv heads, page size, neox, rotary dim)
    (64, 4, 4, 16, True, 64),
    (64, 6, 2, 1, True, 64),     # GQA group 3
    (128, 8, 2, 16, False, 128),  # group 4, gptj
    (64, 8, 1, 16, True, 32),    # group 8, partial rotary
]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: 2e-4, torch.float16: 2e-2, torch.bfloat16: 6e-2}


@pytest.mark.parametrize("d, hq, hkv, page_size, neox, rot", CASES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decode_kernel(d, hq, hkv, page_size, neox, rot, dtype):
    seq_lens = [37, 70, 5]
    ext = [1, 1, 1]
    k_pool, v_pool, r2t, r2p, req_idx = make_batch(seq_lens, ext, hq, hkv, d, page_size, dtype, seed=d + hq + rot)
    cache = cos_sin_cache(rot, MAX_POS)
    rope = Rope(cache, rot, d, neox)
    q_pos = torch.stack([r2p[row, n - 1] for row, n in zip(req_idx.tolist(), seq_lens)]).to(torch.int32)
    q = rope.rotate(torch.randn(len(seq_lens), hq, d), q_pos.long()).to(dtype)
    scale = d ** -0.5
    out = kernels.decode(q, k_pool, v_pool, r2t, r2p, req_idx, torch.tensor(seq_lens, dtype=torch.int32), q_pos,
                         cache, rot, neox, scale, block_n=32)
    ref = reference(q, q_pos, k_pool, v_pool, r2t, r2p, req_idx, seq_lens, ext, rope, scale)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("d, hq, hkv, page_size, neox, rot", CASES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_extend_kernel(d, hq, hkv, page_size, neox, rot, dtype):
    seq_lens = [40, 21, 70]
    ext = [40, 5, 17]  # a fresh prompt, a short extend after a prefix, a longer one
    k_pool, v_pool, r2t, r2p, req_idx = make_batch(seq_lens, ext, hq, hkv, d, page_size, dtype, seed=7 * d + rot)
    cache = cos_sin_cache(rot, MAX_POS)
    rope = Rope(cache, rot, d, neox)
    positions = torch.cat([r2p[row, n - e:n] for row, n, e in zip(req_idx.tolist(), seq_lens, ext)])
    q = rope.rotate(torch.randn(sum(ext), hq, d), positions.long()).to(dtype)
    q_start = torch.tensor([0, ext[0], ext[0] + ext[1]], dtype=torch.int32)
    scale = d ** -0.5
    out = kernels.extend(q, k_pool, v_pool, r2t, r2p, req_idx, torch.tensor(seq_lens, dtype=torch.int32), q_start,
                         torch.tensor(ext, dtype=torch.int32), positions, cache, rot, neox, scale, max(ext),
                         block_m=32, block_n=32)
    ref = reference(q, positions, k_pool, v_pool, r2t, r2p, req_idx, seq_lens, ext, rope, scale)
    torch.testing.assert_close(out.float(), ref, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.slow
def test_compiles_for_sm90_and_sm80():
    """Real GPU compilation (PTX + cubin) with no GPU present, in a process without the interpreter."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-m", "sglang_mepic.kernels.aot"], env=env, capture_output=True,
                         text=True, timeout=900)
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    for arch in ("cuda:90", "cuda:80"):
        assert f"{arch} decode" in out.stdout and f"{arch} extend" in out.stdout


@pytest.mark.parametrize("decode", [False, True], ids=["extend", "decode"])
def test_backend_triton_path_equals_torch_path(decode):
    """The backend's GPU glue (argument plumbing into the kernels), run on CPU under the interpreter."""
    from types import SimpleNamespace

    from sglang_mepic.backend import MepicAttnBackend

    d, hq, hkv = 64, 6, 2
    seq_lens, ext = [30, 45], ([1, 1] if decode else [30, 12])
    k_pool, v_pool, r2t, r2p, req_idx = make_batch(seq_lens, ext, hq, hkv, d, 16, torch.float32, seed=11, pads=False)
    rope = Rope(cos_sin_cache(d, MAX_POS), d, d, True)
    backend = MepicAttnBackend.over_pools(r2t, k_pool, v_pool, rope)
    for row, n in zip(req_idx.tolist(), seq_lens):
        backend.positions.assign(row, r2p[row, :n])
    positions = torch.cat([r2p[row, n - e:n] for row, n, e in zip(req_idx.tolist(), seq_lens, ext)]).long()
    q = rope.rotate(torch.randn(sum(ext), hq, d), positions).reshape(sum(ext), -1)
    fb = SimpleNamespace(req_pool_indices=req_idx.long(), seq_lens=torch.tensor(seq_lens), positions=positions,
                         batch_size=len(seq_lens), extend_seq_lens=torch.tensor(ext), extend_seq_lens_cpu=ext,
                         forward_mode=SimpleNamespace(is_decode=lambda: decode, is_extend=lambda: not decode),
                         extend_prefix_lens=torch.tensor([n - e for n, e in zip(seq_lens, ext)]),
                         out_cache_loc=torch.cat([r2t[row, n - e:n]
                                                  for row, n, e in zip(req_idx.tolist(), seq_lens, ext)]))
    backend.init_forward_metadata(fb)
    layer = SimpleNamespace(tp_q_head_num=hq, qk_head_dim=d, v_head_dim=d, layer_id=0, scaling=d ** -0.5,
                            is_cross_attention=False, sliding_window_size=-1)
    torch_out = backend._run(q, layer, fb, ext, decode=decode)
    backend.kernels, backend.cos_sin = kernels, rope.cos_sin_cache
    triton_out = backend._run_triton(q, layer, fb, decode=decode)
    torch.testing.assert_close(triton_out, torch_out, atol=2e-4, rtol=2e-4)
