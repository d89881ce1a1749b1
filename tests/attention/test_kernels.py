"""Triton kernels under TRITON_INTERPRET=1 against the torch path (sglang_mepic.attention.reference)."""

import math
import os

import pytest
import torch

from sglang_mepic.attention.reference import attend
from sglang_mepic.attention.rope import Rope, cos_sin_cache

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


def forward_batch(req_idx, seq_lens, ext, positions, decode: bool, out_cache_loc=None):
    """The fields of SGLang's ForwardBatch the backend reads, for an extend (or decode) of `ext` new tokens."""
    from types import SimpleNamespace

    return SimpleNamespace(req_pool_indices=req_idx.long(), seq_lens=torch.tensor(seq_lens), positions=positions,
                           batch_size=len(seq_lens), extend_seq_lens=torch.tensor(ext), extend_seq_lens_cpu=ext,
                           forward_mode=SimpleNamespace(is_decode=lambda: decode, is_extend=lambda: not decode),
                           extend_prefix_lens=torch.tensor([n - e for n, e in zip(seq_lens, ext)]),
                           out_cache_loc=out_cache_loc)


CASES = [  # (head dim, query heads, kv heads, page size, neox, rotary dim)
    (64, 4, 4, 16, True, 64),
    (64, 6, 2, 1, True, 64),     # GQA group 3
    (128, 8, 2, 16, False, 128),  # group 4, gptj
    (64, 8, 1, 16, True, 32),    # group 8, partial rotary
]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: 2e-4, torch.float16: 2e-2, torch.bfloat16: 6e-2}
# Where the kernels get cos/sin: the model's table, or computed on chip from its frequencies.
SOURCES = ["table", "chip"]


def first_fast(values, ids=None):
    """The first value runs in `make test-fast`; the rest, marked slow (2-12 s each under the interpreter),
    in make test's second part. A kernel's every combination still runs in `make test`."""
    return [pytest.param(*(v if isinstance(v, tuple) else (v,)), id=None if ids is None else ids(v),
                         marks=() if i == 0 else pytest.mark.slow) for i, v in enumerate(values)]


def rope_kwargs(rope: Rope, source: str) -> dict:
    if source == "table":
        return {}
    inv_freq, mscale = rope.frequencies()
    return dict(inv_freq=inv_freq, mscale=mscale)


@pytest.mark.parametrize("source", first_fast(SOURCES))
@pytest.mark.parametrize("d, hq, hkv, page_size, neox, rot", first_fast(CASES))
@pytest.mark.parametrize("dtype", first_fast(DTYPES, ids=str))
def test_decode_kernel(d, hq, hkv, page_size, neox, rot, dtype, source):
    seq_lens = [37, 70, 5]
    ext = [1, 1, 1]
    k_pool, v_pool, r2t, r2p, req_idx = make_batch(seq_lens, ext, hq, hkv, d, page_size, dtype, seed=d + hq + rot)
    cache = cos_sin_cache(rot, MAX_POS)
    rope = Rope(cache, rot, d, neox)
    q_pos = torch.stack([r2p[row, n - 1] for row, n in zip(req_idx.tolist(), seq_lens)]).to(torch.int32)
    q = rope.rotate(torch.randn(len(seq_lens), hq, d), q_pos.long()).to(dtype)
    scale = d ** -0.5
    out = kernels.decode(q, k_pool, v_pool, r2t, r2p, req_idx, torch.tensor(seq_lens, dtype=torch.int32), q_pos,
                         cache, rot, neox, scale, block_n=32, **rope_kwargs(rope, source))
    ref = reference(q, q_pos, k_pool, v_pool, r2t, r2p, req_idx, seq_lens, ext, rope, scale)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("source", first_fast(SOURCES))
@pytest.mark.parametrize("d, hq, hkv, page_size, neox, rot", first_fast(CASES))
@pytest.mark.parametrize("dtype", first_fast(DTYPES, ids=str))
def test_extend_kernel(d, hq, hkv, page_size, neox, rot, dtype, source):
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
                         block_m=32, block_n=32, **rope_kwargs(rope, source))
    ref = reference(q, positions, k_pool, v_pool, r2t, r2p, req_idx, seq_lens, ext, rope, scale)
    torch.testing.assert_close(out.float(), ref, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("splits", [None, pytest.param([1, 1, 1, 1, 1], marks=pytest.mark.slow),
                                    pytest.param([1, 2, 3, 16, 7], marks=pytest.mark.slow), [16, 16, 16, 16, 16]],
                         ids=["heuristic", "one", "mixed", "many"])
def test_decode_split_counts(splits):
    """Split decode merges to the same attention whatever the split count, tails and empty splits included.

    GQA group 7 (14 query heads on 2), contexts that are not whole tiles, and
    more splits than a short context has tiles.
    """
    d, hq, hkv, rot = 64, 14, 2, 64
    seq_lens = [1, 31, 33, 517, 300]
    ext = [1] * len(seq_lens)
    k_pool, v_pool, r2t, r2p, req_idx = make_batch(seq_lens, ext, hq, hkv, d, 16, torch.float32, seed=5)
    cache = cos_sin_cache(rot, MAX_POS)
    rope = Rope(cache, rot, d, True)
    q_pos = torch.stack([r2p[row, n - 1] for row, n in zip(req_idx.tolist(), seq_lens)]).to(torch.int32)
    q = rope.rotate(torch.randn(len(seq_lens), hq, d), q_pos.long())
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    chosen = None if splits is None else torch.tensor(splits, dtype=torch.int32)
    out = kernels.decode(q, k_pool, v_pool, r2t, r2p, req_idx, lens, q_pos, cache, rot, True, d ** -0.5,
                         block_n=16, splits=chosen, **rope_kwargs(rope, "chip"))
    ref = reference(q, q_pos, k_pool, v_pool, r2t, r2p, req_idx, seq_lens, ext, rope, d ** -0.5)
    torch.testing.assert_close(out, ref, atol=2e-4, rtol=2e-4)


def test_num_kv_splits():
    lens = torch.tensor([10, 256, 4096, 32768, 40000])
    one_request = kernels.num_kv_splits(lens[3:4], programs_per_split=8, sm_count=132, ctas_per_sm=3)
    assert one_request.tolist() == [kernels.whole_wave_splits(8, 3 * 132)] and one_request.item() >= 12
    mixed = kernels.num_kv_splits(lens, programs_per_split=5 * 8, sm_count=132).tolist()
    assert mixed == sorted(mixed) and mixed[0] == mixed[1] == 1 and 1 < mixed[-1] <= kernels.MAX_KV_SPLITS
    # Never a split shorter than MIN_SPLIT_LEN keys, and a batch that fills whole waves gets no splits at all.
    assert kernels.num_kv_splits(torch.tensor([600]), 1, 132).tolist() == [3]
    assert kernels.num_kv_splits(torch.full((66,), 8192), 66 * 6, 132, ctas_per_sm=3).tolist() == [1] * 66
    buf = torch.zeros(8, dtype=torch.int32)
    written = kernels.num_kv_splits(lens, 8, 132, out=buf)
    assert written.data_ptr() == buf.data_ptr() and buf[5:].tolist() == [0, 0, 0]


def test_decode_splits_fill_whole_waves():
    """Split counts for a capacity of 4 CTAs per SM on 132 SMs (the previous 32-key decode source on the H100
    run's Triton; the 64-key kernel fits 3): B=8 of Llama-3-8B (64 programs a split) fills about one wave,
    B=64 (512) takes 1 split (0.97 wave), not 2."""
    cap = 4 * 132
    for programs, splits in ((8 * 8, 8), (64 * 8, 1)):
        got = kernels.whole_wave_splits(programs, cap)
        waves = programs * got / cap
        assert got == splits and waves / math.ceil(waves) > 0.85


def test_decode_splits_match_the_h200_sweep():
    """At 3 CTAs per SM on 132 SMs (the 64-key decode kernel on an H200), the counts that measured fastest
    or within 2% of it (eval/results/gpu/h200.md): batch 1 -> 16, batch 8 -> 6, batch 64 -> 3 (2 splits,
    what the former rule picked, ran 9% slower at 32k context)."""
    cap = 3 * 132
    assert [kernels.whole_wave_splits(b * 8, cap) for b in (1, 8, 64)] == [16, 6, 3]
    # Beyond the sweep the rule's wave arithmetic, not a measurement: batch 96 fills 1.94 waves and takes
    # no split; 128 (2.59 waves) takes 3 (7.76 waves), as batch 64 (1.29) does.
    assert [kernels.whole_wave_splits(b * 8, cap) for b in (96, 128)] == [1, 3]


def test_occupancy_arithmetic_registers_to_splits():
    """registers -> CTAs per SM -> splits: what the backend applies to the decode kernel compiled on the GPU.
    The previous decode source at Triton 3.7.1's 138 registers fits 3 CTAs per SM on an H100, at the H100
    run's Triton 3.6.0's 109 registers 4: B=8 at 32k then takes 8 splits, not the 6 a table of 3 gave."""
    from types import SimpleNamespace

    from sglang_mepic.kernels import occupancy

    h100, a100 = occupancy.SmLimits.of_arch(90), occupancy.SmLimits.of_arch(80)
    assert occupancy.ctas_per_sm(138, 4, 24704, h100) == 3  # registers: 144 x 128 threads a CTA
    assert occupancy.ctas_per_sm(109, 4, 24704, h100) == 4
    assert occupancy.ctas_per_sm(86, 4, 38016, h100) == 5  # 88 x 32 = 2,816 a warp: 23 warps
    assert occupancy.ctas_per_sm(128, 8, 21760, a100) == 2
    assert occupancy.ctas_per_sm(32, 4, 100 * 1024, h100) == 2  # shared memory (1 KB reserved a CTA)
    assert occupancy.ctas_per_sm(16, 16, 0, h100) == 4  # threads: 2,048 / 512
    assert occupancy.ctas_per_sm(16, 1, 0, h100) == 32  # CTA slots
    assert occupancy.ctas_per_sm(255, 8, 0, h100) == 1 and occupancy.ctas_per_sm(255, 16, 0, h100) == 0
    lens = torch.full((8,), 32768)
    programs = kernels.decode_programs_per_split(8, 32, 8)
    for regs, want in ((138, 6), (109, 8)):
        compiled = SimpleNamespace(n_regs=regs, metadata=SimpleNamespace(num_warps=4, shared=24704),
                                   _init_handles=lambda: None)
        ctas = occupancy.compiled_ctas_per_sm(compiled, h100)
        assert kernels.num_kv_splits(lens, programs, 132, ctas_per_sm=ctas).tolist() == [want] * 8
    # Without a compiled kernel (CPU, the interpreter) the static figure stands in.
    q = torch.empty(1, 32, 128, dtype=torch.bfloat16)
    assert kernels.decode_ctas_per_sm(q, None, None, None, None, None, None, None, None, 128, True, 1.0) == \
        kernels.DECODE_CTAS_PER_SM[90]


def test_backend_sizes_decode_splits_from_the_kernels_capacity(monkeypatch):
    """The backend asks the kernels for the decode kernel's CTAs per SM once, when it takes them up, and sizes
    every decode's splits from that figure (eager, graph and unprepared paths alike)."""
    from types import SimpleNamespace

    from sglang_mepic.attention.backend import MepicAttnBackend

    asked = []
    monkeypatch.setattr(kernels, "decode_ctas_per_sm", lambda *args, **kwargs: asked.append(args) or 1)
    d, hq, hkv = 64, 16, 16  # 32 programs a split: 4 splits fill 132 CTAs, 16 would fill 4 x 132
    seq_lens = [1100, 600]
    k_pool, v_pool, r2t, r2p, req_idx = make_batch(seq_lens, [1, 1], hq, hkv, d, 16, torch.float32, seed=71)
    rope = Rope(cos_sin_cache(d, MAX_POS), d, d, True)
    backend = MepicAttnBackend.over_pools(r2t, k_pool, v_pool, rope, q_heads=hq)
    backend._use_kernels(kernels)
    assert backend.decode_ctas_per_sm == 1 and len(asked) == 1 and asked[0][0].shape == (1, hq, d)
    fb = SimpleNamespace(req_pool_indices=req_idx.long(), seq_lens=torch.tensor(seq_lens),
                         positions=torch.tensor(seq_lens) - 1, batch_size=2,
                         forward_mode=SimpleNamespace(is_decode=lambda: True, is_extend=lambda: False))
    backend.init_forward_metadata(fb)
    programs = kernels.decode_programs_per_split(2, hq, hkv)
    want = kernels.num_kv_splits(torch.tensor(seq_lens), programs, backend.sm_count, ctas_per_sm=1)
    assert backend._splits.tolist() == want.tolist() != kernels.num_kv_splits(
        torch.tensor(seq_lens), programs, backend.sm_count, ctas_per_sm=4).tolist()
    assert len(asked) == 1


@pytest.mark.parametrize("source", first_fast(SOURCES))
@pytest.mark.parametrize("dtype", first_fast([torch.float32, torch.bfloat16], ids=str))
def test_extend_prefix_on_both_sides_of_the_queries(dtype, source):
    """Reused slots whose positions lie before, among and after the new tokens' positions.

    Whole tiles after the block's last query position are skipped by the
    kernel; tiles that straddle it are masked slot by slot. GQA group 7, tiles of
    16 slots against a 50-slot prefix, several query blocks per request.
    """
    d, hq, hkv, rot = 64, 14, 2, 32
    ext = [37, 9]
    prefix = [50, 70]
    seq_lens = [p + e for p, e in zip(prefix, ext)]
    k_pool, v_pool, r2t, r2p, req_idx = make_batch(seq_lens, ext, hq, hkv, d, 16, dtype, seed=3, pads=False)
    g = torch.Generator().manual_seed(9)
    for row, p, e in zip(req_idx.tolist(), prefix, ext):
        new = torch.arange(100, 100 + 3 * e, 3)  # the new tokens: ascending, with gaps between them
        # Prefix positions from 0 to far past the last new token, some equal to new tokens' positions;
        # sorted halves so that whole tiles lie after the queries, then a few pads.
        before = torch.randint(0, 110, (p // 2,), generator=g).sort().values
        after = torch.randint(95, 400, (p - p // 2,), generator=g).sort().values
        pos = torch.cat([before, after])
        pos[torch.rand(p, generator=g) < 0.1] = -1
        r2p[row, :p] = pos.to(torch.int32)
        r2p[row, p:p + e] = new.to(torch.int32)
    cache = cos_sin_cache(rot, MAX_POS)
    rope = Rope(cache, rot, d, False)
    positions = torch.cat([r2p[row, n - e:n] for row, n, e in zip(req_idx.tolist(), seq_lens, ext)])
    q = rope.rotate(torch.randn(sum(ext), hq, d), positions.long()).to(dtype)
    q_start = torch.tensor([0, ext[0]], dtype=torch.int32)
    out = kernels.extend(q, k_pool, v_pool, r2t, r2p, req_idx, torch.tensor(seq_lens, dtype=torch.int32), q_start,
                         torch.tensor(ext, dtype=torch.int32), positions, cache, rot, False, d ** -0.5, max(ext),
                         block_m=32, block_n=16, **rope_kwargs(rope, source))
    ref = reference(q, positions, k_pool, v_pool, r2t, r2p, req_idx, seq_lens, ext, rope, d ** -0.5)
    torch.testing.assert_close(out.float(), ref, atol=TOL[dtype], rtol=TOL[dtype])


def test_gpu_kernels_refuse_what_they_cannot_run():
    with pytest.raises(ValueError, match="powers of two of at least 16"):
        kernels.check_shapes(head_dim=32, rotary_dim=16, q_heads=4, kv_heads=2)  # half of 8
    with pytest.raises(ValueError, match="powers of two"):
        kernels.check_shapes(head_dim=96, rotary_dim=96, q_heads=4, kv_heads=2)
    with pytest.raises(ValueError, match="not a multiple"):
        kernels.check_shapes(head_dim=64, rotary_dim=64, q_heads=6, kv_heads=4)
    kernels.check_shapes(head_dim=128, rotary_dim=64, q_heads=28, kv_heads=4)  # Qwen-like group 7, partial rotary


def test_rope_frequencies_reproduce_the_cache_or_are_refused():
    rope = Rope(cos_sin_cache(64, 4096, base=500000.0), 64, 64, True)
    inv_freq, mscale = rope.frequencies()
    angles = torch.arange(4096, dtype=torch.float32)[:, None] * inv_freq[None, :]
    assert mscale == 1.0
    torch.testing.assert_close(torch.cat([angles.cos(), angles.sin()], -1), rope.cos_sin_cache, atol=1e-6, rtol=0)
    scaled = Rope(cos_sin_cache(64, 4096) * 1.25, 64, 64, True)  # YaRN-like attention scaling
    assert scaled.frequencies()[1] == 1.25
    # Linear scaling by 3 divides positions before the product: not of the form cos(p * w), so the table stays.
    t = torch.arange(4096, dtype=torch.float32) / 3.0
    inv = 1.0 / (10000.0 ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64))
    freqs = torch.outer(t, inv)
    linear = Rope(torch.cat([freqs.cos(), freqs.sin()], -1), 64, 64, True)
    assert linear.frequencies() is None


def test_backend_computes_cos_sin_on_chip_unless_told_or_unable(monkeypatch):
    """The backend's default is on-chip cos/sin (faster than the table in 8 of 10 cases on an H100,
    eval/results/gpu/after.md) where the cache is cos(p * inv_freq) * mscale; MEPIC_ROPE_TABLE=1 forces the
    table, and a cache of another form (linear scaling) keeps it."""
    from sglang_mepic.attention.backend import MepicAttnBackend

    assert kernels.DEFAULT_TABLE_ROPE is False
    d = 64
    k_pool = v_pool = torch.zeros(16, 1, d)
    r2t = torch.zeros(1, 16, dtype=torch.int32)
    t = torch.arange(MAX_POS, dtype=torch.float32) / 3.0
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    linear = Rope(torch.cat([torch.outer(t, inv).cos(), torch.outer(t, inv).sin()], -1), d, d, True)
    plain = Rope(cos_sin_cache(d, MAX_POS), d, d, True)
    monkeypatch.delenv("MEPIC_ROPE_TABLE", raising=False)
    for rope, table in ((plain, False), (linear, True)):
        backend = MepicAttnBackend.over_pools(r2t, k_pool, v_pool, rope)
        backend._use_kernels(kernels)
        assert ("inv_freq" not in backend.rope_args) == table
    monkeypatch.setenv("MEPIC_ROPE_TABLE", "1")
    from sglang_mepic import env

    backend = MepicAttnBackend.over_pools(r2t, k_pool, v_pool, plain, settings=env.reload())
    backend._use_kernels(kernels)
    assert backend.rope_args == {}


@pytest.mark.slow
def test_compiles_for_sm90_and_sm80():
    """Real GPU compilation (PTX + cubin) with no GPU present, in a process without the interpreter: no spills."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-m", "sglang_mepic.kernels.aot"], env=env, capture_output=True,
                         text=True, timeout=900)
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    for arch in ("sm_90", "sm_80"):
        for kernel in ("decode", "extend", "merge"):
            assert f"| {arch} | {kernel} |" in out.stdout
    for fp8 in ("fp8_e4m3", "fp8_e5m2"):  # an fp8 pool (issue 73): sm_90 only, Triton has no fp8 before sm_89
        for kernel in ("decode", "extend"):
            assert f"| sm_90 | {kernel} | Llama-3-8B, KV {fp8} | bf16 | chip |" in out.stdout
        assert f"| sm_80 | decode | Llama-3-8B, KV {fp8}" not in out.stdout
    assert "no spills, all compiled" in out.stdout


@pytest.mark.parametrize("decode", [False, True], ids=["extend", "decode"])
def test_backend_triton_path_equals_torch_path(decode):
    """The backend's GPU glue (argument plumbing into the kernels), run on CPU under the interpreter."""
    from types import SimpleNamespace

    from sglang_mepic.attention.backend import MepicAttnBackend

    d, hq, hkv = 64, 6, 2
    seq_lens, ext = [30, 45], ([1, 1] if decode else [30, 12])
    k_pool, v_pool, r2t, r2p, req_idx = make_batch(seq_lens, ext, hq, hkv, d, 16, torch.float32, seed=11, pads=False)
    rope = Rope(cos_sin_cache(d, MAX_POS), d, d, True)
    backend = MepicAttnBackend.over_pools(r2t, k_pool, v_pool, rope)
    for row, n in zip(req_idx.tolist(), seq_lens):
        backend.positions.assign(row, r2p[row, :n])
    positions = torch.cat([r2p[row, n - e:n] for row, n, e in zip(req_idx.tolist(), seq_lens, ext)]).long()
    q = rope.rotate(torch.randn(sum(ext), hq, d), positions).reshape(sum(ext), -1)
    fb = forward_batch(req_idx, seq_lens, ext, positions, decode,
                       torch.cat([r2t[row, n - e:n] for row, n, e in zip(req_idx.tolist(), seq_lens, ext)]))
    backend.init_forward_metadata(fb)
    layer = SimpleNamespace(tp_q_head_num=hq, qk_head_dim=d, v_head_dim=d, layer_id=0, scaling=d ** -0.5,
                            is_cross_attention=False, sliding_window_size=-1)
    torch_out = backend._run(q, layer, fb, ext, decode=decode)
    backend._use_kernels(kernels)
    triton_out = backend._run_triton(q, layer, fb, decode=decode)
    torch.testing.assert_close(triton_out, torch_out, atol=2e-4, rtol=2e-4)


def test_backend_decode_graph_hooks_use_fixed_buffers():
    """The CUDA-graph hooks, on CPU under the interpreter: capture, then a replay of another batch.

    Replay writes the planned row's decode position into the runner's positions
    buffer in place, recomputes the split counts into the fixed buffer, and the
    captured launch (same tensors) gives the attention of the new batch.
    """
    from types import SimpleNamespace

    from sglang_mepic.attention.backend import MepicAttnBackend

    d, hq, hkv = 64, 6, 2
    seq_lens = [30, 300]
    k_pool, v_pool, r2t, r2p, req_idx = make_batch(seq_lens, [1, 1], hq, hkv, d, 16, torch.float32, seed=13)
    rope = Rope(cos_sin_cache(d, MAX_POS), d, d, True)
    backend = MepicAttnBackend.over_pools(r2t, k_pool, v_pool, rope, q_heads=hq)
    backend._use_kernels(kernels)  # the GPU path, which a CPU backend does not take by itself
    planned, plain = req_idx.tolist()
    # Row 0 has a plan for its prompt (gaps, pads); its new token comes after its last real position.
    # Row 1 is plain.
    backend.positions.assign(planned, r2p[planned, :seq_lens[0] - 1])
    backend.positions.req_to_pos[plain, :seq_lens[1] - 1] = torch.arange(seq_lens[1] - 1, dtype=torch.int32)
    expected_pos = int(r2p[planned, :seq_lens[0] - 1].max()) + 1

    max_bs = 4
    backend.init_cuda_graph_state(max_bs, max_bs)
    buffers = SimpleNamespace(req_pool_indices=torch.zeros(max_bs, dtype=torch.int64),
                              seq_lens=torch.full((max_bs,), backend.get_cuda_graph_seq_len_fill_value()),
                              positions=torch.zeros(max_bs, dtype=torch.int64))
    decode = SimpleNamespace(is_decode=lambda: True, is_extend=lambda: False)
    layer = SimpleNamespace(tp_q_head_num=hq, qk_head_dim=d, v_head_dim=d, layer_id=0, scaling=d ** -0.5,
                            is_cross_attention=False, sliding_window_size=-1)
    captured = SimpleNamespace(batch_size=max_bs, forward_mode=decode, **vars(buffers))
    q = torch.randn(max_bs, hq * d)
    backend.init_forward_metadata_out_graph(captured, in_capture=True)
    backend.init_forward_metadata_in_graph(captured)
    backend.forward_decode(q, None, None, layer, captured, save_kv_cache=False)
    splits_at, workspace_at = backend.graph.splits.data_ptr(), backend.graph.workspace.partial.data_ptr()

    # Replay: the runner copies the batch into its buffers (positions: SGLang's seq_len - 1), pads the rest.
    buffers.req_pool_indices[:2] = req_idx.long()
    buffers.seq_lens[:2] = torch.tensor(seq_lens)
    buffers.positions[:2] = torch.tensor(seq_lens) - 1
    view = SimpleNamespace(batch_size=max_bs, num_padding=2, forward_mode=decode, **vars(buffers))
    backend.init_forward_metadata_out_graph(view)
    assert buffers.positions[:2].tolist() == [expected_pos, seq_lens[1] - 1]
    backend.init_forward_metadata_in_graph(view)
    out = backend.forward_decode(q, None, None, layer, view, save_kv_cache=False).view(max_bs, hq, d)
    assert (backend.graph.splits.data_ptr(), backend.graph.workspace.partial.data_ptr()) == (splits_at, workspace_at)
    assert backend.graph.splits[:2].tolist() == kernels.num_kv_splits(
        torch.tensor(seq_lens), 4 * hkv, backend.sm_count).tolist()
    ref = reference(q.view(max_bs, hq, d)[:2], buffers.positions[:2], k_pool, v_pool, r2t,
                    backend.positions.req_to_pos, req_idx, seq_lens, [1, 1], rope, d ** -0.5)
    torch.testing.assert_close(out[:2], ref, atol=2e-4, rtol=2e-4)
    # An eager forward afterwards does not use the graph's buffers.
    backend.init_forward_metadata(SimpleNamespace(
        req_pool_indices=req_idx.long(), seq_lens=torch.tensor(seq_lens), positions=buffers.positions[:2].clone(),
        forward_mode=decode, batch_size=2))
    assert not backend.graph.active


def _extend_view(rows, seq_lens, prefix, ext, positions, **extra):
    """An extend ForwardBatch as the backend reads it (device tensors and their host mirrors)."""
    from types import SimpleNamespace

    return SimpleNamespace(
        forward_mode=SimpleNamespace(name="EXTEND", is_decode=lambda: False, is_extend=lambda: True),
        batch_size=len(seq_lens), req_pool_indices=torch.as_tensor(rows).long(),
        req_pool_indices_cpu=torch.as_tensor(rows).long(), seq_lens=torch.tensor(seq_lens),
        seq_lens_cpu=torch.tensor(seq_lens), extend_prefix_lens=torch.tensor(prefix), extend_prefix_lens_cpu=list(prefix),
        extend_seq_lens=torch.tensor(ext), extend_seq_lens_cpu=list(ext), positions=positions, **extra)


def test_backend_prefill_graph_hooks_place_planned_positions_in_the_static_buffer():
    """SGLang's breakable prefill graphs (issue 69), on CPU under the interpreter, with a static batch as the
    runner builds it: the runner copies SGLang's positions (slot indices) into its static buffer before any
    hook runs, the captured segments rotate queries with that buffer, and attention runs at each break on
    the static batch (positions sliced to the real tokens).

    Capture reads and writes nothing of the position map (its dummy rows are rows live requests own) and
    keeps the static buffer; a replay writes a planned row's positions into that buffer in place, leaves
    its padding and an unplanned batch's positions alone, and the break's attention is the eager forward's.
    """
    from types import SimpleNamespace

    from sglang_mepic.attention.backend import MepicAttnBackend

    d, hq, hkv = 64, 6, 2
    seq_lens, prefix = [40, 30], [16, 0]  # a planned row extending after its prefix, a plain prompt
    ext = [n - p for n, p in zip(seq_lens, prefix)]
    k_pool, v_pool, r2t, r2p, req_idx = make_batch(seq_lens, ext, hq, hkv, d, 16, torch.float32, seed=23)
    rope = Rope(cos_sin_cache(d, MAX_POS), d, d, True)
    backend = MepicAttnBackend.over_pools(r2t, k_pool, v_pool, rope, q_heads=hq)
    backend._use_kernels(kernels)
    planned, plain = req_idx.tolist()
    backend.positions.assign(planned, r2p[planned, :seq_lens[0]])
    for row in (0, 1):  # the capture's dummy rows 0 and 1: live requests own the planned ones
        if row not in (planned, plain):
            backend.positions.assign(row, torch.arange(5, 35))
    layer = SimpleNamespace(tp_q_head_num=hq, qk_head_dim=d, v_head_dim=d, layer_id=0, scaling=d ** -0.5,
                            is_cross_attention=False, sliding_window_size=-1)
    # Capture of a 64-token bucket: two dummy requests over the runner's static buffers.
    static_positions = torch.full((64,), 777, dtype=torch.int64)
    static_positions[:64] = torch.cat([torch.arange(40), torch.arange(24)])
    capture = _extend_view([0, 1], [40, 24], [0, 0], [40, 24], static_positions[:64])
    before = (backend.positions.req_to_pos.clone(), backend.positions.planned.clone(),
              set(backend.positions._planned_rows))
    meta = backend.init_forward_metadata_for_breakable_cuda_graph_capture(capture)
    assert meta.num_tokens == 64
    assert torch.equal(backend.positions.req_to_pos, before[0]) and torch.equal(backend.positions.planned, before[1])
    assert backend.positions._planned_rows == before[2]
    assert capture.positions.data_ptr() == static_positions.data_ptr()  # the address the graph records
    assert static_positions.tolist() == list(range(40)) + list(range(24))
    assert backend._kv_end.tolist() == [-1, -1]  # identity rows, whatever the map holds for rows 0 and 1
    # The capture's forward (warm-up, capture) runs; its output is a dummy's, finite.
    q = rope.rotate(torch.randn(64, hq, d), static_positions).reshape(64, -1)
    assert torch.isfinite(backend.forward_extend(q, None, None, layer, capture, save_kv_cache=False)).all()

    # Replay of a batch with a planned row: the runner has filled the buffer with SGLang's positions.
    n = sum(ext)
    sglang = torch.cat([torch.arange(p, s) for p, s in zip(prefix, seq_lens)])
    static_positions.fill_(777)
    static_positions[:n] = sglang
    live = _extend_view(req_idx, seq_lens, prefix, ext, sglang.clone())
    static = _extend_view(req_idx, seq_lens, prefix, ext, static_positions[:64])
    assert backend.can_run_prefill_cuda_graph(live)
    backend.prepare_forward_metadata_for_breakable_cuda_graph_replay(meta, live, static_forward_batch=static)
    expected = torch.cat([r2p[planned, prefix[0]:seq_lens[0]].long(), torch.arange(seq_lens[1])])
    assert static_positions[:n].tolist() == expected.tolist()  # what the captured segments rotate queries with
    assert static_positions[n:].tolist() == [777] * (64 - n)  # the bucket's padding: untouched
    assert live.positions.tolist() == expected.tolist()
    assert torch.equal(backend._kv_end, kernels.extend_kv_end(backend.positions.req_to_pos, req_idx.long(),
                                                              live.seq_lens, live.extend_seq_lens, expected))
    q = rope.rotate(torch.randn(n, hq, d), expected).reshape(n, -1)
    at_break = _extend_view(req_idx, seq_lens, prefix, ext, static_positions[:n])  # attention_input_scope's slice
    out = backend.forward_extend(q, None, None, layer, at_break, save_kv_cache=False)
    ref = reference(q.view(n, hq, d), expected, k_pool, v_pool, r2t, backend.positions.req_to_pos, req_idx,
                    seq_lens, ext, rope, d ** -0.5)
    torch.testing.assert_close(out.view(n, hq, d), ref, atol=2e-4, rtol=2e-4)
    eager = _extend_view(req_idx, seq_lens, prefix, ext, sglang.clone())
    backend.init_forward_metadata(eager)
    assert torch.equal(backend.forward_extend(q, None, None, layer, eager, save_kv_cache=False), out)

    # Replay of a batch without planned rows: SGLang's positions, already in the buffer, stay as they are.
    static_positions.fill_(777)
    static_positions[:30] = torch.arange(30)
    live = _extend_view([plain], [30], [0], [30], torch.arange(30))
    given = live.positions
    backend.prepare_forward_metadata_for_breakable_cuda_graph_replay(
        meta, live, static_forward_batch=_extend_view([plain], [30], [0], [30], static_positions[:64]))
    assert live.positions is given and static_positions[:30].tolist() == list(range(30))
    assert static_positions[30:].tolist() == [777] * 34 and backend._kv_end.tolist() == [-1]


def test_backend_declines_prefill_graphs_it_cannot_serve(tmp_path):
    """Without the captured-metadata hooks (a runner that re-inits only the live batch) a batch with a planned
    row would replay SGLang's positions: it goes eager, told from the host mirror. With them every plain
    extend or mixed batch qualifies; a decode, a batch without host figures and the torch path never do."""
    from types import SimpleNamespace

    from sglang_mepic.attention.backend import MepicAttnBackend

    d, hq, hkv = 64, 6, 2
    k_pool, v_pool, r2t, r2p, req_idx = make_batch([30, 20], [30, 20], hq, hkv, d, 16, torch.float32, seed=29)
    rope = Rope(cos_sin_cache(d, MAX_POS), d, d, True)
    backend = MepicAttnBackend.over_pools(r2t, k_pool, v_pool, rope, q_heads=hq)
    assert not backend.can_run_prefill_cuda_graph(_extend_view([0], [4], [0], [4], torch.arange(4)))  # torch path
    backend._use_kernels(kernels)
    planned, plain = req_idx.tolist()

    def batch(rows, host_rows=True, **extra):
        fb = _extend_view(rows, [4] * len(rows), [0] * len(rows), [4] * len(rows), torch.arange(4 * len(rows)))
        if not host_rows:
            fb.req_pool_indices_cpu = None
        vars(fb).update(extra)
        return fb

    assert backend.can_run_prefill_cuda_graph(batch([planned, plain], host_rows=False))  # no plan anywhere yet
    backend.positions.assign(planned, r2p[planned, :30])
    assert not backend.can_run_prefill_cuda_graph(batch([planned, plain]))
    assert backend.can_run_prefill_cuda_graph(batch([plain]))
    assert not backend.can_run_prefill_cuda_graph(batch([plain], host_rows=False))  # cannot tell: eager
    backend.init_forward_metadata_for_breakable_cuda_graph_capture(batch([0]))
    assert backend.can_run_prefill_cuda_graph(batch([planned, plain], host_rows=False))
    mixed = SimpleNamespace(name="MIXED", is_decode=lambda: False, is_extend=lambda: True)
    assert backend.can_run_prefill_cuda_graph(batch([planned], forward_mode=mixed))
    decode = SimpleNamespace(name="DECODE", is_decode=lambda: True, is_extend=lambda: False)
    assert not backend.can_run_prefill_cuda_graph(batch([plain], forward_mode=decode))
    assert not backend.can_run_prefill_cuda_graph(batch([plain], extend_seq_lens_cpu=None))
    switch = tmp_path / "eager"  # the evaluation's switch (eval/gpu/e2e: graphs vs eager on one server)
    backend._eager_switch = str(switch)
    assert backend.can_run_prefill_cuda_graph(batch([plain]))
    switch.touch()
    assert not backend.can_run_prefill_cuda_graph(batch([plain]))
    with pytest.raises(NotImplementedError, match="breakable"):  # a full prefill graph's capture
        backend.init_forward_metadata_out_graph(batch([0]), in_capture=True)


@pytest.fixture
def bf16_dots(monkeypatch):
    """Triton 3.7's interpreter multiplies bf16 operands as their raw uint16 storage (its create_dot widens
    only fp8): widen bf16 to fp32 first, exactly, so the kernels' bf16 tensor-core path runs as on a GPU
    (bf16 operands, fp32 accumulation)."""
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    original = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        def widen(x):
            if x.dtype == tl.bfloat16:
                return interpreter.TensorHandle((x.data.astype(np.uint32) << 16).view(np.float32), tl.float32)
            return x
        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    import triton.language as tl
    monkeypatch.setattr(builder, "create_dot", create_dot)


@pytest.mark.parametrize("kind", ["decode", "extend"])
@pytest.mark.parametrize("dtype", first_fast([torch.float16, torch.bfloat16], ids=str))
def test_model_dtype_dot_path(kind, dtype, bf16_dots):
    """The tensor-core path: dots in the model's dtype (`dot_fp32=False`), not the ieee fp32 the interpreter
    otherwise takes, for decode and (split) extend."""
    d, hq, hkv, rot = 64, 8, 2, 64
    seq_lens = [37, 70, 5] if kind == "decode" else [40, 21, 70]
    ext = [1, 1, 1] if kind == "decode" else [40, 5, 17]
    k_pool, v_pool, r2t, r2p, req_idx = make_batch(seq_lens, ext, hq, hkv, d, 16, dtype, seed=21)
    cache = cos_sin_cache(rot, MAX_POS)
    rope = Rope(cache, rot, d, True)
    positions = torch.cat([r2p[row, n - e:n] for row, n, e in zip(req_idx.tolist(), seq_lens, ext)])
    q = rope.rotate(torch.randn(sum(ext), hq, d), positions.long()).to(dtype)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    if kind == "decode":
        out = kernels.decode(q, k_pool, v_pool, r2t, r2p, req_idx, lens, positions, cache, rot, True, d ** -0.5,
                             dot_fp32=False)
    else:
        q_start = torch.tensor([0, ext[0], ext[0] + ext[1]], dtype=torch.int32)
        out = kernels.extend(q, k_pool, v_pool, r2t, r2p, req_idx, lens, q_start, torch.tensor(ext, dtype=torch.int32),
                             positions, cache, rot, True, d ** -0.5, max(ext), block_m=32, block_n=16, splits=2,
                             dot_fp32=False)
    ref = reference(q, positions, k_pool, v_pool, r2t, r2p, req_idx, seq_lens, ext, rope, d ** -0.5)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("base", [131072, 1 << 20], ids=["128k", "1M"])
@pytest.mark.parametrize("kind", ["decode", "extend"])
def test_on_chip_rope_at_large_positions(kind, base):
    """The on-chip cos/sin (one range reduction) against the exact cos/sin of the same fp32 angles, at
    positions near 128k and 1M (Llama-3's base 500,000: angles up to 1M radians)."""
    d, hq, hkv, rot = 64, 4, 2, 64
    seq_lens = [60, 90]
    ext = [1, 1] if kind == "decode" else [20, 33]
    k_pool, v_pool, r2t, r2p, req_idx = make_batch(seq_lens, ext, hq, hkv, d, 16, torch.float32, seed=31)
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
    shift = base - 400
    local = r2p.clone()  # positions below 400, made large by `shift` for the kernel
    big = torch.where(local >= 0, local + shift, -1).to(torch.int32)
    # The reference's small cache: row i holds cos/sin of the fp32 angle (i + shift) * inv_freq, exactly.
    angles = (torch.arange(512, dtype=torch.float64) + shift).float()[:, None] * inv_freq[None, :]
    small = torch.cat([angles.double().cos(), angles.double().sin()], -1).float()
    rope = Rope(small, rot, d, True)
    positions = torch.cat([local[row, n - e:n] for row, n, e in zip(req_idx.tolist(), seq_lens, ext)])
    q = rope.rotate(torch.randn(sum(ext), hq, d), positions.long())
    big_pos = (positions + shift).to(torch.int64)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    table = torch.zeros(1, rot)  # unused on chip
    if kind == "decode":
        out = kernels.decode(q, k_pool, v_pool, r2t, big, req_idx, lens, big_pos, table, rot, True, d ** -0.5,
                             inv_freq=inv_freq)
    else:
        q_start = torch.tensor([0, ext[0]], dtype=torch.int32)
        out = kernels.extend(q, k_pool, v_pool, r2t, big, req_idx, lens, q_start, torch.tensor(ext, dtype=torch.int32),
                             big_pos, table, rot, True, d ** -0.5, max(ext), block_m=32, block_n=16, inv_freq=inv_freq)
    ref = reference(q, positions, k_pool, v_pool, r2t, local, req_idx, seq_lens, ext, rope, d ** -0.5)
    torch.testing.assert_close(out, ref, atol=2e-4, rtol=2e-4)


def test_table_rope_at_128k_positions():
    """The table path reads rows past 128k (int64 row offsets)."""
    d, hq, hkv, rot = 64, 4, 2, 32
    seq_lens, ext = [50], [1]
    k_pool, v_pool, r2t, r2p, req_idx = make_batch(seq_lens, ext, hq, hkv, d, 16, torch.float32, seed=41)
    shift = 131072 + 7
    cache = cos_sin_cache(rot, shift + 256, base=500000.0)
    rope = Rope(cache, rot, d, True)
    big = torch.where(r2p >= 0, r2p + shift, -1).to(torch.int32)
    q_pos = big[req_idx[0], seq_lens[0] - 1].reshape(1).long()
    q = rope.rotate(torch.randn(1, hq, d), q_pos)
    out = kernels.decode(q, k_pool, v_pool, r2t, big, req_idx, torch.tensor(seq_lens), q_pos, cache, rot, True,
                         d ** -0.5)
    ref = reference(q, q_pos, k_pool, v_pool, r2t, big, req_idx, seq_lens, ext, rope, d ** -0.5)
    torch.testing.assert_close(out, ref, atol=2e-4, rtol=2e-4)


@pytest.mark.slow  # 42 s under the interpreter
def test_extend_split_k_and_loop_bounds():
    """Split-K extend (forced and chosen) and the loop bounds: identity rows end at each block's last query,
    planned rows at their last visible slot; the results equal the unsplit, unbounded kernel's reference."""
    d, hq, hkv, rot = 64, 8, 2, 64
    seq_lens, ext = [90, 75], [90, 20]
    k_pool, v_pool, r2t, r2p, req_idx = make_batch(seq_lens, ext, hq, hkv, d, 16, torch.float32, seed=51, pads=False)
    rows = req_idx.tolist()
    r2p[rows[0], :90] = torch.arange(90, dtype=torch.int32)  # a fresh identity prompt
    r2p[rows[1], 40:55] = torch.arange(500, 515, dtype=torch.int32)  # reused slots after every query: never seen
    rope = Rope(cos_sin_cache(rot, MAX_POS), rot, d, True)
    positions = torch.cat([r2p[row, n - e:n] for row, n, e in zip(rows, seq_lens, ext)])
    lens, elens = torch.tensor(seq_lens), torch.tensor(ext, dtype=torch.int32)
    kv_end = kernels.extend_kv_end(r2p, req_idx, lens, elens, positions.long())
    last_visible = max(j for j in range(75) if 0 <= int(r2p[rows[1], j]) <= int(positions[90:].max())) + 1
    assert kv_end.tolist() == [-1, last_visible]
    q = rope.rotate(torch.randn(sum(ext), hq, d), positions.long())
    q_start = torch.tensor([0, 90], dtype=torch.int32)
    ref = reference(q, positions, k_pool, v_pool, r2t, r2p, req_idx, seq_lens, ext, rope, d ** -0.5)
    for splits in (None, 1, 3):
        out = kernels.extend(q, k_pool, v_pool, r2t, r2p, req_idx, lens, q_start, elens, positions.long(),
                             rope.cos_sin_cache, rot, True, d ** -0.5, max(ext), block_m=32, block_n=16,
                             splits=splits, kv_end=kv_end)
        torch.testing.assert_close(out, ref, atol=2e-4, rtol=2e-4)
    assert kernels.extend_splits(96, 2197, 32, 132) == 3  # the MEPIC shape at 64 x 32: 288 programs, 23 tiles
    assert kernels.extend_splits(1024, 2048, 32, 132) == 1


def test_decode_preparation_does_not_sync(monkeypatch):
    """A decode forward's preparation on the Triton path is device ops only: no .item(), .tolist(), .cpu()."""
    from types import SimpleNamespace

    from sglang_mepic.attention.backend import MepicAttnBackend

    d, hq, hkv = 64, 6, 2
    seq_lens = [30, 45]
    k_pool, v_pool, r2t, r2p, req_idx = make_batch(seq_lens, [1, 1], hq, hkv, d, 16, torch.float32, seed=61)
    rope = Rope(cos_sin_cache(d, MAX_POS), d, d, True)
    backend = MepicAttnBackend.over_pools(r2t, k_pool, v_pool, rope, q_heads=hq)
    backend._use_kernels(kernels)
    backend.positions.assign(int(req_idx[0]), r2p[int(req_idx[0]), :seq_lens[0] - 1])
    fb = SimpleNamespace(req_pool_indices=req_idx.long(), seq_lens=torch.tensor(seq_lens),
                         positions=torch.tensor(seq_lens) - 1, batch_size=2,
                         forward_mode=SimpleNamespace(is_decode=lambda: True, is_extend=lambda: False))

    def refuse(*args, **kwargs):
        raise AssertionError("host sync during decode preparation")

    for name in ("item", "tolist", "cpu", "__bool__", "__int__"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    backend.init_forward_metadata(fb)
    monkeypatch.undo()
    assert backend._splits is not None
    expected = int(r2p[int(req_idx[0]), :seq_lens[0] - 1].max()) + 1
    assert fb.positions.tolist() == [expected, seq_lens[1] - 1]


FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
# fp8's own error: e4m3 keeps 3 mantissa bits (relative step 2^-3), e5m2 2 (2^-2). Attention over unit-variance
# keys and values quantized so stays within about a step of the float pool's, and well inside these bounds.
FP8_ERROR = {torch.float8_e4m3fn: 0.08, torch.float8_e5m2: 0.16}


def quantized(pool: torch.Tensor, scale: float, fp8: torch.dtype) -> torch.Tensor:
    """What SGLang's pool stores for `pool` under a per-layer scale: divided by it, cast to fp8."""
    return (pool / scale).to(fp8)


@pytest.mark.parametrize("fp8", FP8, ids=str)
@pytest.mark.parametrize("decode", [False, True], ids=["extend", "decode"])
def test_kernels_read_an_fp8_pool_widened_scaled_then_rotated(fp8, decode):
    """NoPE keys in fp8: the kernels widen each key, multiply its scale back in and only then rotate it at its
    slot's position (the shared copy stays position-independent), and scale the values. Against a float
    reference over the same fp8 values they agree to the dot's precision; against the float pool they were
    quantized from, within fp8's own error."""
    d, hq, hkv, rot = 64, 6, 2, 64
    seq_lens = [37, 70, 21]
    ext = [1, 1, 1] if decode else [37, 9, 21]
    k_float, v_float, r2t, r2p, req_idx = make_batch(seq_lens, ext, hq, hkv, d, 16, torch.float32, seed=73)
    k_scale, v_scale = 0.5, 2.0
    k_pool, v_pool = quantized(k_float, k_scale, fp8), quantized(v_float, v_scale, fp8)
    cache = cos_sin_cache(rot, MAX_POS)
    rope = Rope(cache, rot, d, True)
    positions = torch.cat([r2p[row, n - e:n] for row, n, e in zip(req_idx.tolist(), seq_lens, ext)])
    q = rope.rotate(torch.randn(sum(ext), hq, d), positions.long()).to(torch.bfloat16)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    scale = d ** -0.5
    if decode:
        out = kernels.decode(q, k_pool, v_pool, r2t, r2p, req_idx, lens, positions.to(torch.int32), cache, rot,
                             True, scale, block_n=32, k_scale=k_scale, v_scale=v_scale)
    else:
        q_start = torch.tensor([0, ext[0], ext[0] + ext[1]], dtype=torch.int32)
        out = kernels.extend(q, k_pool, v_pool, r2t, r2p, req_idx, lens, q_start, torch.tensor(ext, dtype=torch.int32),
                             positions, cache, rot, True, scale, max(ext), block_m=32, block_n=32, k_scale=k_scale,
                             v_scale=v_scale)
    assert out.dtype == torch.bfloat16
    same_values = reference(q, positions, k_pool.float() * k_scale, v_pool.float() * v_scale, r2t, r2p, req_idx,
                            seq_lens, ext, rope, scale)
    torch.testing.assert_close(out.float(), same_values, atol=TOL[torch.bfloat16], rtol=TOL[torch.bfloat16])
    unquantized = reference(q, positions, k_float, v_float, r2t, r2p, req_idx, seq_lens, ext, rope, scale)
    error = (out.float() - unquantized).abs().mean()
    assert error < FP8_ERROR[fp8]
    # The scales are read: without them the output is another one, several times fp8's error away.
    unscaled = reference(q, positions, k_pool.float(), v_pool.float(), r2t, r2p, req_idx, seq_lens, ext, rope,
                         scale)
    assert (out.float() - unscaled).abs().mean() > 3 * error


# What another request leaves in a hidden slot of an fp8 pool (inf, NaN) never reaches a read: the kernels zero
# those value rows. The interpreter widens fp8's inf and NaN to finite numbers, so only a GPU shows it:
# eval/gpu/check_kernels.py --dtypes fp8 poisons every hidden slot with NaN.


def test_an_fp8_cache_on_a_gpu_before_sm_89_is_refused_at_start_up(monkeypatch):
    """Triton has no fp8 before sm_89: an A100 would fail in a kernel compile; the backend says so at start-up."""
    from sglang_mepic.attention.backend import MepicAttnBackend

    k_pool = torch.zeros(64, 2, 64).to(torch.float8_e4m3fn)
    r2t = torch.zeros(2, 64, dtype=torch.int32)
    backend = MepicAttnBackend.over_pools(r2t, k_pool, k_pool, Rope(cos_sin_cache(64, MAX_POS), 64, 64, True))
    monkeypatch.setattr(kernels, "device_arch", lambda device: 80)
    with pytest.raises(ValueError, match="sm_89 and later GPUs .* this one is sm_80"):
        backend._use_kernels(kernels)
    monkeypatch.setattr(kernels, "device_arch", lambda device: 90)
    backend._use_kernels(kernels)


def test_scales_are_read_as_sglang_keeps_them():
    """A checkpoint's scales: tensors, with host floats beside them; a --quantization-param-path file's: floats
    in k_scale itself (SGLang's load_kv_cache_scales), with no k_scale_float."""
    from types import SimpleNamespace

    from sglang_mepic.attention.backend import kv_scales

    checkpoint = SimpleNamespace(k_scale=torch.tensor(0.5), v_scale=torch.tensor(2.0), k_scale_float=0.5,
                                 v_scale_float=2.0)
    file = SimpleNamespace(k_scale=0.25, v_scale=0.25, k_scale_float=None, v_scale_float=None)
    assert kv_scales(checkpoint, fp8_pool=True) == (0.5, 2.0) and kv_scales(file, fp8_pool=True) == (0.25, 0.25)
    assert kv_scales(checkpoint, fp8_pool=False) == (1.0, 1.0)  # SGLang stored a float cache unscaled
    assert kv_scales(SimpleNamespace(k_scale=None, v_scale=None), fp8_pool=True) == (1.0, 1.0)


def sglang_fp8_pool(fp8, slots: int, hkv: int, d: int):
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    return MHATokenToKVPool(size=slots, page_size=16, dtype=fp8, head_num=hkv, head_dim=d, layer_num=1,
                            device="cpu", enable_memory_saver=False)


@pytest.mark.parametrize("fp8", FP8, ids=str)
@pytest.mark.parametrize("decode", [False, True], ids=["extend", "decode"])
def test_backend_writes_fp8_through_sglangs_pool_and_both_paths_read_it(fp8, decode):
    """The backend over SGLang's own fp8 pool (uint8 storage, a float8 view): a forward writes the batch's NoPE
    keys and values with the layer's scales (SGLang divides and casts), the torch path and the kernels read
    them back alike, and match attention over the float keys within fp8's error."""
    from types import SimpleNamespace

    from sglang_mepic.attention.backend import MepicAttnBackend, check_kv_dtype

    d, hq, hkv = 64, 6, 2
    seq_lens, ext = [30, 45], ([1, 1] if decode else [30, 12])
    k_float, v_float, r2t, r2p, req_idx = make_batch(seq_lens, ext, hq, hkv, d, 16, torch.float32, seed=7,
                                                     pads=False)
    pool = sglang_fp8_pool(fp8, k_float.shape[0], hkv, d)
    check_kv_dtype(pool)
    assert pool.k_buffer[0].dtype == torch.uint8 and pool.get_key_buffer(0).dtype == fp8
    k_scale, v_scale = 0.25, 4.0
    every = torch.arange(k_float.shape[0])
    layer = SimpleNamespace(tp_q_head_num=hq, qk_head_dim=d, v_head_dim=d, layer_id=0, scaling=d ** -0.5,
                            is_cross_attention=False, sliding_window_size=-1, k_scale=torch.tensor(k_scale),
                            v_scale=torch.tensor(v_scale), k_scale_float=k_scale, v_scale_float=v_scale)
    rope = Rope(cos_sin_cache(d, MAX_POS), d, d, True)
    backend = MepicAttnBackend.over_pools(r2t, pool.get_key_buffer(0), pool.get_value_buffer(0), rope, q_heads=hq)
    backend.token_to_kv_pool = pool
    for row, n in zip(req_idx.tolist(), seq_lens):
        backend.positions.assign(row, r2p[row, :n])
    loc = torch.cat([r2t[row, n - e:n] for row, n, e in zip(req_idx.tolist(), seq_lens, ext)]).long()
    positions = torch.cat([r2p[row, n - e:n] for row, n, e in zip(req_idx.tolist(), seq_lens, ext)]).long()
    # The context before the new tokens, as earlier forwards would have left it; the new tokens the forward writes.
    older = torch.ones(k_float.shape[0], dtype=torch.bool)
    older[loc] = False
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc
    pool.set_kv_buffer(layer, KVWriteLoc(every[older], None), k_float[older].clone(), v_float[older].clone(),
                       layer.k_scale, layer.v_scale)
    q = rope.rotate(torch.randn(sum(ext), hq, d), positions).to(torch.bfloat16).reshape(sum(ext), -1)
    fb = forward_batch(req_idx, seq_lens, ext, positions, decode, loc)
    backend.init_forward_metadata(fb)
    k_new, v_new = k_float[loc].clone(), v_float[loc].clone()
    forward = backend.forward_decode if decode else backend.forward_extend
    torch_out = forward(q, k_new, v_new, layer, fb)
    assert torch.equal(k_new, k_float[loc]), "the model's k is left as it was (SGLang's pool divides in place)"
    stored = pool.get_key_buffer(0)[loc].float() * k_scale
    assert (stored - k_float[loc]).abs().max() <= FP8_ERROR[fp8] * 8 * k_float[loc].abs().max()
    backend._use_kernels(kernels)
    triton_out = backend._run_triton(q.reshape(sum(ext), hq, d), layer, fb, decode=decode)
    torch.testing.assert_close(triton_out.float(), torch_out.float(), atol=6e-2, rtol=6e-2)
    expected = reference(q.reshape(sum(ext), hq, d), positions, k_float, v_float, r2t, r2p, req_idx, seq_lens,
                         ext, rope, layer.scaling)
    assert (torch_out.float().reshape(expected.shape) - expected).abs().mean() < FP8_ERROR[fp8]


def test_a_checkpoints_scales_over_a_float_cache_are_not_applied():
    """SGLang's pool divides by a layer's scales only when it casts to fp8: over a float cache (a checkpoint
    with kv scales served with --kv-cache-dtype bf16) the keys and values are stored as they are, so reading
    them must not multiply the scales back in."""
    from types import SimpleNamespace

    from sglang_mepic.attention.backend import MepicAttnBackend

    d, hq, hkv = 64, 6, 2
    seq_lens, ext = [30, 45], [30, 12]
    k_pool, v_pool, r2t, r2p, req_idx = make_batch(seq_lens, ext, hq, hkv, d, 16, torch.float32, seed=5, pads=False)
    rope = Rope(cos_sin_cache(d, MAX_POS), d, d, True)
    backend = MepicAttnBackend.over_pools(r2t, k_pool, v_pool, rope, q_heads=hq)
    assert not backend.fp8_kv
    for row, n in zip(req_idx.tolist(), seq_lens):
        backend.positions.assign(row, r2p[row, :n])
    positions = torch.cat([r2p[row, n - e:n] for row, n, e in zip(req_idx.tolist(), seq_lens, ext)]).long()
    q = rope.rotate(torch.randn(sum(ext), hq, d), positions).reshape(sum(ext), -1)
    fb = forward_batch(req_idx, seq_lens, ext, positions, decode=False)
    backend.init_forward_metadata(fb)
    plain = SimpleNamespace(tp_q_head_num=hq, qk_head_dim=d, v_head_dim=d, layer_id=0, scaling=d ** -0.5,
                            is_cross_attention=False, sliding_window_size=-1)
    scaled = SimpleNamespace(**vars(plain), k_scale=torch.tensor(0.25), v_scale=torch.tensor(4.0),
                             k_scale_float=0.25, v_scale_float=4.0)
    torch.testing.assert_close(backend._run(q, scaled, fb, ext), backend._run(q, plain, fb, ext), atol=0, rtol=0)


def test_kv_dtypes_the_backend_reads_and_refuses():
    from types import SimpleNamespace

    from sglang_mepic.attention.backend import check_kv_dtype

    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2):
        check_kv_dtype(SimpleNamespace(dtype=dtype, store_dtype=torch.uint8 if dtype.itemsize == 1 else dtype))
    refused = [SimpleNamespace(dtype=torch.float8_e4m3fnuz), SimpleNamespace(dtype=torch.uint8),
               SimpleNamespace(dtype=torch.float8_e4m3fn, is_quantized_kv_cache=True)]  # mxfp8's block scales
    if hasattr(torch, "float4_e2m1fn_x2"):
        refused.append(SimpleNamespace(dtype=torch.float4_e2m1fn_x2))
    for pool in refused:
        with pytest.raises(ValueError, match="--attention-backend mepic cannot read"):
            check_kv_dtype(pool)


@pytest.mark.slow
def test_kernel_model_runs_without_spills():
    """The static model (`python -m eval.bench.kernel_model`) runs on a CPU, no kernel of ours spills, and the
    CTAs per SM the decode splits are sized from are the compiled kernel's."""
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-m", "eval.bench.kernel_model"], env=env, capture_output=True, text=True,
                         timeout=1800, cwd=root)
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no kernel of ours spills" in out.stdout
    decode = [line.split("|") for line in out.stdout.splitlines() if "| ours | decode |" in line]
    # The default variant's (on-chip cos/sin) with the venv's Triton 3.7.1: 3 CTAs/SM (168 registers), the CPU fallback's
    # figure (on a GPU the backend takes the figure of the kernel compiled there).
    assert "our RoPE cos/sin: on chip" in out.stdout
    assert decode and all(int(cells[8]) == kernels.DECODE_CTAS_PER_SM[90] for cells in decode)
    extend = [line.split("|") for line in out.stdout.splitlines() if "| ours | extend" in line]
    assert extend and all(int(cells[8]) == kernels.launch_config("extend", 128, torch.bfloat16)["ctas_per_sm"]
                          for cells in extend)
