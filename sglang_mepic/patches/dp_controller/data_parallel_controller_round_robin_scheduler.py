"""With the mepic cache and `--dp-size` above 1, SGLang's DP controller sends each request to a replica that
holds its chunks, under a bound on load (sglang_mepic/scale_out/affinity.py), instead of in turn.

Under round robin every replica is sent the requests that share a chunk in turn, and each compiles it: a
distinct chunk was compiled once per replica. The controller binds its dispatch method when it starts;
SGLang's default method, `auto`, is round robin, and this hook takes round robin's place where the user chose
no `--load-balance-method` (or `auto`). A method the user names is the user's: `round_robin`, as its name
says, and `total_requests` or `total_tokens`, which this hook does not touch.

What stays SGLang's: a request that names its replica (`routed_dp_rank`) goes there as SGLang sends it (the
router then remembers its chunks there), and health checks take SGLang's own turn (`dispatch_health_check`).
Loads are SGLang's too: each replica's requests in flight (running and waiting) from the load snapshots its
scheduler publishes, read at most every 20 ms (`refresh_load_budget`), plus one for each request sent since,
as its `total_requests` method counts them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from sglang.srt.managers.io_struct import sock_send
from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic import env
from sglang_mepic.scale_out.affinity import AffinityRouter
from sglang_mepic.scale_out.request_chunks import RequestChunks
from sglang_mepic.side_table import SideTable

if TYPE_CHECKING:
    from sglang.srt.managers.data_parallel_controller import DataParallelController
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.data_parallel_controller.DataParallelController.round_robin_scheduler"
HOOK_TYPE = HookType.AROUND

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Routing:
    router: AffinityRouter
    chunks: RequestChunks


# One controller a process; None where it keeps SGLang's round robin.
_ROUTING: SideTable[Routing | None] = SideTable("DP controller's chunk affinity")


def affinity_wanted(server_args: Any) -> bool:
    """Chunk affinity with the mepic cache where the user chose no load-balance method. `_raw_input` is what
    the user gave, before SGLang resolved `auto` to `round_robin` (its `prepare_server_args` keeps both)."""
    raw = getattr(server_args, "_raw_input", None) or {}
    asked = raw.get("load_balance_method", getattr(server_args, "load_balance_method", None))
    return getattr(server_args, "radix_cache_backend", None) == "mepic" and asked in (None, "auto")


def routing_of(controller: DataParallelController) -> Routing | None:
    if controller not in _ROUTING:
        args: Any = controller.server_args  # ServerArgs assembles its fields at run time (arg_groups): mypy sees none
        routing = None
        if affinity_wanted(args):
            routing = Routing(AffinityRouter(), RequestChunks(env.settings().placement, int(args.page_size or 1),
                                                              str(args.model_path)))
            logger.info("MEPIC: the DP controller routes requests by chunk affinity (bounded load, eps %s); "
                        "--load-balance-method round_robin restores SGLang's turn", routing.router.eps)
        _ROUTING.set(controller, routing)
    return _ROUTING.get(controller)


def hook(original: Callable[..., Any], controller: DataParallelController, req: TokenizedGenerateReqInput,
         *args: Any, **kwargs: Any) -> None:
    routing = routing_of(controller)
    if routing is None:
        return original(controller, req, *args, **kwargs)
    chunks = routing.chunks.of(req)
    named = getattr(req, "routed_dp_rank", None)
    if named is not None:  # the request names its replica: SGLang's own routing (or refusal) of it
        result = original(controller, req, *args, **kwargs)
        routing.router.record(chunks, named)
        return result
    controller.refresh_load_budget()
    replicas = [slot for slot in controller._active_workers
                if controller.status[slot] and controller.workers[slot] is not None]
    if not replicas:
        raise RuntimeError("No active DP workers are available for routing.")  # SGLang's own words
    counted = controller.dp_budget.total_requests
    loads = {slot: counted[slot] if slot < len(counted) else 0 for slot in replicas}
    target = routing.router.choose(chunks, replicas, loads)
    if target < len(counted):
        counted[target] += 1  # in flight there until its next snapshot says otherwise (as DPBudget.dispatch)
    sock_send(controller.workers[target], req)
    return None
