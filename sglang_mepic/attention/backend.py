"""The `mepic` attention backend (`--attention-backend mepic`).

Keys are written to the KV pool in NoPE form: the `rotary_embedding_forward`
patch lets the model rotate queries only, for the rotary modules this backend
validated at start-up. We bypass the rotation rather than un-rotating stored
keys, because un-rotating is a lossy round trip and would make the no-chunk
path differ from SGLang's. At attention time each key is rotated at its slot's
position in the request (`positions.PositionMap`). On CPU the math runs in
torch (`attention.attend`); the Triton kernels in `sglang_mepic.kernels` are
the GPU path of the same semantics.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, cast

import torch

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.mem_cache.memory_pool import KVWriteLoc

from sglang_mepic import env, modes
from sglang_mepic.attention import sync_probe
from sglang_mepic.attention.reference import (DecodeKV, DecodeRows, PagedContext, attend_causal, attend_context,
                                              attend_paged)
from sglang_mepic.attention.rope import Rope, UnsupportedRope
from sglang_mepic.pages import positions

if TYPE_CHECKING:
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.mem_cache.memory_pool import KVCache, MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.model_executor.model_runner import ModelRunner

    from sglang_mepic.kernels.attention import DecodeWorkspace

logger = logging.getLogger(__name__)

BACKEND_NAME = "mepic"
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


@dataclass
class GraphBuffers:
    """What captured decode launches read beside the runner's own buffers; fixed addresses."""

    splits: torch.Tensor  # [max_bs] int32: kv splits per request
    workspace: DecodeWorkspace | None = None  # for max_bs rows, made at the first captured decode
    active: bool = False  # the current decode forward is a graph capture or replay


@dataclass
class PrefillGraphMetadata:
    """What a captured prefill bucket keeps (SGLang stores it per bucket and hands it back at each replay):
    the bucket's tokens. The state the breaks read is the backend's own, set by the replay hook."""

    num_tokens: int


# The KV dtypes the torch path and the kernels read: a float pool, or SGLang's fp8 pool (stored as
# uint8, read through a float8 view) with its per-layer k/v scales (`kv_scales`).
FP8_KV_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def check_kv_dtype(token_to_kv_pool: KVCache) -> torch.dtype:
    """The pool's KV dtype (its logical one: SGLang stores fp8 as uint8), or refuse a pool this backend cannot
    read: one SGLang quantizes with block scales of its own (`is_quantized_kv_cache`: fp4, mxfp8), an fp8 format
    but e4m3fn/e5m2, or no float at all."""
    dtype = getattr(token_to_kv_pool, "dtype", None)
    if dtype is None and hasattr(token_to_kv_pool, "get_key_buffer"):
        dtype = token_to_kv_pool.get_key_buffer(0).dtype
    readable = dtype is not None and (dtype in FP8_KV_DTYPES or dtype.is_floating_point and dtype.itemsize >= 2)
    if getattr(token_to_kv_pool, "is_quantized_kv_cache", False) or not readable:
        raise ValueError(f"--attention-backend mepic cannot read a {dtype} KV cache"
                         f"{' quantized with block scales' if readable else ''}: use --kv-cache-dtype auto, bf16, "
                         "fp8_e4m3 or fp8_e5m2")
    return dtype


def kv_scales(layer: torch.nn.Module, fp8_pool: bool) -> tuple[float, float]:
    """What the pool's keys and values are multiplied by when read: the layer's scales when both are set and the
    pool is fp8 (SGLang's pool divides by them only when it casts to fp8: a checkpoint's scales over a bf16 cache
    leave it unscaled), else 1. As host floats: SGLang keeps a checkpoint's as `k_scale_float`, and a
    `--quantization-param-path` file's as `k_scale` itself, a float; a tensor is read once (`MepicAttnBackend`
    asks before any forward)."""
    k, v = getattr(layer, "k_scale", None), getattr(layer, "v_scale", None)
    if not fp8_pool or k is None or v is None:
        return 1.0, 1.0
    k_float, v_float = getattr(layer, "k_scale_float", None), getattr(layer, "v_scale_float", None)
    return float(k if k_float is None else k_float), float(v if v_float is None else v_float)


def _rotary_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for name, m in model.named_modules() if name.endswith("rotary_emb")]


class MepicAttnBackend(AttentionBackend):
    def __init__(self, model_runner: ModelRunner, settings: env.Settings) -> None:
        super().__init__()
        from sglang.srt.runtime_context import get_parallel

        tp = get_parallel().attn_tp_size
        model = model_runner.model_config
        self._graph_heads = (model.num_attention_heads // tp, model.get_num_kv_heads(tp))
        # The runner made its pools before its attention backend; a model this backend serves (full attention,
        # SUPPORTED_ARCHITECTURES) has an MHA pool.
        self._attach(model_runner.device, cast("ReqToTokenPool", model_runner.req_to_token_pool),
                     cast("MHATokenToKVPool", model_runner.token_to_kv_pool), self._take_over_rotary(model_runner),
                     model_runner.dtype, settings)
        # Every attention layer's scales, read now: a forward (a CUDA graph's capture among them) reads no tensor.
        for module in model_runner.model.modules():
            if isinstance(getattr(module, "layer_id", None), int) and hasattr(module, "k_scale"):
                self._layer_scales[module.layer_id] = kv_scales(module, self.fp8_kv)
        self.sync_probe = sync_probe.install(self, settings.sync_debug)  # GPU runs: per-batch calls watched

    @classmethod
    def over_pools(cls, req_to_token: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, rope: Rope,
                   q_heads: int | None = None, q_dtype: torch.dtype | None = None,
                   settings: env.Settings | None = None) -> MepicAttnBackend:
        """A backend around bare tensors, without a model runner (tests, benchmarks). `q_dtype`: the model's
        (default: the pool's, bf16 over an fp8 pool); `settings`: default, this process's."""

        class Pool:
            def get_key_buffer(self, layer_id: int) -> torch.Tensor:
                return k_pool

            def get_value_buffer(self, layer_id: int) -> torch.Tensor:
                return v_pool

        backend = cls.__new__(cls)
        AttentionBackend.__init__(backend)
        backend._graph_heads = (q_heads or k_pool.shape[1], k_pool.shape[1])
        # Stand-ins for the runner's pools: the reads the backend makes of them.
        backend._attach(k_pool.device, type("ReqToTokenPool", (), {"req_to_token": req_to_token})(),
                        cast("MHATokenToKVPool", Pool()), rope,
                        q_dtype or (torch.bfloat16 if k_pool.dtype in FP8_KV_DTYPES else k_pool.dtype),
                        settings or env.settings())
        return backend

    def _attach(self, device: torch.device | str, req_to_token_pool: ReqToTokenPool,
                token_to_kv_pool: MHATokenToKVPool, rope: Rope, q_dtype: torch.dtype,
                settings: env.Settings) -> None:
        self.device = device
        self.q_dtype = q_dtype  # the model's: queries and outputs (the pool may hold fp8)
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool = token_to_kv_pool
        self.positions = positions.attach(req_to_token_pool)  # the scheduler side finds it through the pool
        self.rope = rope
        self.decode_kv = DecodeKV(rope)
        self.decode_rows: DecodeRows | None = None  # a torch-path decode's rows that read decode_kv
        self.decode_general: list[int] = []  # its other rows (attend_paged), by index in the batch
        self._decoding: list[int] = []  # the rows of the last torch-path decode, whose decode_kv entries an extend keeps
        # A torch-path extend's contexts for every layer, by index in the batch, with the (row, seq_len, queries)
        # each was found for: a forward the backend did not prepare (tests) finds its own.
        self._contexts: dict[int, tuple[tuple[int, int, int], PagedContext]] = {}
        self.copies: tuple[torch.Tensor, torch.Tensor] | None = None  # (extend token index, batch index)
        self.blend: modes.Mode | None = None
        self.settings = settings
        mode = settings.mode
        if modes.planning(mode) is modes.Planning.BLEND:
            layers = getattr(token_to_kv_pool, "layer_num", mode.check_layer + 1)
            self.blend = dataclasses.replace(mode, check_layer=modes.blend_check_layer(mode, layers))
        kv_dtype = check_kv_dtype(token_to_kv_pool)
        self.fp8_kv = kv_dtype in FP8_KV_DTYPES
        self._layer_scales: dict[int, tuple[float, float]] = {}  # layer id -> (k, v) scale (`_scales`)
        if self.fp8_kv:
            logger.info("mepic attention: fp8 KV cache (%s), NoPE keys widened and scaled before rotation",
                        str(kv_dtype).removeprefix("torch."))
        self.use_triton = torch.device(device).type == "cuda"
        self.graph: GraphBuffers | None = None
        # SGLang's breakable prefill runner captured with this backend's hooks (it then calls the replay hook).
        self._prefill_graph_hooks = False
        # MEPIC_PREFILL_GRAPHS_OFF_FILE: while this file exists, prefill graphs are declined (eval/gpu/e2e compares
        # one server's greedy tokens with and without them, on the same weights and cache state).
        self._eager_switch = settings.prefill_graphs_off_file
        # Split decode's partial results, reused by every layer of an eager forward: one per CUDA stream,
        # since two streams' decodes (e.g. overlapped micro-batches) would otherwise share it.
        self._workspaces: dict[int, DecodeWorkspace] = {}
        self._splits = None  # this decode forward's split counts (device), computed once for every layer
        self._kv_end = None  # this extend forward's key-loop bounds (device), computed once for every layer
        if self.use_triton:
            from sglang_mepic.kernels import attention as kernels

            self._use_kernels(kernels)

    def _use_kernels(self, kernels: ModuleType) -> None:
        kernels.check_shapes(self.rope.head_size, self.rope.rotary_dim, 1, 1)
        arch = kernels.device_arch(self.device)
        if self.fp8_kv and arch < kernels.FP8_MIN_ARCH:
            raise ValueError(f"--kv-cache-dtype fp8: the mepic kernels read an fp8 cache on sm_{kernels.FP8_MIN_ARCH} "
                             f"and later GPUs (Ada, Hopper, Blackwell); this one is sm_{arch}: use --kv-cache-dtype "
                             "auto or bf16")
        self.use_triton = True
        self.kernels = kernels
        self.cos_sin = self.rope.cos_sin_cache.float().contiguous()
        # cos/sin computed on chip when the model's cache is cos(p * inv_freq) * mscale (what
        # `Rope.frequencies` detects), else read from its fp32 table. Measured on an H100
        # (eval/results/gpu/after.md), on chip was faster than the table in 8 of 10 cases (the table took
        # 6-18% longer on every extend, 1-10% at decode B>=8) and slower only at decode B=1.
        # MEPIC_ROPE_TABLE=1 forces the table; MEPIC_ROPE_ON_CHIP, which used to opt in to on chip, is no
        # longer read.
        table = self.settings.rope_table or kernels.DEFAULT_TABLE_ROPE
        freqs = None if table else self.rope.frequencies()
        self.rope_args = {} if freqs is None else dict(inv_freq=freqs[0].float().contiguous(), mscale=freqs[1])
        self.sm_count = kernels.sm_count(self.device)
        self.decode_ctas_per_sm = self._decode_capacity()
        logger.info("mepic attention: Triton kernels, RoPE cos/sin %s; decode kernel %d CTAs/SM on %d SMs",
                    "on chip" if freqs else "from the table", self.decode_ctas_per_sm, self.sm_count)

    def _decode_capacity(self) -> int:
        """CTAs per SM of the decode kernel this backend launches, what split counts are sized from.

        Asked once, here, before any decode or CUDA-graph capture: on a GPU Triton compiles the kernel
        for arguments specialized as a decode's are (the pools, the row tables, int64 request indices,
        lengths and positions; a query of the model's dtype) and the capacity comes from that compiled
        kernel's registers and shared memory (`kernels.decode_ctas_per_sm`); on a CPU, the static figure."""
        k_pool = self.token_to_kv_pool.get_key_buffer(0)
        v_pool = self.token_to_kv_pool.get_value_buffer(0)
        q = k_pool.new_empty((1, self._graph_heads[0], k_pool.shape[-1]), dtype=self.q_dtype)
        index = torch.zeros(1, dtype=torch.int64, device=k_pool.device)
        return self.kernels.decode_ctas_per_sm(
            q, k_pool, v_pool, self.req_to_token_pool.req_to_token, self.positions.req_to_pos, index, index + 1,
            index, self.cos_sin, self.rope.rotary_dim, self.rope.is_neox_style, 1.0, **self.rope_args)

    @staticmethod
    def _take_over_rotary(model_runner: ModelRunner) -> Rope:
        archs = getattr(model_runner.model_config.hf_config, "architectures", None) or []
        if not any(a in SUPPORTED_ARCHITECTURES for a in archs):
            raise UnsupportedRope(f"--attention-backend mepic supports {', '.join(SUPPORTED_ARCHITECTURES)}; "
                                  f"this model is {archs}")
        if getattr(model_runner.model_config.hf_config, "sliding_window", None) and \
                getattr(model_runner.model_config.hf_config, "use_sliding_window", True):
            raise UnsupportedRope("--attention-backend mepic does not support sliding-window attention")
        modules = _rotary_modules(model_runner.model)
        if not modules:
            raise UnsupportedRope("--attention-backend mepic needs a model with rotary position embedding; "
                                  "none was found")
        ropes = [Rope.from_module(m) for m in modules]
        first = ropes[0]
        shape = (first.rotary_dim, first.head_size, first.is_neox_style)
        for r in ropes[1:]:
            if (r.rotary_dim, r.head_size, r.is_neox_style) != shape or not torch.equal(r.cos_sin_cache,
                                                                                        first.cos_sin_cache):
                raise UnsupportedRope("--attention-backend mepic needs one RoPE for all layers")
        for m in modules:
            m.mepic_nope_key = True
        logger.info("mepic attention: NoPE keys, RoPE %s-style, rotary_dim %d of %d",
                    "neox" if first.is_neox_style else "gptj", first.rotary_dim, first.head_size)
        return first

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        """Per-forward state, read by every layer. On the Triton path the preparation is device ops only,
        with host figures from the batch's *_cpu fields (no host sync: SGLang's overlap scheduler runs
        ahead of the GPU; `tests/attention/test_host_syncs.py`); the torch path reads per-request values on the host."""
        self._reset()
        mode = forward_batch.forward_mode
        if not self.use_triton:
            self.rows = forward_batch.req_pool_indices.tolist()
            self.seq_lens = forward_batch.seq_lens.tolist()
            # Rows without a placement plan have slot j at position j: the plain fast path.
            self.plain_rows = (~self.positions.planned[forward_batch.req_pool_indices.long()]).tolist()
        # The model reads forward_batch.positions after this: planned rows get theirs here.
        if mode.is_decode():
            if not self.use_triton:
                self.decode_kv.keep_only(self.rows)
                self._decoding = self.rows
            forward_batch.positions = self.positions.on_decode(
                forward_batch.req_pool_indices, forward_batch.seq_lens, forward_batch.positions)
            if not self.use_triton:
                self._plan_decode(forward_batch.positions)
            if self.use_triton:
                batch = forward_batch.seq_lens.shape[0]
                self._splits = self.kernels.num_kv_splits(
                    forward_batch.seq_lens, self.kernels.decode_programs_per_split(batch, *self._graph_heads),
                    self.sm_count, ctas_per_sm=self.decode_ctas_per_sm)
        elif mode.is_extend():
            if not self.use_triton:  # its rows' entries are seeded afresh by its layers (`_run`)
                self.decode_kv.keep_only(set(self._decoding).difference(self.rows))
            self._prepare_extend(forward_batch, planned=True)

    def _reset(self) -> None:
        if self.graph is not None:
            self.graph.active = False
        self.copies = None
        self._splits = self._kv_end = None
        self.decode_rows = None
        self.decode_general = []
        self._contexts = {}

    def _plan_decode(self, new_positions: torch.Tensor) -> None:
        """Torch path: which rows of this decode read `decode_kv` (their new token has the largest position, so
        every real slot is visible), the rest `attend_paged`. Found once here for every layer."""
        req_to_token, req_to_pos = self.req_to_token_pool.req_to_token, self.positions.req_to_pos
        new = new_positions.tolist()
        cached: list[int] = []
        for i, (row, seq_len, plain) in enumerate(zip(self.rows, self.seq_lens, self.plain_rows)):
            if plain or int(req_to_pos[row, :seq_len].max()) <= new[i]:
                cached.append(i)
            else:
                self.decode_general.append(i)
        self.decode_kv.drop(self.rows[i] for i in self.decode_general)  # an extend's seeds they will not read
        rows = [self.rows[i] for i in cached]
        seq_lens = [self.seq_lens[i] for i in cached]
        index = torch.tensor(cached, dtype=torch.long, device=new_positions.device)
        row_index = torch.tensor(rows, dtype=torch.long, device=req_to_token.device)
        last = torch.tensor(seq_lens, dtype=torch.long, device=req_to_token.device) - 1  # long even when empty
        new_slots = req_to_token[row_index, last].long()

        def context(j: int) -> tuple[torch.Tensor, torch.Tensor | None]:
            slots = req_to_token[rows[j], :seq_lens[j]]
            if self.plain_rows[cached[j]]:
                return slots, None
            kv_pos = req_to_pos[rows[j], :seq_lens[j]]
            real = kv_pos >= 0  # pads (NO_POSITION) are left out
            return slots[real], kv_pos[real]

        self.decode_rows = DecodeRows(cached, rows, seq_lens, new_slots, new_positions.index_select(0, index).long(),
                                      context)

    def _prepare_extend(self, forward_batch: ForwardBatch, planned: bool) -> None:
        """An extend's positions, copied tokens and (Triton) key-loop bounds. `planned=False`: a capture's
        dummy batch, taken as identity rows whatever the map holds for them: nothing of the map is read
        for it and its positions tensor (the runner's static buffer) is kept."""
        if planned:
            rows_cpu = getattr(forward_batch, "req_pool_indices_cpu", None)
            forward_batch.positions = self.positions.on_extend(
                forward_batch.req_pool_indices, forward_batch.extend_prefix_lens, forward_batch.extend_seq_lens,
                forward_batch.positions, rows_cpu=rows_cpu)
            self.copies = self.positions.copies_for_extend(
                forward_batch.req_pool_indices, forward_batch.extend_prefix_lens, forward_batch.extend_seq_lens,
                total=forward_batch.positions.shape[0], rows_cpu=rows_cpu)
        if self.use_triton:
            seq_cpu = getattr(forward_batch, "seq_lens_cpu", None)
            self._max_seq_len = int(seq_cpu.max()) if seq_cpu is not None and len(seq_cpu) else None
            if planned:
                self._kv_end = self.kernels.extend_kv_end(
                    self.positions.req_to_pos, forward_batch.req_pool_indices, forward_batch.seq_lens,
                    forward_batch.extend_seq_lens, forward_batch.positions, self._max_seq_len)
            else:  # -1: an identity row; the kernel bounds each query block by its own positions
                self._kv_end = torch.full((forward_batch.req_pool_indices.shape[0],), -1, dtype=torch.int32,
                                          device=forward_batch.req_pool_indices.device)

    def _save(self, layer: RadixAttention, forward_batch: ForwardBatch, k: torch.Tensor | None,
              v: torch.Tensor | None, save_kv_cache: bool) -> None:
        if not (save_kv_cache and k is not None and v is not None):
            return
        loc = forward_batch.out_cache_loc
        if self.copies is not None and self.blend is not None and layer.layer_id >= self.blend.check_layer:
            fresh = self._select(layer, loc, k, v)
            if layer.layer_id > self.blend.check_layer:
                loc, k, v = loc[fresh], k[fresh], v[fresh]
        if getattr(layer, "k_scale", None) is None or not self.fp8_kv:
            self.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc(loc, None), k, v)
        else:  # SGLang's pool divides by the scales in place: k and v may be views the model still holds
            self.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc(loc, None), k.clone(), v.clone(), layer.k_scale,
                                                layer.v_scale)

    def _scales(self, layer: RadixAttention) -> tuple[float, float]:
        scales = self._layer_scales.get(layer.layer_id)
        if scales is None:  # a layer the model runner did not show at start-up (tests' layers)
            scales = self._layer_scales[layer.layer_id] = kv_scales(layer, self.fp8_kv)
        return scales

    def _select(self, layer: RadixAttention, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """CacheBlend: which extend tokens write their fresh KV after the check layer.

        The tokens that read stored KV found it in their own slots, copied there when they
        were allocated (admission.copy_sources). At the check layer, which every token computes,
        the ones whose fresh KV deviates most from it (the `ratio` share per request) are
        selected for recompute; in the layers after it every other one keeps the stored KV.

        Every layer runs every token: SGLang's model runner cannot narrow the token set between
        layers without forking model code. So this baseline is faithful in what attention sees
        and in memory, and its compute time is an upper bound on CacheBlend's.
        """
        blend = cast(modes.Mode, self.blend)  # `_save` calls this only with a blend and copies
        if layer.layer_id == blend.check_layer:
            idx, batch = cast(tuple[torch.Tensor, torch.Tensor], self.copies)
            keys = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
            values = self.token_to_kv_pool.get_value_buffer(layer.layer_id)
            dst = loc[idx].long()
            k_scale, v_scale = self._scales(layer)
            stored_k, stored_v = keys[dst].float() * k_scale, values[dst].float() * v_scale
            deviation = ((k[idx].reshape(-1, *keys.shape[1:]).float() - stored_k) ** 2).sum((1, 2)) + \
                        ((v[idx].reshape(-1, *values.shape[1:]).float() - stored_v) ** 2).sum((1, 2))
            stored = modes.blend_keep_stored(blend, deviation, batch)
            self._fresh = torch.ones(k.shape[0], dtype=torch.bool, device=k.device)
            self._fresh[idx[stored]] = False
        return self._fresh

    def _run(self, q: torch.Tensor, layer: RadixAttention, forward_batch: ForwardBatch, q_lens: list[int],
             decode: bool = False, saved: bool = True) -> torch.Tensor:
        """The torch path. `saved`: this forward's KV is in the pool, so what an extend reads of it is what its
        rows' decodes would read, and seeds `decode_kv`."""
        if layer.is_cross_attention or (layer.sliding_window_size is not None and layer.sliding_window_size > -1):
            raise NotImplementedError("mepic attention: cross or sliding-window attention is not supported")
        q = q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim)
        out = q.new_empty((q.shape[0], layer.tp_q_head_num, layer.v_head_dim))
        k_pool = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
        v_pool = self.token_to_kv_pool.get_value_buffer(layer.layer_id)
        req_to_token = self.req_to_token_pool.req_to_token
        req_to_pos = self.positions.req_to_pos
        positions = forward_batch.positions
        k_scale, v_scale = self._scales(layer)
        scaling = layer.scaling * k_scale  # a key's scale multiplies its scores
        if decode:
            batch = cast(DecodeRows, self.decode_rows)  # init_forward_metadata plans every decode
            if batch.rows:
                for i, (k, v) in zip(batch.index, self.decode_kv.step(layer.layer_id, k_pool, v_pool, q.dtype,
                                                                      batch)):
                    out[i:i + 1] = attend_causal(q[i:i + 1], k, v, scaling)
            for i in self.decode_general:
                row, seq_len = self.rows[i], self.seq_lens[i]
                out[i:i + 1] = attend_paged(q[i:i + 1], positions[i:i + 1], k_pool, v_pool,
                                            req_to_token[row, :seq_len], req_to_pos[row, :seq_len], self.rope,
                                            scaling)
        else:
            start = 0
            for i, (row, seq_len, n, plain) in enumerate(zip(self.rows, self.seq_lens, q_lens, self.plain_rows)):
                end = start + n
                found = self._contexts.get(i)
                if found is not None and found[0] == (row, seq_len, n):
                    context = found[1]
                else:  # the forward's first layer
                    slots = req_to_token[row, :seq_len]
                    context = PagedContext.plain(slots, self.rope, q.dtype) if plain else \
                        PagedContext.of(slots, req_to_pos[row, :seq_len], positions[start:end], self.rope, q.dtype)
                    self._contexts[i] = ((row, seq_len, n), context)
                out[start:end], k, v = attend_context(q[start:end], k_pool, v_pool, context, self.rope, scaling)
                if saved:
                    self.decode_kv.seed(layer.layer_id, row, k, v, seq_len)
                start = end
        if v_scale != 1.0:  # the output is linear in the values
            out.mul_(v_scale)
        return out.reshape(-1, layer.tp_q_head_num * layer.v_head_dim)

    def _run_triton(self, q: torch.Tensor, layer: RadixAttention, forward_batch: ForwardBatch,
                    decode: bool) -> torch.Tensor:
        q = q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim)
        args = (self.token_to_kv_pool.get_key_buffer(layer.layer_id),
                self.token_to_kv_pool.get_value_buffer(layer.layer_id),
                self.req_to_token_pool.req_to_token, self.positions.req_to_pos, forward_batch.req_pool_indices,
                forward_batch.seq_lens)
        rope = (self.cos_sin, self.rope.rotary_dim, self.rope.is_neox_style, layer.scaling)
        k_scale, v_scale = self._scales(layer)
        if decode:
            splits, workspace = self._decode_buffers(q, args[0].shape[1], layer.v_head_dim, forward_batch.seq_lens)
            out = self.kernels.decode(q, *args, forward_batch.positions, *rope, splits=splits, workspace=workspace,
                                      k_scale=k_scale, v_scale=v_scale, **self.rope_args)
        else:
            lens = forward_batch.extend_seq_lens
            if self._kv_end is None:  # a forward this backend did not prepare (tests): bounds per call
                self._max_seq_len = None
                self._kv_end = self.kernels.extend_kv_end(self.positions.req_to_pos, args[4], args[5], lens,
                                                          forward_batch.positions)
            out = self.kernels.extend(q, *args, torch.cumsum(lens, 0) - lens, lens, forward_batch.positions, *rope,
                                      max_ext_len=max(cast(list[int], forward_batch.extend_seq_lens_cpu)),
                                      kv_end=self._kv_end,
                                      max_seq_len=self._max_seq_len, k_scale=k_scale, v_scale=v_scale,
                                      **self.rope_args)
        return out.reshape(-1, layer.tp_q_head_num * layer.v_head_dim)

    def _decode_buffers(self, q: torch.Tensor, kv_heads: int, dv: int,
                        seq_lens: torch.Tensor) -> tuple[torch.Tensor, DecodeWorkspace]:
        """Split counts and workspace of a decode: the graph's fixed ones, or this forward's (eager)."""
        batch, heads = q.shape[0], q.shape[1]
        graph = self.graph
        if graph is not None and graph.active:
            if graph.workspace is None:
                graph.workspace = self.kernels.DecodeWorkspace(graph.splits.shape[0], heads, dv, q.device)
            return graph.splits[:batch], graph.workspace
        stream = torch.cuda.current_stream(q.device).cuda_stream if q.device.type == "cuda" else 0
        workspace = self._workspaces.get(stream)
        if workspace is None or not workspace.fits(batch, heads, dv):
            workspace = self._workspaces[stream] = self.kernels.DecodeWorkspace(batch, heads, dv, q.device)
        splits = self._splits
        if splits is None or splits.shape[0] != batch:  # a forward this backend did not prepare (tests)
            splits = self._splits = self.kernels.num_kv_splits(
                seq_lens, self.kernels.decode_programs_per_split(batch, heads, kv_heads), self.sm_count,
                ctas_per_sm=self.decode_ctas_per_sm)
        return splits, workspace

    # CUDA graphs. Decode: SGLang's decode graph runner calls these.

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self.graph = GraphBuffers(splits=torch.ones(max_bs, dtype=torch.int32, device=self.device))

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1

    def init_forward_metadata_out_graph(self, forward_batch: ForwardBatch, in_capture: bool = False) -> None:
        if not forward_batch.forward_mode.is_decode():
            raise NotImplementedError("the mepic backend captures prefill CUDA graphs only with SGLang's breakable "
                                      "backend (--cuda-graph-backend-prefill breakable, the default on CUDA, or "
                                      "disabled), not full ones")
        cast(GraphBuffers, self.graph).active = True  # init_cuda_graph_state made it
        # Planned rows decode at their plan's next position; padding rows (capture: all) are left alone.
        real = forward_batch.batch_size - (getattr(forward_batch, "num_padding", 0) or 0)
        if real and not in_capture:
            positions = forward_batch.positions[:real]
            positions.copy_(self.positions.on_decode(forward_batch.req_pool_indices[:real],
                                                     forward_batch.seq_lens[:real], positions))

    def init_forward_metadata_in_graph(self, forward_batch: ForwardBatch) -> None:
        """Captured: the split counts of this batch, into the fixed buffer (device ops only)."""
        batch = forward_batch.seq_lens.shape[0]
        self.kernels.num_kv_splits(forward_batch.seq_lens,
                                   self.kernels.decode_programs_per_split(batch, *self._graph_heads),
                                   self.sm_count, out=cast(GraphBuffers, self.graph).splits,
                                   ctas_per_sm=self.decode_ctas_per_sm)

    # Prefill: SGLang's breakable prefill graphs (`--cuda-graph-backend-prefill breakable`, the default on
    # CUDA). The graph's segments run the model between attention layers, so they rotate queries with the
    # runner's static positions buffer, which the runner fills with SGLang's positions (slot indices) before
    # any metadata hook runs; attention itself runs eagerly at each break, on the static batch. With the
    # captured-metadata contract below the runner hands this backend the static batch at every replay, and
    # a planned row's positions are written into that buffer in place.

    use_captured_forward_metadata_for_breakable_cuda_graph = True

    def init_forward_metadata_for_breakable_cuda_graph_capture(
            self, forward_batch: ForwardBatch) -> PrefillGraphMetadata:
        """Capture (and warm-up) of one token bucket, a dummy batch over the runner's static buffers: its
        metadata as identity rows. It reads and writes nothing of the position map (its rows may be live
        requests' rows) and leaves forward_batch.positions the static buffer whose address the graph records."""
        self._prefill_graph_hooks = True
        self._reset()
        self._prepare_extend(forward_batch, planned=False)
        return PrefillGraphMetadata(num_tokens=forward_batch.positions.shape[0])

    def prepare_forward_metadata_for_breakable_cuda_graph_replay(
            self, capture_metadata: PrefillGraphMetadata, forward_batch: ForwardBatch, *,
            static_forward_batch: ForwardBatch | None = None) -> None:
        """Before a replay: the live batch's metadata, as an eager forward's, and its planned positions
        into the static buffer the captured segments and the breaks read (device copy, no sync). A batch
        without planned rows keeps SGLang's positions, which the runner has already put there."""
        sglang_positions = forward_batch.positions
        self.init_forward_metadata(forward_batch)
        if forward_batch.positions is sglang_positions:
            return
        if static_forward_batch is None or static_forward_batch.positions is None:
            raise RuntimeError("mepic attention: a prefill CUDA graph replay without the runner's static batch "
                               "cannot be given its planned positions")
        n = sglang_positions.shape[0]
        static_forward_batch.positions[:n].copy_(forward_batch.positions)

    def can_run_prefill_cuda_graph(self, forward_batch: ForwardBatch) -> bool:
        """Whether SGLang's prefill graph runner may replay this batch; False sends it eager. A plain extend
        (or a mixed batch) on the Triton path, with its host figures, qualifies under the breakable
        runner's captured-metadata hooks, which put planned positions where the graph reads them. Under a
        runner that does not call them (a piecewise one re-inits only the live batch) a batch qualifies
        only if none of its rows is planned, known from the host mirror."""
        mode = forward_batch.forward_mode
        if not self.use_triton or getattr(mode, "name", None) not in ("EXTEND", "MIXED"):
            return False
        if self._eager_switch is not None and os.path.exists(self._eager_switch):
            return False  # the evaluation's switch: this server's prefills run eagerly while the file exists
        if getattr(forward_batch, "extend_seq_lens_cpu", None) is None:
            return False
        if self._prefill_graph_hooks:
            return True
        if not self.positions.any_planned():  # no planned row at all
            return True
        rows_cpu = getattr(forward_batch, "req_pool_indices_cpu", None)
        return rows_cpu is not None and not self.positions.any_planned(rows_cpu)

    # SGLang's forward_extend / forward_decode take **kwargs; these take none, so one passed raises rather than
    # being dropped (an ignore for SGLang's signature, unused where mypy reads SGLang as untyped).
    def forward_extend(  # type: ignore[override, unused-ignore]
            self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, layer: RadixAttention,
            forward_batch: ForwardBatch, save_kv_cache: bool = True) -> torch.Tensor:
        self._save(layer, forward_batch, k, v, save_kv_cache)
        if self.use_triton:
            return self._run_triton(q, layer, forward_batch, decode=False)
        return self._run(q, layer, forward_batch, cast(torch.Tensor, forward_batch.extend_seq_lens).tolist(),
                         saved=save_kv_cache and k is not None and v is not None)

    def forward_decode(  # type: ignore[override, unused-ignore]  # no **kwargs: see forward_extend
            self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, layer: RadixAttention,
            forward_batch: ForwardBatch, save_kv_cache: bool = True) -> torch.Tensor:
        self._save(layer, forward_batch, k, v, save_kv_cache)
        if self.use_triton:
            return self._run_triton(q, layer, forward_batch, decode=True)
        return self._run(q, layer, forward_batch, [1] * forward_batch.batch_size, decode=True)

    def support_triton(self) -> bool:
        return False


def create(model_runner: ModelRunner) -> MepicAttnBackend:
    """SGLang's factory (plugin.py registers it): the backend, handed this process's settings."""
    return MepicAttnBackend(model_runner, env.settings())
