"""The mepic cache at SGLang's scheduling steps: a prefill round, and a batch's extend.

**A prefill round** (`Scheduler.get_new_batch_prefill`). The cache may make
compile rows in it (compile_rows.py), built here as SGLang builds a request.
A request that must wait for a chunk (a compile row running over several
forwards, a storage read) is held out of the waiting queue for the round and
goes back to its head when the round ends. Requests planned in the round but
not admitted let go of their chunks at its end (admission.py), and compile
rows made in it that SGLang did not admit are dropped.

**A request joins the batch** (`PrefillAdder.add_one_req`). The compile rows
its plan reads are added right before it, each once; if one does not fit whole
(the budget, a row of the request pool, chunked prefill), neither does the
request, and SGLang's loop stops as it does for a request that does not fit. In
EPIC and CacheBlend the request is skipped for the round instead (it copies
stored KV before its forward, so it waits until its compile rows have run).

The batch's prefill stats (the log's `#new-token` and `#cached-token`, the
cache-hit metrics) count slots; for laid-out requests they are
brought to real tokens, and reuse of chunks compiled for the request itself is
not a hit, as in its response's `cached_tokens`.

**A batch's extend** (`ScheduleBatch.prepare_for_extend`). Before SGLang allocates
(which may evict), the batch's requests are admitted (they keep the chunk pages
they have held since they were planned; EPIC's get their private copies) and the
round's others let go of theirs. After, each KV row gets its plan's positions
(and, in private-copy modes, the slots its KV is copied from), and a request
reading a chunk that a compile row in the batch computes is pointed at that
row's pages (`MepicRadixCache.point_readers`); every other row is
marked unplanned (identity positions). In a batch that returns input logprobs,
each laid-out slot scores the next real token, not the next slot (logprobs.py).
"""

import functools

from sglang_mepic import config
from sglang_mepic.cache.compile_rows import layout_of
from sglang_mepic.cache.link import link_of
from sglang_mepic.cache.logprobs import score_real_tokens
from sglang_mepic.cache.radix_cache import MepicRadixCache
from sglang_mepic.pages import context


def compile_req(scheduler, rid, ids, parent):
    """A compile row, as SGLang's scheduler builds a request it received: greedy, generating
    nothing (its one sampled token is dropped), in the parent's cache namespace."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    # Greedy: one non-greedy row sends its whole prefill batch down SGLang's top-k/top-p sampler.
    params = SamplingParams(max_new_tokens=0, temperature=0)
    params.normalize(None)
    req = Req(rid, "", ids, params, eos_token_ids=scheduler.model_config.hf_eos_token_id,
              vocab_size=scheduler.model_config.vocab_size, extra_key=parent.extra_key,
              cache_salt=parent.cache_salt, lora_id=parent.lora_id, dllm_config=scheduler.dllm_config)
    # Req appends lora_id to the extra_key it is given; the parent's already holds it. The row's
    # namespace is the parent's exactly, or its chunk key would be another tenant's.
    req.extra_key = parent.extra_key
    req.tokenizer = getattr(scheduler, "tokenizer", None)
    req.logprob_start_len = len(ids)  # as SGLang sets it for a prefill-only request
    scheduler.init_req_max_new_tokens(req)
    return req


def _rows_left(scheduler, adder) -> int:
    """Request rows the adder may still fill this round (SGLang's own count, as its loop asks it)."""
    running = adder.running_batch
    held = sum(r.kv.holds_kv for r in adder.can_run_list)
    return scheduler.get_num_allocatable_reqs(len(running.reqs), running_batch=running,
                                              num_held_rows=held) - len(adder.can_run_list)


def prefill_round(original, scheduler, *args, **kwargs):
    tree = scheduler.tree_cache if isinstance(scheduler.tree_cache, MepicRadixCache) else None
    if tree is not None:
        rows = tree.compile_rows
        rows.make_req = functools.partial(compile_req, scheduler)
        rows.rows_left = functools.partial(_rows_left, scheduler)
        tokenizer = getattr(scheduler, "tokenizer", None)
        rows.sink = tokenizer.bos_token_id if config.compile_sink() == "bos" and tokenizer is not None else None
    held = tree.hold_back(scheduler.waiting_queue) if tree is not None else []
    if held:
        ids = {id(req) for req in held}
        scheduler.waiting_queue = [req for req in scheduler.waiting_queue if id(req) not in ids]
    try:
        plan = original(scheduler, *args, **kwargs)  # a NextBatchPlan
    finally:
        if held:
            scheduler.waiting_queue = held + scheduler.waiting_queue
        if tree is not None:
            tree.admission.end_round()
            tree.compile_rows.end_round()
    batch = plan.batch_to_run
    stats = getattr(batch, "prefill_stats", None)
    if stats is not None and tree is not None:
        _count_real_tokens(stats, batch.reqs[:stats.num_new_seqs], tree)
    return plan


def add_request(original, adder, req, *args, **kwargs):
    """SGLang's `PrefillAdder.add_one_req`, with the compile rows the request reads added first."""
    from sglang.srt.managers.schedule_policy import AddReqResult

    tree = adder.tree_cache if isinstance(adder.tree_cache, MepicRadixCache) else None
    link = link_of(req)
    if tree is None or link is None or not link.compiling:
        return original(adder, req, *args, **kwargs)
    rows = tree.compile_rows
    batched, todo = {id(r) for r in adder.can_run_list}, []
    for row in link.compiling.values():
        if id(row) not in batched:
            batched.add(id(row))
            todo.append(row)
    # Each row takes a row of the request pool. Where they and the request do not all fit, the rows
    # that fit go now (their chunks are stored for its next round: it needs fewer), the request waits.
    room = rows.rows_left(adder) if rows.rows_left is not None else len(todo) + 1
    fits = room >= len(todo) + (0 if link.wait else 1)
    for row in todo[:max(0, room)]:
        row.init_next_round_input(tree)
        result = original(adder, row, *args, **kwargs)
        whole = bool(adder.can_run_list) and adder.can_run_list[-1] is row and adder.new_chunked_req is not row
        if bool(adder.can_run_list) and adder.can_run_list[-1] is row:
            link.made_for.add(layout_of(row).key)
        if not whole:
            return result if result is not AddReqResult.CONTINUE else AddReqResult.OTHER
        if result is not AddReqResult.CONTINUE:
            return result
    if not fits:
        return AddReqResult.OTHER  # no request row left for it: the batch is full
    if link.wait:
        return AddReqResult.CONTINUE  # skipped this round: it reads its chunks once they are stored
    return original(adder, req, *args, **kwargs)


def _count_real_tokens(stats, new_reqs, tree) -> None:
    for req in new_reqs:
        link = link_of(req)
        if link is None:
            continue
        prefix, end = min(req.prefix_len, link.size), min(req.prefix_len + req.extend_len, link.size)
        not_hit = (prefix - link.real_slots(0, prefix)) + link.own_reuse  # counted at admission
        stats.log_hit_tokens = max(0, stats.log_hit_tokens - not_hit)
        stats.log_device_hit_tokens = max(0, stats.log_device_hit_tokens - not_hit)
        stats.log_input_tokens -= max(0, end - prefix) - link.real_slots(prefix, end)


def prepare_extend(original, batch, *args, **kwargs):
    tree = batch.tree_cache if isinstance(batch.tree_cache, MepicRadixCache) else None
    if tree is not None:
        # What the batch's extends will allocate (a page more each for alignment): EPIC's
        # private copies, made at admission, must leave it free.
        reserve = sum(-(-req.extend_len // tree.page_size) + 1 for req in batch.reqs)
        for req in batch.reqs:
            tree.admission.admit(req, reserve)
        # Requests planned in this round but left waiting let go now: what they hold was
        # counted as evictable when the admitted ones were checked.
        tree.admission.end_round()
    result = original(batch, *args, **kwargs)
    if tree is not None:
        tree.point_readers(batch)
    if tree is not None and batch.return_logprob and batch.extend_input_logprob_token_ids is not None:
        score_real_tokens(batch)
    position_map = context.current().positions  # None under another attention backend
    for req in batch.reqs:
        row = req.kv.req_pool_idx
        if row is None:
            continue
        link = link_of(req)
        if link is not None:
            if tree is not None:
                tree.admission.copy_sources(req, batch.req_to_token_pool.req_to_token[row])
            if position_map is not None:
                # Output tokens count too: a retracted request re-prefills them after its prompt.
                slots = len(req.origin_input_ids) + len(req.output_ids)
                position_map.assign(row, link.positions(slots).to(position_map.req_to_pos.device), link.sources)
        elif position_map is not None:
            position_map.release(row)
    if tree is not None:
        tree.figures.sample()  # after CacheBlend's copies have let their stored pages go
    return result
