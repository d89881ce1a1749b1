"""Write a chunked request's slot positions into the position map when it is scheduled.

Every request passes `ScheduleBatch.prepare_for_extend` with its KV row assigned,
at each (chunked-)prefill pass: rows of laid-out requests get their plan's
positions, every other row is marked unplanned (identity positions).
"""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic import positions
from sglang_mepic.request_layout import pad_runs, slot_positions

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_extend"
HOOK_TYPE = HookType.AFTER


def hook(result, batch, *args, **kwargs):
    position_map = positions.ACTIVE
    if position_map is None:  # another attention backend: nothing to write
        return result
    for req in batch.reqs:
        row = req.kv.req_pool_idx
        if row is None:
            continue
        runs = pad_runs(req.kv_hints)
        if runs:
            # Output tokens count too: a retracted request re-prefills them after its prompt.
            slots = len(req.origin_input_ids) + len(req.output_ids)
            position_map.assign(row, slot_positions(slots, runs).to(position_map.req_to_pos.device))
        else:
            position_map.release(row)
    return result
