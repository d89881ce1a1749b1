"""Scheduler side: a batch whose forward raises ends its requests with an error, not the server.

SGLang's scheduler loop has no per-request error handling: an exception in
`run_batch` (the forward, the sampler, the logprob gathering) leaves the
scheduler process, and the whole server exits. Intake (scheduler_fields.py here,
frontend/intake.py and limits.py) refuses every request known to do that; this is the last
line of defence for the ones nobody has found yet.

When `run_batch` raises, every request of the batch is finished with a 500 that
names the error, through SGLang's own finishing path: a stand-in result with no
logits goes to `process_batch_result`, which releases each request's KV (and so
MEPIC's page holders) as for any finished request and streams the error to its
client. Requests in the waiting queue are untouched; the server goes on.

Under the overlap scheduler (SGLang's default, on CPU too) the next batch reads
each request's next token from the future map before this batch's result is
processed: the stand-in's tokens (0) are published there as a forward would
publish its samples. Those requests are finished when the stand-in is processed
one round later, and that round's output for them is dropped, as it is for any
request that finishes under overlap.

The whole batch fails together: SGLang cannot tell which request made a forward
raise, so the other requests of that batch (for a decode batch, every running
request) end with the same error.

A fault the guard catches in PERSISTENT_FAULT_BATCHES batches in a row, failing as many distinct requests,
with no batch served between, is the process's, not a request's (a profile step that raised in every batch did this, until
profile_guard.abandon): a server that fails every request while `/health` answers 200 is a zombie no
orchestrator restarts. That fault is re-raised, and the server exits as plain SGLang would, with the
cause in its log, for a supervisor to restart (docs/limits.md).

What stays fatal, because the process's state can no longer be trusted or the
result is consumed elsewhere (the exception is re-raised, as before):
- device faults: CUDA errors, device-side asserts, out-of-memory;
- speculative decoding, pipeline parallelism and disaggregated serving, whose
  results carry draft and transfer state a stand-in cannot give;
- tensor parallelism (more than one TP rank): a forward that raises on one rank
  only leaves the others inside a collective of that forward, or, were this
  rank to serve on, pairs its next forward's collectives with the others'
  current ones (wrong sums, not only a hang). The ranks cannot agree on a
  failure without a collective that the failed forward may never reach, so the
  rank re-raises, SGLang's scheduler process tells the server (SIGQUIT) and the
  whole server exits, as plain SGLang does;
- batches other than prefill (extend) and decode, and embedding models;
- a sampler delayed past `run_batch` (grammar-constrained batches under
  overlap) and anything that raises in result processing.
"""

from __future__ import annotations

import logging
import os
import traceback
from contextlib import contextmanager
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Callable, Iterator, NoReturn

import torch

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.utils import EmbeddingBatchResult, GenerationBatchResult

logger = logging.getLogger(__name__)

# A test's way to make a batch fail: every batch holding a request whose rid starts with this raises
# in its forward (injected_fault). Unset, nothing is injected.
FAULT_ENV = "SGLANG_MEPIC_TEST_FAIL_RID_PREFIX"

# A bad request fails its own batch (under overlap, the round after it too: its stand-in is processed one
# round late), and then the next batch is served. Eight failed batches in a row, of eight requests or more,
# none served between, is a broken process.
PERSISTENT_FAULT_BATCHES = 8

_DEVICE_FAULTS = ("cuda", "out of memory", "device-side assert", "cublas", "cudnn", "nccl", "hip error")


class InjectedFault(RuntimeError):
    """Raised for a batch holding a request named by FAULT_ENV."""


def _fault_prefixes(decode: bool, tp_rank: int = 0) -> list[str]:
    specs = [spec.strip() for spec in os.environ.get(FAULT_ENV, "").split(",") if spec.strip()]
    mine = []
    for spec in specs:
        rank, colon, rest = spec.partition(":")
        if colon and rank.startswith("rank") and rank[4:].isdigit():  # one TP rank's fault only
            if int(rank[4:]) != tp_rank:
                continue
            spec = rest
        if decode or not spec.startswith("decode:"):
            mine.append(spec.removeprefix("decode:"))
    return mine


@contextmanager
def injected_fault(scheduler: Scheduler, batch: ScheduleBatch) -> Iterator[None]:
    """Where FAULT_ENV names a request of this batch, its forward raises where a real one would: in the
    model worker, after run_batch's own bookkeeping. `decode:<prefix>` fails only decode batches,
    `<prefix>` every batch (so the request's prefill), `rank<N>:` before either only TP rank N's (the
    others run the forward); several are separated by commas."""
    prefix = next((p for p in _fault_prefixes(batch.forward_mode.is_decode(), _tp_rank())
                   if any(str(req.rid).startswith(p) for req in batch.reqs)), None)
    if prefix is None:
        yield
        return

    def forward(*args: Any, **kwargs: Any) -> NoReturn:
        raise InjectedFault(f"fault injected for a request whose rid starts with {prefix!r} ({FAULT_ENV})")

    worker = scheduler.model_worker
    worker.forward_batch_generation = forward  # shadows the method on this instance only
    try:
        yield
    finally:
        del worker.forward_batch_generation


def recoverable(scheduler: Scheduler, batch: ScheduleBatch, error: BaseException) -> bool:
    if not isinstance(error, Exception) or isinstance(error, torch.cuda.OutOfMemoryError):
        return False
    text = f"{type(error).__name__} {error}".lower()
    if any(fault in text for fault in _DEVICE_FAULTS):
        return False
    mode = batch.forward_mode
    return (scheduler.is_generation and batch.spec_algorithm.is_none()
            and (mode.is_extend() or mode.is_decode()) and not mode.is_split_prefill()
            and _pipeline_stages() == 1 and _tp_ranks() == 1
            and str(getattr(scheduler.disaggregation_mode, "value", "null")) == "null")


def _pipeline_stages() -> int:
    from sglang.srt.runtime_context import get_parallel

    return get_parallel().pp_size


def _tp_rank() -> int:
    """This scheduler's TP rank (SGLang 0.5.23 keeps it in its parallel context, not on the scheduler)."""
    from sglang.srt.runtime_context import get_parallel

    return get_parallel().tp_rank


def _tp_ranks() -> int:
    from sglang.srt.runtime_context import get_parallel

    return get_parallel().tp_size


def run(original: Callable[..., Any], scheduler: Scheduler, batch: ScheduleBatch, *args: Any,
        **kwargs: Any) -> GenerationBatchResult | EmbeddingBatchResult:
    """`Scheduler.run_batch`, with a raising batch turned into finished requests where that is safe."""
    try:
        with injected_fault(scheduler, batch):
            result = original(scheduler, batch, *args, **kwargs)
    except Exception as error:
        if not recoverable(scheduler, batch, error):
            raise
        if STREAK.failed(batch) >= PERSISTENT_FAULT_BATCHES:
            logger.error("MEPIC: %d batches in a row raised, none served between (%d requests): the fault is the "
                         "process's, not a request's; the scheduler stops so that the server can be restarted",
                         STREAK.batches, len(STREAK.rids))
            raise
        return _fail_batch(scheduler, batch, error)
    STREAK.served()
    return result


class FailedInARow:
    """The batches that raised since the last one served, and their requests (this scheduler process's)."""

    def __init__(self) -> None:
        self.served()

    def failed(self, batch: ScheduleBatch) -> int:
        """The length of the streak, counted in batches that are also distinct requests."""
        self.batches += 1
        self.rids.update(req.rid for req in batch.reqs)
        return min(self.batches, len(self.rids))

    def served(self) -> None:
        self.batches, self.rids = 0, set[str]()


STREAK = FailedInARow()


def _fail_batch(scheduler: Scheduler, batch: ScheduleBatch, error: Exception) -> GenerationBatchResult:
    from sglang.srt.managers.schedule_batch import FINISH_ABORT
    from sglang.srt.managers.utils import GenerationBatchResult

    rids = [req.rid for req in batch.reqs]
    logger.error("MEPIC: %s batch raised; its %d request(s) end with an error and the server goes on "
                 "(rids %s):\n%s", "a decode" if batch.forward_mode.is_decode() else "a prefill", len(rids), rids[:8],
                 "".join(traceback.format_exception(error)))
    message = (f"the server failed to run this request ({type(error).__name__}: {error}); "
               "it was ended and the server goes on")
    tree = getattr(scheduler, "tree_cache", None)
    rows = getattr(tree, "compile_rows", None)
    for req in batch.reqs:
        # Its KV from this forward was never computed: the tree must not keep it for others, and no
        # later request may read a compile row's pages (compile_rows.py), planned from the next round on.
        req.skip_radix_cache_insert = True
        if rows is not None:
            rows.failed(req)
        if req.finished():
            continue
        reason = FINISH_ABORT(message, HTTPStatus.INTERNAL_SERVER_ERROR, "InternalServerError")
        if batch.forward_mode.is_extend():
            req.discard_output_reason = reason  # finished without committing this forward's output
        else:
            req.to_finish = reason
        req.return_logprob = False
    # Nothing of the forward is read: no logits, no logprobs, no hidden states.
    batch.return_logprob = False
    batch.return_hidden_states = False
    n = len(batch.reqs)
    result = GenerationBatchResult(
        logits_output=None, next_token_ids=torch.zeros(n, dtype=torch.int64, device=batch.seq_lens.device),
        extend_input_len_per_req=list(getattr(batch, "extend_lens", None) or [0] * n),
        extend_logprob_start_len_per_req=[0] * n)
    if scheduler.enable_overlap:
        # What run_batch leaves for the next round after a forward: lengths and tokens in the future map.
        future_indices = batch.req_pool_indices
        scheduler.future_map.publish(future_indices, batch.seq_lens + 1)
        scheduler._relay_forward_payload(batch, future_indices, result)
        batch.input_ids = None
    result.next_token_ids = result.next_token_ids.cpu()
    return result
