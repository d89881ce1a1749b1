"""The mepic backend's CUDA-graph hooks: SGLang's decode graph runner and its breakable prefill runner call them.

Kept apart from the eager metadata (backend.py) because their contract is SGLang's runners': what a captured
launch may read (fixed buffers, device ops only; `_decode_buffers` hands a decode the graph's or its own), and
how a replay is handed its live batch. `CudaGraphHooks` is the base of `MepicAttnBackend`, which sets the state
these read and supplies the per-forward metadata they call (`init_forward_metadata`, `_reset`,
`_prepare_extend`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, cast

import torch

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    from sglang_mepic.kernels.attention import DecodeWorkspace
    from sglang_mepic.pages.positions import PositionMap


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


class CudaGraphHooks(AttentionBackend):
    """The hooks; the state they read, set by MepicAttnBackend (`_attach`, `_use_kernels`):"""

    graph: GraphBuffers | None
    device: torch.device | str
    positions: PositionMap
    use_triton: bool
    kernels: ModuleType  # the Triton path's (sglang_mepic.kernels.attention)
    sm_count: int
    decode_ctas_per_sm: int
    _graph_heads: tuple[int, int]  # (query heads, KV heads) of this rank
    _prefill_graph_hooks: bool  # SGLang's breakable prefill runner captured with these hooks
    _eager_switch: str | None  # MEPIC_PREFILL_GRAPHS_OFF_FILE
    _workspaces: dict[int, DecodeWorkspace]  # an eager decode's, by CUDA stream
    _splits: torch.Tensor | None  # this eager decode's split counts, once for every layer

    def _reset(self) -> None:
        raise NotImplementedError  # MepicAttnBackend's: a forward's metadata cleared

    def _prepare_extend(self, forward_batch: ForwardBatch, planned: bool) -> None:
        raise NotImplementedError  # MepicAttnBackend's: an extend's positions, copies and key-loop bounds

    # Decode: the buffers a decode launch reads, and SGLang's decode graph runner's hooks.

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
