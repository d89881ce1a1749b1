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
from types import ModuleType
from typing import TYPE_CHECKING, cast

import torch

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.mem_cache.memory_pool import KVWriteLoc

from sglang_mepic import env, modes
from sglang_mepic.attention import sync_probe
from sglang_mepic.attention.blend import RankSum, fresh_tokens, tp_rank_sum
from sglang_mepic.attention.cuda_graphs import CudaGraphHooks, GraphBuffers
from sglang_mepic.attention.decode_plan import plan_decode
from sglang_mepic.attention.kv_dtype import FP8_KV_DTYPES, check_kv_dtype, kv_scales
from sglang_mepic.attention.reference import (DecodeKV, DecodeRows, PagedContext, attend_causal, attend_context,
                                              attend_paged)
from sglang_mepic.attention.rope import Rope
# SUPPORTED_ARCHITECTURES: named here too, where tests/launch finds it beside launch/checks.py's copy.
from sglang_mepic.attention.rotary_takeover import SUPPORTED_ARCHITECTURES, take_over_rotary  # noqa: F401
from sglang_mepic.pages import positions

if TYPE_CHECKING:
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.model_executor.model_runner import ModelRunner

    from sglang_mepic.kernels.attention import DecodeWorkspace

logger = logging.getLogger(__name__)

BACKEND_NAME = "mepic"


class MepicAttnBackend(CudaGraphHooks):
    fp8_kv: bool  # the pool holds fp8 (set by _attach)
    rank_sum: RankSum | None  # CacheBlend under TP: the deviation's sum over the ranks (set by _attach)

    def __init__(self, model_runner: ModelRunner, settings: env.Settings) -> None:
        super().__init__()
        from sglang.srt.runtime_context import get_parallel

        tp = get_parallel().attn_tp_size
        model = model_runner.model_config
        self._graph_heads = (model.num_attention_heads // tp, model.get_num_kv_heads(tp))
        # The runner made its pools before its attention backend; a model this backend serves (full attention,
        # SUPPORTED_ARCHITECTURES) has an MHA pool.
        self._attach(model_runner.device, cast("ReqToTokenPool", model_runner.req_to_token_pool),
                     cast("MHATokenToKVPool", model_runner.token_to_kv_pool), take_over_rotary(model_runner),
                     model_runner.dtype, settings)
        # Every attention layer's scales, read now: a forward (a CUDA graph's capture among them) reads no tensor.
        for module in model_runner.model.modules():
            if isinstance(getattr(module, "layer_id", None), int) and hasattr(module, "k_scale"):
                self._layer_scales[module.layer_id] = kv_scales(module, self.fp8_kv)
        if self.blend is not None:  # CacheBlend: under TP its deviation is summed over the ranks (blend.py)
            self.rank_sum = tp_rank_sum()
        self.sync_probe = sync_probe.install(self, settings.sync_debug)  # GPU runs: per-batch calls watched

    @classmethod
    def over_pools(cls, req_to_token: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, rope: Rope,
                   q_heads: int | None = None, q_dtype: torch.dtype | None = None,
                   settings: env.Settings | None = None, rank_sum: RankSum | None = None) -> MepicAttnBackend:
        """A backend around bare tensors, without a model runner (tests, benchmarks). `q_dtype`: the model's
        (default: the pool's, bf16 over an fp8 pool); `settings`: default, this process's; `rank_sum`: a TP
        group's sum (CacheBlend's deviation), default one rank's."""

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
        backend.rank_sum = rank_sum
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
        self.rank_sum = None
        self._fresh: torch.Tensor | None = None  # CacheBlend: this extend's tokens that write fresh KV
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
        self._fresh = None  # CacheBlend's mask is one forward's: a later layer never reads a stale one
        self._splits = self._kv_end = None
        self.decode_rows = None
        self.decode_general = []
        self._contexts = {}

    def _plan_decode(self, new_positions: torch.Tensor) -> None:
        """Torch path: which rows of this decode read `decode_kv`, the rest `attend_paged` (decode_plan.py)."""
        self.decode_rows, self.decode_general = plan_decode(
            self.rows, self.seq_lens, self.plain_rows, self.req_to_token_pool.req_to_token,
            self.positions.req_to_pos, new_positions)
        self.decode_kv.drop(self.rows[i] for i in self.decode_general)  # an extend's seeds they will not read

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
        """CacheBlend: which extend tokens write their fresh KV after the check layer, chosen at it (blend.py).

        Every layer runs every token: SGLang's model runner cannot narrow the token set between
        layers without forking model code. So this baseline is faithful in what attention sees
        and in memory, and its compute time is an upper bound on CacheBlend's.
        """
        mode = cast(modes.Mode, self.blend)  # `_save` calls this only with a blend and copies
        if layer.layer_id == mode.check_layer:
            self._fresh = fresh_tokens(
                mode, cast(tuple[torch.Tensor, torch.Tensor], self.copies), loc, k, v,
                self.token_to_kv_pool.get_key_buffer(layer.layer_id),
                self.token_to_kv_pool.get_value_buffer(layer.layer_id), self._scales(layer), self.rank_sum)
        if self._fresh is None:  # a layer after the check layer, in a forward whose check layer saved nothing
            raise RuntimeError(f"mepic attention: CacheBlend layer {layer.layer_id} saves KV before its check layer "
                               f"{mode.check_layer} chose the tokens to recompute in this forward")
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

    # The CUDA-graph hooks SGLang's runners call are CudaGraphHooks' (cuda_graphs.py).

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
