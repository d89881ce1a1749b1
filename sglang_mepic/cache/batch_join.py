"""A request joins SGLang's prefill batch (`PrefillAdder.add_one_req`, patch `schedule_policy_add_one_req`).

The compile rows its plan reads are added right before it, each once; if one
does not fit whole (the budget, a row of the request pool, chunked prefill),
neither does the request, and SGLang's loop stops as it does for a request that
does not fit. In EPIC and CacheBlend the request is skipped for the round
instead (it copies stored KV before its forward, so it waits until its compile
rows have run).

An EPIC request's private copy of the stored pages it reads (admission.py) is
charged to SGLang's budget with the request: SGLang counts those pages as its
prefix, which costs nothing, so without the charge a request was admitted on the
pages it computes and found no room for its copy. Charged, it waits in SGLang's
queue like any request that does not fit, as EPIC's requests wait for theirs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from sglang_mepic.cache.admission import private_copy_slots
from sglang_mepic.cache.compile_rows import layout_of
from sglang_mepic.cache.link import link_of
from sglang_mepic.cache.radix_cache import mepic_cache

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder

    from sglang_mepic.cache.compile_rows import CompileLayout


def add_request(original: Callable[..., Any], adder: PrefillAdder, req: Req, *args: Any,
                **kwargs: Any) -> AddReqResult:
    """SGLang's `PrefillAdder.add_one_req`, with the compile rows the request reads added first."""
    from sglang.srt.managers.schedule_policy import AddReqResult

    tree = mepic_cache(adder)
    link = link_of(req)
    if tree is None or link is None:
        return original(adder, req, *args, **kwargs)
    if not link.compiling:
        return _with_private_copy(original, adder, req, *args, **kwargs)
    rows = tree.compile_rows
    batched = {id(r) for r in adder.can_run_list}
    todo: list[Req] = []
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
            link.made_for.add(cast("CompileLayout", layout_of(row)).key)  # a compile row: it has one
        if not whole:
            return result if result is not AddReqResult.CONTINUE else AddReqResult.OTHER
        if result is not AddReqResult.CONTINUE:
            return result
    if not fits:
        return AddReqResult.OTHER  # no request row left for it: the batch is full
    if link.wait:
        return AddReqResult.CONTINUE  # skipped this round: it reads its chunks once they are stored
    return _with_private_copy(original, adder, req, *args, **kwargs)


def _with_private_copy(original: Callable[..., Any], adder: PrefillAdder, req: Req, *args: Any,
                       **kwargs: Any) -> AddReqResult:
    """SGLang's admission of `req`, with its private copy charged to the budget beside its extend:
    kept when SGLang takes the request into the batch, given back when it does not."""
    tree, link = mepic_cache(adder), link_of(req)
    copy = private_copy_slots(link, tree.mode) if tree is not None and link is not None else 0
    if not copy:
        return original(adder, req, *args, **kwargs)
    budget = adder.memory_budget
    budget.total_offset += copy
    budget.current_offset += copy
    result = original(adder, req, *args, **kwargs)
    if not (adder.can_run_list and adder.can_run_list[-1] is req):
        budget.total_offset -= copy
        budget.current_offset -= copy
    return result
