"""MEPIC attention semantics in torch: NoPE keys rotated at their slot positions."""

import pytest
import torch
from torch.nn.functional import scaled_dot_product_attention

from sglang_mepic.attention.reference import attend
from sglang_mepic.attention.rope import Rope, cos_sin_cache

D = 64


def make_rope(rotary_dim=D, neox=True):
    return Rope(cos_sin_cache(rotary_dim, 4096), rotary_dim, D, neox)


def random_case(n_q=5, m=40, hq=6, hkv=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n_q, hq, D, generator=g)
    k = torch.randn(m, hkv, D, generator=g)
    v = torch.randn(m, hkv, D, generator=g)
    return q, k, v


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("rotary_dim", [D, D // 2])
def test_identity_positions_equal_standard_causal_attention(neox, rotary_dim):
    rope = make_rope(rotary_dim, neox)
    q, k, v = random_case()
    m, n = k.shape[0], q.shape[0]
    pos = torch.arange(m)
    q_pos = pos[-n:]
    q_rot = rope.rotate(q, q_pos)
    k_rot = rope.rotate(k, pos)
    # Reference: the rotated keys as a standard pool, causal by index (queries are the last n).
    mask = torch.arange(m)[None, :] <= torch.arange(m - n, m)[:, None]
    ref = scaled_dot_product_attention(q_rot.transpose(0, 1)[None], k_rot.transpose(0, 1)[None],
                                       v.transpose(0, 1)[None], attn_mask=mask[None, None],
                                       enable_gqa=True).squeeze(0).transpose(0, 1)
    out = attend(q_rot, q_pos, k, v, pos, rope, D ** -0.5)
    torch.testing.assert_close(out, ref)


def test_slot_order_does_not_matter_and_pads_are_masked():
    rope = make_rope()
    q, k, v = random_case(seed=1)
    m = k.shape[0]
    pos = torch.arange(100, 100 + m)  # positions need not start at 0
    q_pos = torch.tensor([110, 120, 139, 139, 125])
    q_rot = rope.rotate(q, q_pos)
    base = attend(q_rot, q_pos, k, v, pos, rope, 0.1)

    perm = torch.randperm(m, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(attend(q_rot, q_pos, k[perm], v[perm], pos[perm], rope, 0.1), base)

    # Pads anywhere, holding garbage, change nothing.
    pads = 7
    k_pad = torch.cat([torch.full((pads, *k.shape[1:]), 1e4), k])
    v_pad = torch.cat([torch.full((pads, *v.shape[1:]), -1e4), v])
    pos_pad = torch.cat([torch.full((pads,), -1), pos])
    torch.testing.assert_close(attend(q_rot, q_pos, k_pad, v_pad, pos_pad, rope, 0.1), base)


def test_relative_positions_only():
    """Shifting every position by the same amount leaves attention unchanged (RoPE is relative)."""
    rope = make_rope()
    q, k, v = random_case(seed=3)
    pos = torch.arange(k.shape[0])
    q_pos = torch.tensor([3, 10, 20, 30, 39])
    out = attend(rope.rotate(q, q_pos), q_pos, k, v, pos, rope, 0.1)
    shifted = attend(rope.rotate(q, q_pos + 777), q_pos + 777, k, v, pos + 777, rope, 0.1)
    torch.testing.assert_close(out, shifted, atol=2e-4, rtol=1e-4)


def sglang_rope(**kwargs):
    from sglang.srt.layers.rotary_embedding import get_rope

    return get_rope(head_size=D, max_position=4096, base=10000, dtype=torch.float32, **kwargs)


@pytest.mark.parametrize("kwargs", [
    dict(rotary_dim=D),
    dict(rotary_dim=D, is_neox_style=False),
    dict(rotary_dim=D, partial_rotary_factor=0.5),
    dict(rotary_dim=D, rope_scaling={"rope_type": "linear", "factor": 2.0}),
    dict(rotary_dim=D, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 1024}),
    dict(rotary_dim=D, rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}),
], ids=["neox", "gptj", "partial", "linear", "llama3", "yarn"])
def test_key_rotation_matches_sglang_rotary(kwargs):
    module = sglang_rope(**kwargs)
    rope = Rope.from_module(module)
    pos = torch.tensor([0, 5, 17, 1000, 4000, 3])
    q = torch.randn(len(pos), 4, D)
    k = torch.randn(len(pos), 2, D)
    _, k_ref = module.forward_native(pos, q.clone(), k.clone())
    torch.testing.assert_close(rope.rotate(k, pos), k_ref.view_as(k), rtol=0, atol=0)


def test_unsupported_rope_is_refused():
    from sglang_mepic.attention.rope import UnsupportedRope

    module = sglang_rope(rotary_dim=D, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    with pytest.raises(UnsupportedRope, match="cannot rotate keys"):
        Rope.from_module(module)


# 7: the masked path; 20 and 33: queries padded to the keys (attention.REDUNDANT_QUERIES).
@pytest.mark.parametrize("n", [1, 7, 20, 33, 40])
def test_fast_paths_equal_the_reference(n):
    from sglang_mepic.attention.reference import PagedContext, attend_context, attend_paged

    rope = make_rope()
    q, k, v = random_case(n_q=n, m=40, seed=4)
    slots = torch.randperm(40, generator=torch.Generator().manual_seed(5))
    pos = torch.arange(40)
    q_rot = rope.rotate(q, pos[40 - n:])
    reference = attend(q_rot, pos[40 - n:], k[slots], v[slots], pos, rope, 0.125)
    plain = PagedContext.plain(slots, rope, q_rot.dtype)  # slot j at position j: no positions, no mask
    torch.testing.assert_close(attend_context(q_rot, k, v, plain, rope, 0.125)[0], reference)
    torch.testing.assert_close(attend_paged(q_rot, pos[40 - n:], k, v, slots, pos, rope, 0.125), reference)
    # A MEPIC layout: gaps where pads were skipped, pad slots, the queries last.
    laid = torch.cumsum(torch.randint(1, 3, (40,), generator=torch.Generator().manual_seed(9)), 0)
    laid[[i for i in (2, 3, 11) if i < 40 - n]] = -1  # queries are real tokens
    q_rot = rope.rotate(q, laid[40 - n:])
    reference = attend(q_rot, laid[40 - n:], k[slots], v[slots], laid, rope, 0.125)
    torch.testing.assert_close(attend_paged(q_rot, laid[40 - n:], k, v, slots, laid, rope, 0.125), reference)


@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16, torch.float8_e5m2, torch.float8_e4m3fn])
def test_gather_reads_every_value_as_a_cast_would(pool_dtype):
    """The CPU path's one read (index_select, e5m2 widened through fp16) equals `pool[slots].to(float32)` bit
    for bit: every fp8 byte pattern (subnormals, inf, NaN included) and slots in any order, repeated."""
    from sglang_mepic.attention.reference import gather

    if pool_dtype.itemsize == 1:
        pool = torch.arange(256, dtype=torch.uint8).repeat(3).view(pool_dtype).view(-1, 3, 4)
    else:
        pool = torch.randn(64, 3, 4, generator=torch.Generator().manual_seed(1)).to(pool_dtype)
    slots = torch.randint(0, pool.shape[0], (50,), generator=torch.Generator().manual_seed(2), dtype=torch.int32)
    for dtype in (torch.float32, torch.bfloat16):
        expected = pool[slots.long()].to(dtype)
        got = gather(pool, slots, dtype)
        assert got.dtype == dtype and got.shape == expected.shape
        bits = torch.int16 if dtype.itemsize == 2 else torch.int32
        assert torch.equal(got.view(bits), expected.view(bits))


def test_position_map_rows():
    from sglang_mepic.pages.positions import PositionMap

    pm = PositionMap(torch.zeros(4, 16, dtype=torch.int32))
    # Unplanned rows are the identity from the start and keep SGLang's positions.
    assert pm.req_to_pos[2].tolist() == list(range(16))
    out = pm.on_extend(torch.tensor([2, 0]), torch.tensor([3, 0]), torch.tensor([2, 4]),
                       torch.tensor([3, 4, 0, 1, 2, 3]))
    assert out.tolist() == [3, 4, 0, 1, 2, 3]
    # A planned row: the plan's positions win over SGLang's (which count pads), pads
    # rotate at 0 but stay -1 in the map, and the slots past the plan follow its last real position.
    pm.assign(1, torch.tensor([0, 1, -1, -1, 2, 3, 4]))
    assert pm.req_to_pos[1, :10].tolist() == [0, 1, -1, -1, 2, 3, 4, 5, 6, 7]
    out = pm.on_extend(torch.tensor([1, 0]), torch.tensor([2, 4]), torch.tensor([5, 1]),
                       torch.tensor([2, 3, 4, 5, 6, 4]))
    assert out.tolist() == [0, 0, 2, 3, 4, 4]
    out = pm.on_decode(torch.tensor([0, 1]), torch.tensor([6, 8]), torch.tensor([5, 7]))
    assert out.tolist() == [5, 5]
    # The same token reached as a decode step or as a one-token extend in a mixed batch
    # (--enable-mixed-chunk) gets the same position, and neither writes the map.
    before = pm.req_to_pos.clone()
    as_decode = pm.on_decode(torch.tensor([1]), torch.tensor([9]), torch.tensor([8]))
    as_mixed = pm.on_extend(torch.tensor([0, 1]), torch.tensor([5, 8]), torch.tensor([3, 1]),
                            torch.tensor([5, 6, 7, 8]))
    assert as_decode.tolist() == [6] and as_mixed.tolist() == [5, 6, 7, 6]
    assert torch.equal(pm.req_to_pos, before)
    pm.release(1)
    assert not pm.planned[1] and pm.req_to_pos[1].tolist() == list(range(16))


def test_decode_kv_across_decode_steps():
    """Two rows decoding together, one plain, one with pads in its context: each step's keys and values are
    what a fresh read of their real slots gives, past the buffers' first room, and a dropped row is read anew."""
    from sglang_mepic.attention.reference import DecodeKV, DecodeRows

    rope = make_rope()
    g = torch.Generator().manual_seed(6)
    k_pool = torch.randn(600, 2, D, generator=g)
    v_pool = torch.randn(600, 2, D, generator=g).to(torch.float8_e5m2)
    order = torch.randperm(600, generator=g)
    slots = {3: order[:200], 5: order[200:400]}
    pos5 = torch.arange(200) + 7
    pos5[[0, 1, 40]] = -1  # pads of row 5's layout: never read, whatever they hold
    k_pool[slots[5][[0, 1, 40]]] = float("nan")
    contexts_read = []

    def rows_at(n: int, rows: list[int]) -> DecodeRows:
        def context(j: int):
            contexts_read.append(rows[j])
            if rows[j] == 3:
                return slots[3][:n], None
            real = pos5[:n] >= 0
            return slots[5][:n][real], pos5[:n][real]
        new_pos = torch.tensor([n - 1 if r == 3 else int(pos5[n - 1]) for r in rows])
        return DecodeRows(list(range(len(rows))), rows, [n] * len(rows),
                          torch.stack([slots[r][n - 1] for r in rows]), new_pos, context)

    cache = DecodeKV(rope)
    for n in range(50, 200):  # one new slot per step, past the initial room
        (k3, v3), (k5, v5) = cache.step(0, k_pool, v_pool, torch.float32, rows_at(n, [3, 5]))
        if n % 40 == 0 or n == 199:
            torch.testing.assert_close(k3, rope.rotate(k_pool[slots[3][:n]]), rtol=0, atol=0)
            torch.testing.assert_close(v3, v_pool[slots[3][:n]].float(), rtol=0, atol=0)
            real = pos5[:n] >= 0
            torch.testing.assert_close(k5, rope.rotate(k_pool[slots[5][:n][real]], pos5[:n][real]), rtol=0, atol=0)
            torch.testing.assert_close(v5, v_pool[slots[5][:n][real]].float(), rtol=0, atol=0)
    assert contexts_read == [3, 5]  # read once, at the first step; every later step appends
    # A row whose request changed (an extend) must not reuse stale keys or values.
    cache.drop([3])
    assert len(cache) == 1
    slots[3] = order[400:450]
    (k3, v3), = cache.step(0, k_pool, v_pool, torch.float32, rows_at(50, [3]))
    torch.testing.assert_close(k3, rope.rotate(k_pool[slots[3]]))
    torch.testing.assert_close(v3, v_pool[slots[3]].float())


def test_backend_decode_of_a_row_whose_context_lies_past_its_token():
    """A decode whose rows all have a slot positioned past the new token (nothing for DecodeKV) takes the
    general path, masked by position, and reads nothing cached."""
    from types import SimpleNamespace

    from sglang_mepic.attention.backend import MepicAttnBackend
    from sglang_mepic.attention.reference import attend_paged

    rope = make_rope()
    g = torch.Generator().manual_seed(9)
    k_pool, v_pool = torch.randn(64, 2, D, generator=g), torch.randn(64, 2, D, generator=g)
    req_to_token = torch.zeros(2, 64, dtype=torch.int32)
    req_to_token[1, :21] = torch.randperm(64, generator=g)[:21].to(torch.int32)
    backend = MepicAttnBackend.over_pools(req_to_token, k_pool, v_pool, rope)
    pos = torch.arange(21)
    pos[5], pos[20] = 40, 20  # slot 5 lies past the new token's position
    backend.positions.assign(1, pos)
    layer = SimpleNamespace(tp_q_head_num=4, qk_head_dim=D, v_head_dim=D, layer_id=0, scaling=0.1,
                            is_cross_attention=False, sliding_window_size=-1)
    q_pos = torch.tensor([20])
    fb = SimpleNamespace(req_pool_indices=torch.tensor([1]), seq_lens=torch.tensor([21]), positions=q_pos,
                         batch_size=1, forward_mode=SimpleNamespace(is_decode=lambda: True))
    backend.init_forward_metadata(fb)
    assert backend.decode_general == [0] and backend.decode_rows.rows == []
    q = rope.rotate(torch.randn(1, 4, D, generator=g), q_pos)
    out = backend._run(q.reshape(1, -1), layer, fb, [1], decode=True).view(1, 4, D)
    ref = attend_paged(q, q_pos, k_pool, v_pool, req_to_token[1, :21].long(), pos, rope, 0.1)
    torch.testing.assert_close(out, ref)
    assert len(backend.decode_kv) == 0


def test_backend_decode_steps_with_pads_equal_the_general_path():
    """Decode on a planned row (pads, shuffled slots) through the backend's cached path (DecodeKV) gives what
    `attend_paged` gives from scratch, step after step, whatever another request left in its pad slots:
    NaN and inf there reach no output (both paths leave pads out)."""
    from types import SimpleNamespace

    from sglang_mepic.attention.backend import MepicAttnBackend
    from sglang_mepic.attention.reference import attend_paged

    rope = make_rope()
    g = torch.Generator().manual_seed(8)
    hq, hkv, steps, m0 = 6, 2, 5, 30
    k_pool = torch.randn(64, hkv, D, generator=g)
    v_pool = torch.randn(64, hkv, D, generator=g)
    req_to_token = torch.zeros(2, 64, dtype=torch.int32)
    req_to_token[1, :m0 + steps] = torch.randperm(64, generator=g)[:m0 + steps].to(torch.int32)
    backend = MepicAttnBackend.over_pools(req_to_token, k_pool, v_pool, rope)
    pos = torch.arange(m0) + 5
    pos[[3, 4, 17]] = -1  # pads
    backend.positions.assign(1, pos)
    pad_slots = req_to_token[1, [3, 4, 17]].long()
    k_pool[pad_slots], v_pool[pad_slots[:2]], v_pool[pad_slots[2]] = float("nan"), float("nan"), float("inf")
    layer = SimpleNamespace(tp_q_head_num=hq, qk_head_dim=D, v_head_dim=D, layer_id=0, scaling=0.1,
                            is_cross_attention=False, sliding_window_size=-1)
    for step in range(steps):
        seq_len = m0 + step + 1
        q_pos = torch.tensor([int(backend.positions.req_to_pos[1, :seq_len - 1].max()) + 1])
        fb = SimpleNamespace(req_pool_indices=torch.tensor([1]), seq_lens=torch.tensor([seq_len]), positions=q_pos,
                             batch_size=1, forward_mode=SimpleNamespace(is_decode=lambda: True))
        backend.init_forward_metadata(fb)
        assert backend.plain_rows == [False]
        q = rope.rotate(torch.randn(1, hq, D, generator=g), q_pos)
        out = backend._run(q.reshape(1, -1), layer, fb, [1], decode=True).view(1, hq, D)
        slots = req_to_token[1, :seq_len].long()
        ref = attend_paged(q, q_pos, k_pool, v_pool, slots, backend.positions.req_to_pos[1, :seq_len].long(),
                           rope, 0.1)
        torch.testing.assert_close(out, ref)
    assert len(backend.decode_kv) == 1


def test_backend_extend_seeds_the_decode_that_follows(monkeypatch):
    """An extend finds each row's context (real slots, cos/sin, mask) once for all its layers, and leaves the
    keys and values its attention read to the row's decode: the first decode step then reads no context (one
    new slot a layer) and still gives what `attend_paged` gives from scratch, NaN in the pad slots included.
    The next extend keeps only the decoding rows' entries and its own."""
    from types import SimpleNamespace

    from sglang_mepic.attention import backend as backend_module
    from sglang_mepic.attention.backend import MepicAttnBackend
    from sglang_mepic.attention.reference import PagedContext, attend_paged

    found, of = [], PagedContext.of
    monkeypatch.setattr(backend_module.PagedContext, "of", lambda *a: found.append(a) or of(*a))

    rope = make_rope()
    g = torch.Generator().manual_seed(11)
    hq, hkv, m0, e = 4, 2, 40, 6
    k_pool, v_pool = torch.randn(128, hkv, D, generator=g), torch.randn(128, hkv, D, generator=g)
    req_to_token = torch.zeros(4, 128, dtype=torch.int32)
    req_to_token[1, :m0 + 3] = torch.randperm(128, generator=g)[:m0 + 3].to(torch.int32)
    backend = MepicAttnBackend.over_pools(req_to_token, k_pool, v_pool, rope)
    pos = torch.cat([torch.arange(m0 - e) + 3, torch.arange(e) + 100])  # the queries: the last e slots
    pos[[5, 6, 20]] = -1  # pads, whose slots hold another request's garbage
    backend.positions.assign(1, pos)
    pad_slots = req_to_token[1, [5, 6, 20]].long()
    k_pool[pad_slots], v_pool[pad_slots] = float("nan"), float("nan")
    layers = [SimpleNamespace(tp_q_head_num=hq, qk_head_dim=D, v_head_dim=D, layer_id=i, scaling=0.1,
                              is_cross_attention=False, sliding_window_size=-1) for i in (0, 1)]

    def extend_batch(row: int, seq_len: int, n: int) -> SimpleNamespace:
        return SimpleNamespace(req_pool_indices=torch.tensor([row]), seq_lens=torch.tensor([seq_len]),
                               positions=torch.arange(seq_len - n, seq_len), batch_size=1,
                               extend_seq_lens=torch.tensor([n]), extend_prefix_lens=torch.tensor([seq_len - n]),
                               forward_mode=SimpleNamespace(is_decode=lambda: False, is_extend=lambda: True))

    fb = extend_batch(1, m0, e)
    backend.init_forward_metadata(fb)
    q_pos = fb.positions.clone()
    assert q_pos.tolist() == list(range(100, 100 + e))
    qs = [rope.rotate(torch.randn(e, hq, D, generator=g), q_pos) for _ in layers]
    outs = [backend._run(q.reshape(e, -1), layer, fb, [e]).view(e, hq, D) for q, layer in zip(qs, layers)]
    assert len(found) == 1  # one context for both layers
    assert len(backend.decode_kv) == 2  # a seed a layer
    for q, out in zip(qs, outs):
        torch.testing.assert_close(out, attend_paged(q, q_pos, k_pool, v_pool, req_to_token[1, :m0].long(), pos,
                                                     rope, 0.1))

    for seq_len in (m0 + 1, m0 + 2):
        new = torch.tensor([99 + seq_len - m0 + e])
        fb = SimpleNamespace(req_pool_indices=torch.tensor([1]), seq_lens=torch.tensor([seq_len]), positions=new,
                             batch_size=1, forward_mode=SimpleNamespace(is_decode=lambda: True))
        backend.init_forward_metadata(fb)
        read = []
        context = backend.decode_rows.context
        backend.decode_rows.context = lambda i: read.append(i) or context(i)
        for layer in layers:
            q = rope.rotate(torch.randn(1, hq, D, generator=g), fb.positions)
            out = backend._run(q.reshape(1, -1), layer, fb, [1], decode=True).view(1, hq, D)
            ref = attend_paged(q, fb.positions, k_pool, v_pool, req_to_token[1, :seq_len].long(),
                               backend.positions.req_to_pos[1, :seq_len].long(), rope, 0.1)
            torch.testing.assert_close(out, ref)
        assert read == []  # the extend's seeds, then one new slot a step

    backend.decode_kv.seed(0, 3, torch.zeros(1, hkv, D), torch.zeros(1, hkv, D), 1)  # a row that left
    req_to_token[2, :8] = torch.arange(100, 108, dtype=torch.int32)
    fb = extend_batch(2, 8, 8)
    backend.init_forward_metadata(fb)
    assert {row for _, row in backend.decode_kv._entries} == {1}
    backend._run(torch.randn(8, hq * D, generator=g), layers[0], fb, [8])
    assert {row for _, row in backend.decode_kv._entries} == {1, 2}
