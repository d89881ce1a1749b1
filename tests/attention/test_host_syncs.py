"""No device-to-host synchronisation on the per-batch path of the attention side (issue 69).

SGLang's overlap scheduler prepares batch N+1 while the GPU runs batch N; a call that reads a device
value (`.item()`, `int()`, `bool()`, `.tolist()`, `.cpu()`, a boolean mask, `nonzero`, a
`repeat_interleave` without its output size) waits for the GPU and undoes the overlap. Here the
device tensors live on the `meta` device, which has shapes and no values: every such read raises, so
each per-batch call below runs to its end only if it reads nothing of the device. Host figures must
come from the batch's host fields (`seq_lens_cpu`, `extend_seq_lens_cpu`, `extend_prefix_lens_cpu`,
`req_pool_indices_cpu`), which stay CPU tensors and lists here, as they are in SGLang.

The GPU counterpart, under `torch.cuda.set_sync_debug_mode`: `eval/gpu/e2e/sync_check.py` (the same calls
on CUDA, mode "error") and `MEPIC_SYNC_DEBUG=warn` on a served mepic server (drive.py judges its log).
"""

from types import SimpleNamespace

import pytest
import torch

from sglang_mepic.attention.backend import MepicAttnBackend
from sglang_mepic.pages.positions import PositionMap
from sglang_mepic.attention.rope import Rope, cos_sin_cache
from sglang_mepic.kernels import attention as kernels

META = torch.device("meta")
ROWS, WIDTH, HQ, HKV, D = 8, 96, 4, 2, 64


def dev(values, dtype=torch.int64):
    """A device tensor with these values' shape (the values themselves are not kept: meta)."""
    return torch.tensor(values, dtype=dtype).to(META)


def mode(name):
    return SimpleNamespace(name=name, is_decode=lambda: name == "DECODE",
                           is_extend=lambda: name in ("EXTEND", "MIXED"))


def extend_batch(rows, prefix, ext, forward_mode="EXTEND"):
    """An extend as SGLang's ForwardBatch carries it: device tensors and their host mirrors."""
    seq = [p + e for p, e in zip(prefix, ext)]
    return SimpleNamespace(
        forward_mode=mode(forward_mode), batch_size=len(rows), req_pool_indices=dev(rows),
        req_pool_indices_cpu=torch.tensor(rows), seq_lens=dev(seq), seq_lens_cpu=torch.tensor(seq),
        extend_prefix_lens=dev(prefix), extend_prefix_lens_cpu=list(prefix), extend_seq_lens=dev(ext),
        extend_seq_lens_cpu=list(ext), positions=dev(list(range(sum(ext)))), out_cache_loc=dev([0] * sum(ext)))


def decode_batch(rows, seq):
    return SimpleNamespace(forward_mode=mode("DECODE"), batch_size=len(rows), req_pool_indices=dev(rows),
                           seq_lens=dev(seq), seq_lens_cpu=torch.tensor(seq), positions=dev([s - 1 for s in seq]))


def meta_backend() -> MepicAttnBackend:
    """The backend on its GPU path (Triton kernels), its pools, row table and position map on the meta device."""
    rope = Rope(cos_sin_cache(D, 1024), D, D, True)
    k_pool = torch.empty(512, HKV, D, device=META)
    v_pool = torch.empty(512, HKV, D, device=META)
    r2t = torch.empty(ROWS, WIDTH, dtype=torch.int32, device=META)
    backend = MepicAttnBackend.over_pools(r2t, k_pool, v_pool, rope, q_heads=HQ)
    backend._use_kernels(kernels)
    return backend


def test_the_meta_device_refuses_every_read_of_a_device_value():
    """The control: each way a call could sync raises here, so the tests below can fail."""
    x = dev([1, 2, 3])
    reads = [lambda: x.item(), lambda: int(x.sum()), lambda: bool(x.any()), lambda: x.tolist(), lambda: x.cpu(),
             lambda: x[x > 1], lambda: torch.nonzero(x), lambda: torch.repeat_interleave(x, x),
             lambda: int(x.max()) + 1]
    for read in reads:
        with pytest.raises((RuntimeError, NotImplementedError)):
            read()
    torch.repeat_interleave(x, x, output_size=6)  # with its size from the host: no read


def test_position_map_calls_read_no_device_value():
    pm = PositionMap(torch.empty(ROWS, WIDTH, dtype=torch.int32, device=META))
    # cache/extend.py hands the plan over on the device; the host form is copied without blocking.
    pm.assign(1, dev([0, 1, -1, 5, 6, 7], torch.int32))
    pm.assign(2, torch.tensor([3, 4, 5]))
    pm.assign(3, dev([], torch.int32))
    pm.release(3)
    pm.release(4)  # never planned: nothing is written
    assert pm.any_planned() and pm.any_planned([5, 1]) and not pm.any_planned(torch.tensor([4, 5]))
    # An extend of planned and plain rows, with a decode token riding in it (a mixed batch).
    out = pm.on_extend(dev([1, 4, 2]), dev([0, 10, 3]), dev([6, 4, 1]), dev(list(range(11))))
    assert out.shape == (11,) and out.device == META
    assert pm.on_decode(dev([1, 4]), dev([7, 15]), dev([6, 14])).shape == (2,)
    # No row holds copies (every mode but the private-copy baselines); a copy row outside the batch
    # is told from the host mirror when the batch's rows are known there.
    assert pm.copies_for_extend(dev([1, 4]), dev([0, 10]), dev([6, 4]), total=10) is None
    pm.assign(6, torch.tensor([0, 1]), sources=[5, -1])
    assert pm.copies_for_extend(dev([1, 4]), dev([0, 10]), dev([6, 4]), total=10,
                                rows_cpu=torch.tensor([1, 4])) is None


@pytest.mark.parametrize("forward_mode", ["EXTEND", "MIXED"])
def test_backend_prepares_an_extend_without_reading_the_device(forward_mode):
    backend = meta_backend()
    backend.positions.assign(1, dev(list(range(0, 40, 2)), torch.int32))
    backend.positions.assign(5, torch.arange(30))
    fb = extend_batch([1, 3, 5], [4, 0, 29], [16, 12, 1], forward_mode)  # row 5's one token: a decode in the batch
    given = fb.positions
    backend.init_forward_metadata(fb)
    assert fb.positions is not given and fb.positions.shape == given.shape  # planned rows: the map's positions
    assert backend._kv_end.shape == (3,) and backend._max_seq_len == 30 and backend.copies is None


def test_backend_prepares_a_decode_without_reading_the_device():
    backend = meta_backend()
    backend.positions.assign(2, dev(list(range(50)), torch.int32))
    fb = decode_batch([2, 6], [51, 12])
    backend.init_forward_metadata(fb)
    assert backend._splits.shape == (2,) and fb.positions.shape == (2,)


def test_backend_graph_hooks_read_no_device_value():
    """The decode graph hooks and the breakable prefill graph hooks (capture, replay, the runner's check)."""
    backend = meta_backend()
    backend.positions.assign(0, dev(list(range(0, 80, 3)), torch.int32))
    # Decode graph: capture, then a replay with two real rows and two padding rows.
    backend.init_cuda_graph_state(4, 4)
    buffers = dict(req_pool_indices=dev([0, 1, 0, 0]), seq_lens=dev([28, 9, 1, 1]), positions=dev([27, 8, 0, 0]))
    backend.init_forward_metadata_out_graph(SimpleNamespace(batch_size=4, forward_mode=mode("DECODE"), **buffers),
                                            in_capture=True)
    view = SimpleNamespace(batch_size=4, num_padding=2, forward_mode=mode("DECODE"), **buffers)
    backend.init_forward_metadata_out_graph(view)
    backend.init_forward_metadata_in_graph(view)
    # Prefill graph: a bucket of 64 tokens captured over the runner's static buffers, then a replay.
    static_positions = dev(list(range(64)))
    capture = extend_batch([0, 1], [0, 0], [40, 24])
    capture.positions = static_positions[:64]
    meta = backend.init_forward_metadata_for_breakable_cuda_graph_capture(capture)
    assert meta.num_tokens == 64
    live = extend_batch([0, 3], [0, 5], [27, 20])
    assert backend.can_run_prefill_cuda_graph(live)
    static = SimpleNamespace(positions=static_positions[:64])
    backend.prepare_forward_metadata_for_breakable_cuda_graph_replay(meta, live, static_forward_batch=static)
    assert backend._kv_end.shape == (2,)


def test_the_served_sync_probe_counts_its_own_threads_syncs_and_passes_others_on(caplog):
    """MEPIC_SYNC_DEBUG on a GPU server: torch's sync debug mode around each watched call; a synchronising
    operation warns in the thread that made it. Here the mode setter is a stand-in (a CPU build has no
    CUDA) and the warning is raised as torch raises it."""
    import threading
    import warnings

    from sglang_mepic.attention import sync_probe

    modes = []
    probe = sync_probe.SyncProbe("warn", get_mode=lambda: 0, set_mode=modes.append)

    def syncs():
        warnings.warn("called a synchronizing CUDA operation")

    def elsewhere():
        thread = threading.Thread(target=syncs)
        thread.start()
        thread.join()

    watched = probe.wrap("init_forward_metadata", lambda: syncs() or 7)
    with caplog.at_level("WARNING", logger=sync_probe.__name__):
        assert watched() == 7
        watched()
        with pytest.warns(UserWarning, match="synchronizing"):  # another thread's: passed on, not counted
            probe.wrap("positions.assign", elsewhere)()
        probe.wrap("outer", lambda: probe.wrap("inner", syncs)())()  # nested: the outer call's
    assert probe.syncs == {"init_forward_metadata": 2, "outer": 1} and probe.calls == 4
    assert modes == ["warn", 0] * 4
    found = [r.getMessage() for r in caplog.records if "synchronised" in r.getMessage()]
    assert len(found) == 2 and found[0].startswith(sync_probe.LOG_PREFIX + " init_forward_metadata synchronised")
    assert "test_host_syncs.py" in found[0]  # where: the innermost frames
    from sglang_mepic import env

    with pytest.raises(ValueError, match="MEPIC_SYNC_DEBUG"):
        env.Settings.from_env({"MEPIC_SYNC_DEBUG": "loud"})
    assert env.Settings.from_env({"MEPIC_SYNC_DEBUG": "Warn"}).sync_debug == "warn"
    assert env.Settings.from_env({"MEPIC_SYNC_DEBUG": "off"}).sync_debug is None
