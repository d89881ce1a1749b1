"""The mepic cache in SGLang's prefill round (`Scheduler.get_new_batch_prefill`, patch
`scheduler_get_new_batch_prefill`): the first scheduler-side step of a request.

The cache may make compile rows in the round (compile_rows.py), built here as
SGLang builds a request. A request that must wait for a chunk (a compile row
running over several forwards, a storage read) is held out of the waiting queue
for the round (`hold_back`) and goes back to its head when the round ends.
Requests planned in the round but not admitted let go of their chunks at its end
(residency.py), and compile rows made in it that SGLang did not admit are dropped.

Under tensor parallelism with a tier below the device pool, the ranks first agree
on what the tiers give the waiting requests' missing chunks (`Tiers.agree_round`,
one collective), so every rank holds back, loads and computes alike; with
`SGLANG_MEPIC_CHECK_RANKS=1` each round's plan is then compared across the ranks
(round_digest.py).

The batch's prefill stats (the log's `#new-token` and `#cached-token`, the
cache-hit metrics) count slots; for laid-out requests they are brought to real
tokens, and reuse of chunks compiled for the request itself is not a hit, as in
its response's `cached_tokens`.
"""

from __future__ import annotations

import functools
from array import array
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from sglang_mepic.cache import round_digest
from sglang_mepic.cache.link import link_of
from sglang_mepic.cache.radix_cache import MepicRadixCache, mepic_cache

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.schedule_policy import PrefillAdder
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.scheduler_components.metrics_reporter import PrefillStats


def compile_req(scheduler: Scheduler, rid: str, ids: array[int], parent: Req) -> Req:
    """A compile row, as SGLang's scheduler builds a request it received: greedy, generating
    nothing (its one sampled token is dropped), in the parent's cache namespace, and ranked as
    the parent (priority preemption sorts the running batch by priority: a row without one
    ended the scheduler with a TypeError)."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    # Greedy: one non-greedy row sends its whole prefill batch down SGLang's top-k/top-p sampler.
    params = SamplingParams(max_new_tokens=0, temperature=0)
    params.normalize(None)
    req = Req(rid, "", ids, params, eos_token_ids=scheduler.model_config.hf_eos_token_id,
              vocab_size=scheduler.model_config.vocab_size, extra_key=parent.extra_key,
              cache_salt=parent.cache_salt, lora_id=parent.lora_id, dllm_config=scheduler.dllm_config,
              priority=parent.priority, routing_key=getattr(parent, "routing_key", None))
    # Req appends lora_id to the extra_key it is given; the parent's already holds it. The row's
    # namespace is the parent's exactly, or its chunk key would be another tenant's.
    req.extra_key = parent.extra_key
    req.tokenizer = getattr(scheduler, "tokenizer", None)
    req.logprob_start_len = len(ids)  # as SGLang sets it for a prefill-only request
    scheduler.init_req_max_new_tokens(req)
    return req


def _rows_left(scheduler: Scheduler, adder: PrefillAdder) -> int:
    """Request rows the adder may still fill this round (SGLang's own count, as its loop asks it)."""
    running = adder.running_batch
    held = sum(r.kv.holds_kv for r in adder.can_run_list)
    return scheduler.get_num_allocatable_reqs(len(running.reqs), running_batch=running,
                                              num_held_rows=held) - len(adder.can_run_list)


def hold_back(tree: MepicRadixCache, reqs: Iterable[Req]) -> list[Req]:
    """The requests, of the waiting `reqs`, that must wait for a chunk (readiness.py), in queue
    order. Compile rows that ended unreleased (an abort) are forgotten first: nobody waits on them."""
    tree.compile_rows.forget_finished()
    linked = [(req, link) for req in reqs if (link := tree.linker.link(req)) is not None]
    if tree.tiers.agrees:  # under TP, before anything is planned: what the tiers give, agreed by the ranks
        tree.tiers.agree_round(tree.readiness.missing(link for _, link in linked))
    return [req for req, link in linked if tree.readiness.must_wait(link)]


def prefill_round(original: Callable[..., Any], scheduler: Scheduler, *args: Any, **kwargs: Any) -> Any:
    tree = mepic_cache(scheduler)
    if tree is not None:
        rows = tree.compile_rows
        rows.make_req = functools.partial(compile_req, scheduler)
        rows.rows_left = functools.partial(_rows_left, scheduler)
        tokenizer = getattr(scheduler, "tokenizer", None)
        rows.sink = tokenizer.bos_token_id if tree.settings.compile_sink == "bos" and tokenizer is not None else None
    held = hold_back(tree, scheduler.waiting_queue) if tree is not None else []
    if held:
        ids = {id(req) for req in held}
        scheduler.waiting_queue = [req for req in scheduler.waiting_queue if id(req) not in ids]
    try:
        plan = original(scheduler, *args, **kwargs)  # a NextBatchPlan
    finally:
        if held:
            scheduler.waiting_queue = held + scheduler.waiting_queue
        if tree is not None:
            tree.residency.end_round()
            tree.compile_rows.end_round()
            agreed = tree.tiers.agreed()
            tree.tiers.end_round()
    if tree is not None and tree.settings.check_ranks:  # SGLANG_MEPIC_CHECK_RANKS=1: every round, every rank
        round_digest.check(tree, plan.batch_to_run, held, agreed)
    batch = plan.batch_to_run
    stats = getattr(batch, "prefill_stats", None)
    if stats is not None and tree is not None:
        _count_real_tokens(stats, batch.reqs[:stats.num_new_seqs], tree)
    return plan


def _count_real_tokens(stats: PrefillStats, new_reqs: Iterable[Req], tree: MepicRadixCache) -> None:
    for req in new_reqs:
        link = link_of(req)
        if link is None:
            continue
        prefix, end = min(req.prefix_len, link.size), min(req.prefix_len + req.extend_len, link.size)
        not_hit = (prefix - link.real_slots(0, prefix)) + link.own_reuse  # counted at admission
        stats.log_hit_tokens = max(0, stats.log_hit_tokens - not_hit)
        stats.log_device_hit_tokens = max(0, stats.log_device_hit_tokens - not_hit)
        stats.log_input_tokens -= max(0, end - prefix) - link.real_slots(prefix, end)
