"""Scheduler side: a laid-out request's token counts in real tokens, and its MEPIC figures,
as SGLang's output streamer reports them.

`prompt_tokens` and `cached_tokens` come from the request's slot counts; for a
request laid out with pad slots those include pads, which are not tokens the
client sent. The accumulator's newest entry is corrected after it is appended:
`cached_tokens` becomes the real tokens whose KV was reused (prefix hits and
chunk tokens from the store, less those of chunks compiled in this request's own
batch: `mepic_compiled_tokens`), `cached_tokens_details` agrees with it, and
the request's report (wire/report.py) rides along as request-level customized
info, which the tokenizer side turns into `meta_info` figures (response_report.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sglang_mepic.cache.compile_rows import is_compile_row
from sglang_mepic.cache.link import link_of
from sglang_mepic.wire import report

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.scheduler_components.output_streamer import _GenerationStreamAccumulator


def accept(original: Callable[..., Any], accumulator: _GenerationStreamAccumulator, *args: Any, req: Req,
           **kwargs: Any) -> Any:
    """SGLang's `_GenerationStreamAccumulator.accept`, with the request's counts in real tokens.
    A compile row (compile_rows.py) has no client: nothing is sent for it."""
    if is_compile_row(req):
        if req.finished():
            # As SGLang marks a finished request it has streamed. Why the ignore: SGLang declares the field
            # None and sets it True itself (unused while mypy reads no SGLang).
            req.finished_output = True  # type: ignore[assignment, unused-ignore]
        return None
    link = link_of(req)
    if link is None:
        return original(accumulator, *args, req=req, **kwargs)
    rep = link.report
    if rep is not None and reads_request_level_info(req):
        req.customized_info = {**(req.customized_info or {}), report.KEY: [rep.to_wire()]}
    rids = accumulator.rids
    before = len(rids)
    result = original(accumulator, *args, req=req, **kwargs)
    if len(rids) > before:
        # Only the pads among the slots the request still holds: SGLang replaces the ids of a request
        # it refuses at intake by one token, and a count less its pads was negative (a Prometheus
        # counter refuses that, and the exception took the tokenizer process down).
        accumulator.prompt_tokens[-1] = link.real_prompt_tokens(accumulator.prompt_tokens[-1])
        if rep is not None and rep.cached_tokens is not None:
            cached = accumulator.cached_tokens[-1] = rep.cached_tokens
            details = accumulator.cached_tokens_details
            if len(details) == len(rids) and isinstance(tiers := details[-1], dict):
                # SGLang's breakdown counts slots, pads included: the device share is what is left
                # of the real tokens once the other tiers' shares are taken. (SGLang makes the dict
                # anew for each output, so it is corrected in place.)
                others = sum(v for k, v in tiers.items() if k != "device" and isinstance(v, int))
                tiers["device"] = max(0, cached - others)
    return result


def reads_request_level_info(req: Req) -> bool:
    """Whether SGLang's `accept` reads a request-level customized-info entry on this call (0.5.23,
    output_streamer.py): a stream's first output, another request's last. Built only then: a
    report built for each streamed output cost the scheduler microseconds a request a decode step,
    for an entry SGLang dropped at every output but one."""
    return req.send_token_offset == 0 if req.stream else bool(req.finished())
