"""The CUDA stand-in for sgl_kernel (eval/gpu/e2e/sgl_kernel_standin), checked on CPU.

The .venv has the CPU import shim installed as `sgl_kernel`, so the checks run in subprocesses
with the stand-in first on PYTHONPATH (independent of test order), two of them:

* "torch": torch pretends to be CUDA (is_available, version.cuda, capability 9.0), so SGLang's
  `_is_cuda` branches import from the stand-in as on the device. Each implemented function is
  compared with SGLang's torch-native form (RMSNorm/GemmaRMSNorm/SiluAndMul/GeluAndMul/
  RotaryEmbedding.forward_native), at SGLang's own call sites where they run on CPU
  (RMSNorm.forward_cuda, GemmaRMSNorm.forward_cuda, SiluAndMul.forward_cuda), with in-place
  semantics, `out=`, neox and GPT-J rotary, Llama-3 rope scaling, partial rotary, the
  non-contiguous q/k views of a packed qkv; no host synchronisation (an aten-level trace);
  the stubs and the absent names, and SGLang's own probes seeing them absent.
* "triton": TRITON_INTERPRET=1 and SGL_KERNEL_STANDIN_TRITON=triton: the Triton kernels,
  against the stand-in's torch forms (which the first process checks against SGLang).

Tolerances: float32 1e-5 (the same float32 math; only reduction order differs); bfloat16
against a float32 reference rounded once: 1 bf16 ulp (rtol 2**-7, plus atol 1e-3); against
SGLang's bf16 native forms, which round intermediates in bf16 (SiluAndMul, RotaryEmbedding):
4 ulps (rtol 2**-5, atol 2e-2).

Plus: `pip wheel --no-deps --no-build-isolation` of the folder, offline, gives a wheel whose
files are the package, and the wheel installed with --target imports as the stand-in.
"""

import json
import os
import shutil
import subprocess
import sys
import traceback
import zipfile
from pathlib import Path

import pytest

# Each check runs SGLang in a subprocess (and builds a wheel with pip): about a minute in all on 2 cores.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "eval" / "gpu" / "e2e" / "sgl_kernel_standin"
F32 = dict(rtol=1e-5, atol=1e-5)
BF16_ONE_ROUNDING = dict(rtol=2 ** -7, atol=1e-3)
BF16_VS_BF16_NATIVE = dict(rtol=2 ** -5, atol=2e-2)

CHECKS = {"torch": {}, "triton": {}}


def check(*modes):
    def register(fn):
        for mode in modes:
            CHECKS[mode][fn.__name__] = fn
        return fn
    return register


# ----------------------------------------------------------------------------------------------
# helpers, used inside the subprocesses


def _fake_cuda():
    """torch on CPU answering like one H100, before SGLang is imported (its `_is_cuda`)."""
    import torch

    class _Props:
        name = "NVIDIA H100 80GB HBM3"
        major, minor, multi_processor_count = 9, 0, 132
        total_memory, warp_size, L2_cache_size = 80 * 2 ** 30, 32, 50 * 2 ** 20

    torch.cuda.is_available = lambda: True
    torch.version.cuda = "13.0"
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    torch.cuda.current_device = lambda: 0
    torch.cuda.device_count = lambda: 1
    torch.cuda.get_device_name = lambda *a, **k: _Props.name
    torch.cuda.get_device_properties = lambda *a, **k: _Props()


def _close(actual, expected, tol, what=""):
    import torch

    torch.testing.assert_close(actual.float(), expected.float(), **tol, msg=lambda m: f"{what}: {m}")


def _bf16_tol(dtype):
    import torch

    return BF16_ONE_ROUNDING if dtype == torch.bfloat16 else F32


def _backend(name):
    os.environ["SGL_KERNEL_STANDIN_TRITON"] = name


class _HostSyncTrace:
    """Records aten ops; those that need the host to read device data are what a CUDA graph
    cannot capture (.item(), .tolist(), nonzero, masked_select, unique, data-dependent shapes)."""

    SYNCING = ("_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique", "item", "equal",
               "is_nonzero", "_assert_async", "repeat_interleave")

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        outer = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                outer.ops.append(func.__name__.split(".")[0])
                return func(*args, **(kwargs or {}))

        self.ops = []
        self.mode = Mode()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)

    def syncing(self):
        return sorted({op for op in self.ops if op.lstrip("_") in {s.lstrip("_") for s in self.SYNCING}})


# ----------------------------------------------------------------------------------------------
# checks against SGLang (torch mode)


@check("torch")
def imports_the_standin():
    import sgl_kernel

    assert Path(sgl_kernel.__file__).resolve().is_relative_to(STANDIN.resolve()), sgl_kernel.__file__
    assert sgl_kernel.STANDIN and sgl_kernel.__version__ == "0.0.0+mepic"


@check("torch")
def rmsnorm_vs_sglang_native():
    import torch
    import sgl_kernel
    from sglang.srt.layers.layernorm import RMSNorm

    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        norm = RMSNorm(96, eps=1e-5).to(dtype)
        norm.weight.data.normal_(1.0, 0.2)
        x = torch.randn(13, 96, dtype=dtype) * 3
        expected = norm.forward_native(x)
        _close(sgl_kernel.rmsnorm(x, norm.weight.data, 1e-5), expected, _bf16_tol(dtype), f"rmsnorm {dtype}")
        out = torch.full_like(x, float("nan"))
        returned = sgl_kernel.rmsnorm(x, norm.weight.data, 1e-5, out=out)
        assert returned is out
        _close(out, expected, _bf16_tol(dtype), f"rmsnorm out= {dtype}")
        wide = torch.randn(13, 2 * 96, dtype=dtype)
        view = wide[:, 16:112]  # rows 192 apart: not contiguous
        _close(sgl_kernel.rmsnorm(view, norm.weight.data, 1e-5), norm.forward_native(view.contiguous()),
               _bf16_tol(dtype), f"rmsnorm non-contiguous {dtype}")


@check("torch")
def fused_add_rmsnorm_in_place_vs_sglang_native():
    import torch
    import sgl_kernel
    from sglang.srt.layers.layernorm import RMSNorm

    torch.manual_seed(1)
    for dtype in (torch.float32, torch.bfloat16):
        norm = RMSNorm(128, eps=1e-6).to(dtype)
        norm.weight.data.normal_(1.0, 0.2)
        x, residual = torch.randn(9, 128, dtype=dtype), torch.randn(9, 128, dtype=dtype) * 4
        expected_out, expected_residual = norm.forward_native(x, residual)
        x_in, r_in = x.clone(), residual.clone()
        assert sgl_kernel.fused_add_rmsnorm(x_in, r_in, norm.weight.data, 1e-6) is None
        _close(x_in, expected_out, _bf16_tol(dtype), f"fused_add_rmsnorm input {dtype}")
        _close(r_in, expected_residual, F32 if dtype == torch.float32 else dict(rtol=0, atol=0),
               f"fused_add_rmsnorm residual {dtype}")


@check("torch")
def rmsnorm_at_sglang_call_site():
    """RMSNorm.forward_cuda, as the model calls it on CUDA: 2-D and 3-D (reshaped) inputs, with
    and without residual; results in place in the tensors SGLang passed."""
    import torch
    import sgl_kernel
    from sglang.srt.layers import layernorm

    assert layernorm.rmsnorm is sgl_kernel.rmsnorm and layernorm.fused_add_rmsnorm is sgl_kernel.fused_add_rmsnorm
    torch.manual_seed(2)
    for dtype in (torch.float32, torch.bfloat16):
        norm = layernorm.RMSNorm(64, eps=1e-5).to(dtype)
        norm.weight.data.normal_(1.0, 0.2)
        for shape in ((7, 64), (2, 5, 64)):
            x, residual = torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype)
            _close(norm.forward_cuda(x.clone()), norm.forward_native(x), _bf16_tol(dtype), f"forward_cuda {shape}")
            x_in, r_in = x.clone(), residual.clone()
            out, res = norm.forward_cuda(x_in, r_in)
            ref_out, ref_res = norm.forward_native(x, residual)
            _close(out, ref_out, _bf16_tol(dtype), f"forward_cuda+residual {shape} {dtype}")
            _close(res, ref_res, F32, f"forward_cuda residual {shape} {dtype}")
            if len(shape) == 2:
                assert out is x_in and res is r_in, "fused_add_rmsnorm must work in place"


@check("torch")
def gemma_rmsnorm_vs_sglang_native():
    import torch
    import sgl_kernel
    from sglang.srt.layers.layernorm import GemmaRMSNorm

    torch.manual_seed(3)
    norm = GemmaRMSNorm(64, eps=1e-6)
    norm.weight.data.normal_(0.0, 0.2)
    x, residual = torch.randn(6, 64), torch.randn(6, 64)
    _close(sgl_kernel.gemma_rmsnorm(x, norm.weight.data, 1e-6), norm.forward_native(x), F32, "gemma_rmsnorm")
    x_in, r_in = x.clone(), residual.clone()
    sgl_kernel.gemma_fused_add_rmsnorm(x_in, r_in, norm.weight.data, 1e-6)
    ref_out, ref_res = norm.forward_native(x, residual)
    _close(x_in, ref_out, F32, "gemma_fused_add_rmsnorm input")
    _close(r_in, ref_res, F32, "gemma_fused_add_rmsnorm residual")
    out, res = norm.forward_cuda(x.clone(), residual.clone())
    _close(out, ref_out, F32, "GemmaRMSNorm.forward_cuda")


@check("torch")
def act_and_mul_vs_sglang_native():
    import torch
    import sgl_kernel
    from sglang.srt.layers.activation import GeluAndMul, SiluAndMul

    torch.manual_seed(4)
    cases = ((sgl_kernel.silu_and_mul, SiluAndMul()), (sgl_kernel.gelu_and_mul, GeluAndMul("none")),
             (sgl_kernel.gelu_tanh_and_mul, GeluAndMul("tanh")))
    for fn, module in cases:
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(3, 5, 2 * 40, dtype=dtype) * 3
            name = f"{fn.__name__} {dtype}"
            got = fn(x)
            assert got.shape == (3, 5, 40) and got.dtype == dtype
            _close(got, module.forward_native(x.float()), _bf16_tol(dtype), name + " vs float32 native")
            _close(got, module.forward_native(x), BF16_VS_BF16_NATIVE if dtype == torch.bfloat16 else F32,
                   name + " vs native")
            out = torch.full((3, 5, 40), float("nan"), dtype=dtype)
            assert fn(x, out) is out
            _close(out, got, dict(rtol=0, atol=0), name + " out=")
            try:
                fn(x, torch.empty(3, 5, 41, dtype=dtype))
            except AssertionError:
                pass
            else:
                raise AssertionError(f"{name}: an `out` of the wrong shape was accepted")


@check("torch")
def silu_and_mul_at_sglang_call_site():
    """SiluAndMul.forward_cuda routes widths its JIT kernel cannot vectorise (d % 8 for bf16,
    d % 4 for float32) to sgl_kernel.silu_and_mul(input, out)."""
    import torch
    import sgl_kernel
    from sglang.srt.layers import activation

    assert activation._sgl_silu_and_mul is sgl_kernel.silu_and_mul
    module = activation.SiluAndMul()
    for dtype, d in ((torch.bfloat16, 36), (torch.float32, 35)):
        x = torch.randn(4, 2 * d, dtype=dtype)
        assert not activation._jit_act_supported(torch.empty(4, d, dtype=dtype))
        _close(module.forward_cuda(x), module.forward_native(x.float()), _bf16_tol(dtype), f"forward_cuda {dtype}")


def _rope(rope_scaling=None, head=128, rotary=128, neox=True):
    import torch
    from sglang.srt.layers.rotary_embedding import get_rope

    return get_rope(head, rotary, 4096, 500000, neox, rope_scaling, torch.bfloat16)


LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}


@check("torch")
def rope_vs_sglang_native():
    """apply_rope_with_cos_sin_cache_inplace and rotary_embedding against RotaryEmbedding.
    forward_native: neox and GPT-J, Llama-3 scaling, partial rotary, positions in any order,
    q/k as the non-contiguous splits of a packed qkv (as LlamaAttention passes them), in place."""
    import torch
    import sgl_kernel

    torch.manual_seed(5)
    configs = [(None, 128, 128, True), (None, 128, 128, False), (LLAMA3_SCALING, 128, 128, True),
               (None, 128, 64, True), (None, 64, 64, False)]
    for scaling, head, rotary, neox in configs:
        rope = _rope(scaling, head, rotary, neox)
        assert rope.cos_sin_cache.dtype == torch.float32 and rope.cos_sin_cache.shape[-1] == rotary
        for dtype in (torch.float32, torch.bfloat16):
            name = f"rope scaling={bool(scaling)} head={head} rotary={rotary} neox={neox} {dtype}"
            tokens, q_heads, kv_heads = 11, 4, 2
            positions = torch.tensor([0, 1, 4095, 7, 3, 2048, 5, 5, 100, 9, 1000])
            qkv = torch.randn(tokens, (q_heads + 2 * kv_heads) * head, dtype=dtype)
            q, k, v = qkv.split([q_heads * head, kv_heads * head, kv_heads * head], dim=-1)
            assert not q.is_contiguous()
            v_before = v.clone()
            ref_q32, ref_k32 = rope.forward_native(positions, q.float(), k.float())
            ref_q, ref_k = rope.forward_native(positions, q.clone(), k.clone())
            sgl_kernel.apply_rope_with_cos_sin_cache_inplace(positions, q, k, head, rope.cos_sin_cache, neox)
            _close(q, ref_q32, _bf16_tol(dtype), name + " q")
            _close(k, ref_k32, _bf16_tol(dtype), name + " k")
            _close(q, ref_q, BF16_VS_BF16_NATIVE if dtype == torch.bfloat16 else F32, name + " q vs native")
            assert torch.equal(v, v_before), name + ": v changed"
            q2, k2 = torch.randn(tokens, q_heads, head, dtype=dtype), torch.randn(tokens, kv_heads, head, dtype=dtype)
            r_q, r_k = rope.forward_native(positions, q2.float().reshape(tokens, -1), k2.float().reshape(tokens, -1))
            sgl_kernel.rotary_embedding(positions, q2, k2, head, rope.cos_sin_cache.to(dtype), neox)
            tol = _bf16_tol(dtype) if dtype == torch.float32 else BF16_VS_BF16_NATIVE  # bf16 cache
            _close(q2.reshape(tokens, -1), r_q, tol, name + " rotary_embedding q")
            _close(k2.reshape(tokens, -1), r_k, tol, name + " rotary_embedding k")
    try:
        sgl_kernel.apply_rope_with_cos_sin_cache_inplace(positions, q, k, 128, rope.cos_sin_cache.half(), True)
    except ValueError:
        pass
    else:
        raise AssertionError("a non-float32 cos_sin_cache was accepted")


@check("torch")
def rope_fused_set_kv_buffer():
    import torch
    import sgl_kernel

    torch.manual_seed(6)
    rope = _rope()
    positions = torch.tensor([3, 0, 17])
    q, k, v = torch.randn(3, 2 * 128), torch.randn(3, 128), torch.randn(3, 128)
    k_buffer, v_buffer = torch.zeros(10, 1, 128), torch.zeros(10, 1, 128)
    loc = torch.tensor([7, 2, 5])
    ref_q, ref_k = rope.forward_native(positions, q.clone(), k.clone())
    arg = sgl_kernel.FusedSetKVBufferArg(value=v, k_buffer=k_buffer, v_buffer=v_buffer, k_scale=None, v_scale=None,
                                         cache_loc=loc)
    sgl_kernel.apply_rope_with_cos_sin_cache_inplace(positions, q, k, 128, rope.cos_sin_cache, True, arg)
    _close(q, ref_q, F32, "q")
    _close(k_buffer[loc].reshape(3, 128), ref_k, F32, "k_buffer")
    _close(v_buffer[loc].reshape(3, 128), v, F32, "v_buffer")
    assert k_buffer.abs().sum(dim=(1, 2)).nonzero().flatten().tolist() == [2, 5, 7]


@check("torch")
def no_host_sync():
    """What runs inside decode CUDA graphs reads no device value on the host."""
    import torch
    import sgl_kernel

    rope = _rope(LLAMA3_SCALING)
    x, r, w = torch.randn(4, 64, dtype=torch.bfloat16), torch.randn(4, 64, dtype=torch.bfloat16), torch.randn(64)
    gate_up = torch.randn(4, 2 * 48, dtype=torch.bfloat16)
    q, k = torch.randn(4, 2 * 128, dtype=torch.bfloat16), torch.randn(4, 128, dtype=torch.bfloat16)
    positions = torch.tensor([1, 2, 3, 4])
    probs = torch.softmax(torch.randn(4, 50), dim=-1)
    calls = {
        "rmsnorm": lambda: sgl_kernel.rmsnorm(x, w.to(x.dtype)),
        "fused_add_rmsnorm": lambda: sgl_kernel.fused_add_rmsnorm(x, r, w.to(x.dtype)),
        "silu_and_mul": lambda: sgl_kernel.silu_and_mul(gate_up),
        "apply_rope": lambda: sgl_kernel.apply_rope_with_cos_sin_cache_inplace(positions, q, k, 128,
                                                                              rope.cos_sin_cache, True),
        "rotary_embedding": lambda: sgl_kernel.rotary_embedding(positions, q, k, 128, rope.cos_sin_cache, True),
        "top_k_renorm_prob": lambda: sgl_kernel.top_k_renorm_prob(probs, torch.tensor([1, 5, 50, 3])),
        "top_p_renorm_prob": lambda: sgl_kernel.top_p_renorm_prob(probs, torch.tensor([0.1, 0.5, 1.0, 0.9])),
        "weak_ref_tensor": lambda: sgl_kernel.weak_ref_tensor(x),
    }
    for name, call in calls.items():
        with _HostSyncTrace() as trace:
            call()
        assert trace.ops, f"{name}: the trace saw no aten op"
        assert not trace.syncing(), f"{name} synchronises with the host: {trace.syncing()}"


@check("torch")
def weak_ref_tensor_shares_memory_without_owning_it():
    import torch
    import sgl_kernel
    from sglang.srt.model_executor.runner_backend_utils.weak_ref_tensor import weak_ref_tensors

    base = torch.arange(60, dtype=torch.float32).reshape(6, 10)
    view = base[1:5, 2:8:2]  # offset and strides
    use_count = torch._C._storage_Use_Count(base.untyped_storage()._cdata)
    weak = sgl_kernel.weak_ref_tensor(view)
    assert torch._C._storage_Use_Count(base.untyped_storage()._cdata) == use_count, "the weak ref owns the storage"
    assert (weak.data_ptr(), weak.shape, weak.stride(), weak.dtype) == (view.data_ptr(), view.shape, view.stride(),
                                                                        view.dtype)
    assert torch.equal(weak, view)
    weak.mul_(-1)
    assert torch.equal(view, -base[1:5, 2:8:2].abs()) and base[0, 0] == 0 and base[5, 9] == 59
    listed = weak_ref_tensors([view, view.T])  # SGLang's helper, over the stand-in
    assert [t.data_ptr() for t in listed] == [view.data_ptr()] * 2 and listed[1].stride() == view.T.stride()
    assert sgl_kernel.weak_ref_tensor(torch.empty(0, 3)).numel() == 0


def _renorm_reference(probs, keep):
    import torch

    kept = torch.where(keep, probs.double(), torch.zeros((), dtype=torch.float64))
    return (kept / kept.sum(-1, keepdim=True)).float()


@check("torch")
def top_k_top_p_renorm():
    import torch
    import sgl_kernel

    torch.manual_seed(7)
    probs = torch.softmax(torch.randn(5, 40) * 2, dim=-1)
    probs[4] = torch.tensor([0.3, 0.3, 0.2, 0.2] + [0.0] * 36)  # ties at the pivot are kept
    top_k = torch.tensor([1, 3, 40, 10, 3])
    got = sgl_kernel.top_k_renorm_prob(probs, top_k)
    for row in range(5):
        kth = probs[row].sort(descending=True).values[top_k[row] - 1]
        _close(got[row], _renorm_reference(probs[row], probs[row] >= kth), F32, f"top_k row {row}")
    assert (got[4] > 0).sum() == 4, "ties at the k-th probability must be kept"
    _close(sgl_kernel.top_k_renorm_prob(probs, 3), sgl_kernel.top_k_renorm_prob(probs, torch.full((5,), 3)), F32,
           "int k")
    top_p = torch.tensor([0.5, 0.9, 1.0, 0.01, 0.55])
    got = sgl_kernel.top_p_renorm_prob(probs, top_p)
    for row in range(5):
        desc = probs[row].double().sort(descending=True).values
        n = int((desc.cumsum(0) < top_p[row].double() - 1e-7).sum()) + 1  # smallest prefix reaching p
        keep = probs[row] >= desc[min(n, 40) - 1].float()
        _close(got[row], _renorm_reference(probs[row], keep), F32, f"top_p row {row}")
    assert got.dtype == torch.float32 and torch.allclose(got.sum(-1), torch.ones(5))


@check("torch")
def kvcacheio_transfers():
    import torch
    import sgl_kernel
    from sgl_kernel import kvcacheio

    torch.manual_seed(8)
    host_k, host_v = torch.randn(32, 2, 16, dtype=torch.bfloat16), torch.randn(32, 2, 16, dtype=torch.bfloat16)
    dev_k, dev_v = torch.zeros(24, 2, 16, dtype=torch.bfloat16), torch.zeros(24, 2, 16, dtype=torch.bfloat16)
    src, dst = torch.tensor([4, 5, 6, 7, 20, 21, 22, 23]), torch.tensor([8, 9, 10, 11, 0, 1, 2, 3])
    kvcacheio.transfer_kv_per_layer(host_k, dev_k, host_v, dev_v, src, dst, item_size=2 * 16 * 2)
    assert torch.equal(dev_k[dst], host_k[src]) and torch.equal(dev_v[dst], host_v[src])
    untouched = torch.ones(24, dtype=torch.bool)
    untouched[dst] = False
    assert dev_k[untouched].abs().sum() == 0
    try:
        kvcacheio.transfer_kv_per_layer(host_k, dev_k, host_v, dev_v, src, dst, item_size=64 * 3)
    except ValueError:
        pass
    else:
        raise AssertionError("a wrong item_size was accepted")
    mla_src, mla_dst = torch.randn(10, 1, 8), torch.zeros(6, 1, 8)
    kvcacheio.transfer_kv_per_layer_mla(mla_src, mla_dst, torch.tensor([9, 0]), torch.tensor([1, 4]), item_size=32)
    assert torch.equal(mla_dst[[1, 4]], mla_src[[9, 0]]) and mla_dst[[0, 2, 3, 5]].abs().sum() == 0
    layers_src = [torch.randn(16, 2, 4) for _ in range(4)]
    layers_dst = [torch.zeros(12, 2, 4) for _ in range(4)]
    kvcacheio.transfer_kv_direct(layers_src, layers_dst, torch.tensor([0, 1, 2, 3]), torch.tensor([4, 5, 6, 7]), 4)
    assert all(torch.equal(d[4:8], s[0:4]) and d[:4].abs().sum() == 0 for s, d in zip(layers_src, layers_dst))
    assert sgl_kernel._stub.is_stub(kvcacheio.transfer_kv_all_layer)


@check("torch")
def stubs_import_and_raise_naming_themselves():
    import importlib
    import sgl_kernel

    from sgl_kernel import merge_state_v2, some_future_kernel  # noqa: F401
    for fn, name in ((merge_state_v2, "merge_state_v2"), (some_future_kernel, "some_future_kernel")):
        try:
            fn(1, x=2)
        except NotImplementedError as e:
            assert f"{name} is not implemented" in str(e) and "sgl_kernel stand-in" in str(e), str(e)
        else:
            raise AssertionError(f"{name} did not raise")
    assert sgl_kernel.merge_state_v2 is merge_state_v2  # made once
    flash_attn = importlib.import_module("sgl_kernel.flash_attn")
    from sgl_kernel.flash_attn import flash_attn_varlen_func
    assert flash_attn.flash_attn_varlen_func is flash_attn_varlen_func
    from sgl_kernel.quantization.gguf import ggml_dequantize
    from sgl_kernel.elementwise import copy_to_gpu_no_ce
    from sgl_kernel import spatial  # a submodule of the real wheel: a stub module here
    assert spatial.__name__ == "sgl_kernel.spatial"
    for fn, name in ((flash_attn_varlen_func, "flash_attn.flash_attn_varlen_func"),
                     (ggml_dequantize, "quantization.gguf.ggml_dequantize"),
                     (copy_to_gpu_no_ce, "elementwise.copy_to_gpu_no_ce"),
                     (spatial.create_greenctx_stream_by_value, "spatial.create_greenctx_stream_by_value")):
        try:
            fn()
        except NotImplementedError as e:
            assert f"{name} is not implemented" in str(e), str(e)
        else:
            raise AssertionError(f"{name} did not raise")
    for private in ("__wrapped__", "_private_thing", "__file_attr__"):
        assert not hasattr(sgl_kernel, private), private


@check("torch")
def absent_names_are_absent():
    import importlib
    import torch
    import sgl_kernel

    for module in ("sgl_kernel.allreduce", "sgl_kernel.scalar_type", "sgl_kernel.allreduce.x"):
        try:
            importlib.import_module(module)
        except ImportError:
            pass
        else:
            raise AssertionError(f"{module} imported")
    statements = ["from sgl_kernel.kvcacheio import get_device_accessible_ptr",
                  "from sgl_kernel.kvcacheio import transfer_embedding_ranges_direct",
                  "from sgl_kernel.scalar_type import ScalarType, scalar_types",
                  "from sgl_kernel import allreduce"]
    statements += [f"from sgl_kernel import {name}" for name in sgl_kernel._stub.ABSENT_NAMES["sgl_kernel"]]
    for statement in statements:
        try:
            exec(statement, {})
        except ImportError:
            pass
        else:
            raise AssertionError(f"`{statement}` succeeded")
    for name in (*sgl_kernel._stub.ABSENT_NAMES["sgl_kernel"], *sgl_kernel._stub.ABSENT_SUBMODULES):
        assert not hasattr(sgl_kernel, name), name
    assert not hasattr(sgl_kernel.kvcacheio, "get_device_accessible_ptr")
    for op in ("get_device_accessible_ptr", "convert_weight_packed", "transfer_embedding_ranges_direct", "rmsnorm"):
        assert not hasattr(torch.ops.sgl_kernel, op), f"torch.ops.sgl_kernel.{op} exists"


@check("torch")
def sglang_probes_take_their_fallbacks():
    """With `_is_cuda` true, SGLang's own availability probes see the absent names as absent,
    and its module-level `from sgl_kernel import ...` get the stand-in's functions."""
    import sgl_kernel
    from sglang.srt.distributed.device_communicators import custom_all_reduce_ops
    from sglang.srt.layers import sampler
    from sglang.srt.layers.attention import triton_backend
    from sglang.srt.layers.quantization import utils as quant_utils
    from sglang.srt.mem_cache import embedding_cache_controller
    from sglang.srt.mem_cache.pool_host import common as pool_common, mha
    from sglang.srt.utils import common, is_cuda

    assert is_cuda()
    assert custom_all_reduce_ops.IS_CUSTOM_AR_AVAILABLE is False
    assert quant_utils.ScalarType.__name__ == "MockScalarType"
    assert pool_common._resolve_device_accessible_ptr_fn() is None
    assert embedding_cache_controller.transfer_embedding_ranges_direct is None
    assert common._is_intel_amx_backend_available() is False
    assert sampler.top_k_renorm_prob is sgl_kernel.top_k_renorm_prob
    assert sampler.top_p_renorm_prob is sgl_kernel.top_p_renorm_prob
    assert triton_backend.is_arch_support_pdl is sgl_kernel.utils.is_arch_support_pdl
    assert triton_backend.is_arch_support_pdl() is True  # capability 9.0, as the real wheel says on an H100
    assert mha.transfer_kv_direct is sgl_kernel.kvcacheio.transfer_kv_direct
    assert mha.transfer_kv_per_layer is sgl_kernel.kvcacheio.transfer_kv_per_layer


# ----------------------------------------------------------------------------------------------
# Triton kernels (TRITON_INTERPRET=1) against the torch forms


class _Count:
    def __init__(self, module, names):
        self.calls = {name: 0 for name in names}
        for name in names:
            original = getattr(module, name)

            def counted(*args, _original=original, _name=name, **kwargs):
                self.calls[_name] += 1
                return _original(*args, **kwargs)

            setattr(module, name, counted)


def _both(fn, *args):
    """fn(*args) with the Triton kernels and with torch, on clones of the tensor arguments."""
    import torch

    results = []
    for backend in ("triton", "torch"):
        _backend(backend)
        cloned = [torch.empty_strided(a.shape, a.stride(), dtype=a.dtype).copy_(a) if isinstance(a, torch.Tensor)
                  else a for a in args]  # clones with the same strides (clone() would compact them)
        results.append((fn(*cloned), cloned))
    _backend("triton")
    return results


@check("triton")
def triton_kernels_run():
    import os as _os
    from sgl_kernel import _triton, elementwise

    assert _os.environ.get("TRITON_INTERPRET") == "1"
    assert elementwise._triton() is _triton


@check("triton")
def triton_rmsnorm_and_fused_add():
    import torch
    import sgl_kernel
    from sgl_kernel import _triton

    count = _Count(_triton, ["rmsnorm_rows"])
    torch.manual_seed(10)
    for dtype in (torch.float32, torch.bfloat16):
        for hidden in (64, 100, 4096):
            w = torch.randn(hidden, dtype=dtype)
            x = torch.randn(5, hidden, dtype=dtype) * 2
            (tri, _), (ref, _) = _both(lambda a, b: sgl_kernel.rmsnorm(a, b, 1e-6), x, w)
            _close(tri, ref, _bf16_tol(dtype), f"rmsnorm {dtype} {hidden}")
            (_, (tx, tr, _)), (_, (rx, rr, _)) = _both(
                lambda a, b, c: sgl_kernel.fused_add_rmsnorm(a, b, c, 1e-6), x, torch.randn_like(x), w)
            _close(tx, rx, _bf16_tol(dtype), f"fused_add_rmsnorm input {dtype} {hidden}")
            _close(tr, rr, _bf16_tol(dtype), f"fused_add_rmsnorm residual {dtype} {hidden}")
            (tri, _), (ref, _) = _both(lambda a, b: sgl_kernel.gemma_rmsnorm(a, b, 1e-6), x, w)
            _close(tri, ref, _bf16_tol(dtype), f"gemma_rmsnorm {dtype} {hidden}")
        wide = torch.randn(3, 4, 160, dtype=dtype)
        x3 = wide[:, :3, :96]  # 3-D, not viewable as 2-D rows -> the torch form
        x2 = wide.reshape(12, 160)[:, 32:128]  # 2-D, strided rows -> Triton
        w = torch.randn(96, dtype=dtype)
        for x in (x2, x3):
            (tri, _), (ref, _) = _both(lambda a, b: sgl_kernel.rmsnorm(a, b, 1e-6, out=torch.empty_like(a)), x, w)
            _close(tri, ref, _bf16_tol(dtype), f"rmsnorm strided {tuple(x.shape)} {dtype}")
        out = torch.empty(12, 96, dtype=dtype)
        assert sgl_kernel.rmsnorm(x2, w, 1e-6, out=out) is out
    assert count.calls["rmsnorm_rows"] == 2 * (3 * 3 + 2), count.calls  # x3 went to torch


@check("triton")
def triton_act_and_mul():
    import torch
    import sgl_kernel
    from sgl_kernel import _triton

    count = _Count(_triton, ["act_and_mul_rows"])
    torch.manual_seed(11)
    for fn in (sgl_kernel.silu_and_mul, sgl_kernel.gelu_and_mul, sgl_kernel.gelu_tanh_and_mul):
        for dtype in (torch.float32, torch.bfloat16):
            for shape in ((7, 2 * 48), (2, 3, 2 * 1500)):
                x = torch.randn(shape, dtype=dtype) * 4
                (tri, _), (ref, _) = _both(fn, x)
                _close(tri, ref, _bf16_tol(dtype), f"{fn.__name__} {dtype} {shape}")
                out = torch.empty(shape[:-1] + (shape[-1] // 2,), dtype=dtype)
                assert fn(x, out) is out
                _close(out, ref, _bf16_tol(dtype), f"{fn.__name__} out= {dtype} {shape}")
    assert count.calls["act_and_mul_rows"] >= 24, count.calls


@check("triton")
def triton_rope():
    import torch
    import sgl_kernel
    from sgl_kernel import _triton

    count = _Count(_triton, ["rope_inplace"])
    torch.manual_seed(12)
    for dtype in (torch.float32, torch.bfloat16):
        for head, rotary, neox in ((128, 128, True), (128, 128, False), (128, 64, True), (64, 32, False)):
            cache = torch.randn(300, rotary)
            positions = torch.tensor([5, 0, 299, 17, 17, 3], dtype=torch.int32)
            qkv = torch.randn(6, (32 + 2 * 8) * head, dtype=dtype)
            results = []
            for backend in ("triton", "torch"):
                _backend(backend)
                packed = qkv.clone()
                q, k, _ = packed.split([32 * head, 8 * head, 8 * head], dim=-1)
                sgl_kernel.apply_rope_with_cos_sin_cache_inplace(positions, q, k, head, cache, neox)
                results.append(packed)
            _backend("triton")
            _close(results[0], results[1], _bf16_tol(dtype), f"rope {dtype} {head}/{rotary} neox={neox}")
            assert torch.equal(results[0][:, 40 * head:], qkv[:, 40 * head:]), "v changed"
    assert count.calls["rope_inplace"] >= 16, count.calls


# ----------------------------------------------------------------------------------------------
# subprocess entry point and the tests


def _run(mode: str, out: Path) -> None:
    if mode == "torch":
        _backend("torch")
        _fake_cuda()
    results = {}
    for name, fn in CHECKS[mode].items():
        try:
            fn()
            results[name] = "ok"
        except BaseException:  # noqa: BLE001 - report every failure, keep checking
            results[name] = traceback.format_exc()
    out.write_text(json.dumps(results))


def _subprocess_env(mode: str) -> dict:
    env = dict(os.environ)
    paths = [str(STANDIN), str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.pop("TRITON_INTERPRET", None)
    if mode == "triton":
        env["TRITON_INTERPRET"] = "1"
        env["SGL_KERNEL_STANDIN_TRITON"] = "triton"
    else:
        env["SGL_KERNEL_STANDIN_TRITON"] = "torch"
    env["SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK"] = "1"
    return env


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    cache = {}

    def get(mode):
        if mode not in cache:
            out = tmp_path_factory.mktemp(f"standin-{mode}") / "results.json"
            proc = subprocess.run([sys.executable, __file__, mode, str(out)], env=_subprocess_env(mode),
                                  capture_output=True, text=True, timeout=600, cwd=REPO)
            assert proc.returncode == 0 and out.exists(), f"checker ({mode}) failed:\n{proc.stdout}\n{proc.stderr}"
            cache[mode] = json.loads(out.read_text())
        return cache[mode]

    return get


@pytest.mark.parametrize("mode,name", [(m, n) for m in CHECKS for n in CHECKS[m]])
def test_standin(results, mode, name):
    outcome = results(mode)[name]
    assert outcome == "ok", f"{mode}/{name}:\n{outcome}"


def _package_files(root: Path) -> set:
    return {p.relative_to(root).as_posix() for p in (root / "sgl_kernel").rglob("*.py")}


def test_pip_wheel_builds_the_package_offline(tmp_path):
    source = tmp_path / "src"
    shutil.copytree(STANDIN, source, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info", "dist"))
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", str(source),
                           "-w", str(tmp_path / "dist")], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wheels = list((tmp_path / "dist").glob("*.whl"))
    assert [w.name for w in wheels] == ["sglang_mepic_sgl_kernel_standin-0.0.0+mepic-py3-none-any.whl"]
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = set(wheel.namelist())
    dist_info = {n for n in names if n.startswith("sglang_mepic_sgl_kernel_standin-0.0.0+mepic.dist-info/")}
    assert names - dist_info == _package_files(STANDIN), sorted(names ^ (dist_info | _package_files(STANDIN)))
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--target", str(site),
                           str(wheels[0])], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    probe = ("import sgl_kernel, sys; from sgl_kernel import rmsnorm, kvcacheio, utils; "
             "assert sgl_kernel.STANDIN; print(sgl_kernel.__file__)")
    proc = subprocess.run([sys.executable, "-c", probe], env=dict(env, PYTHONPATH=str(site)), capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).resolve().is_relative_to(site.resolve()), proc.stdout


if __name__ == "__main__":
    _run(sys.argv[1], Path(sys.argv[2]))
