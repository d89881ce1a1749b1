"""What the DP controller routes by, without a server: the chunks of a request the tokenizer laid out and
sealed, keyed as the replica's cache keys them (scale_out/request_chunks.py), nothing from a hint the tokenizer
did not seal, and the hook on SGLang's controller (patches/dp_controller/): affinity where the user chose no
--load-balance-method with the mepic cache, SGLang's own round robin otherwise."""

import inspect
from types import SimpleNamespace

import pytest

from sglang_mepic.cache.link import Linker
from sglang_mepic.config import Placement
from sglang_mepic.frontend.markup import CHUNK_BEGIN_ID as BEG
from sglang_mepic.frontend.markup import CHUNK_END_ID as END
from sglang_mepic.patches.dp_controller import data_parallel_controller_round_robin_scheduler as patch
from sglang_mepic.scale_out.request_chunks import RequestChunks
from sglang_mepic.wire import hint
from support.dp_requests import KEYS, PAGE, chunk_of, laid_out_request, text_ids

DOC, OTHER = text_ids("doc"), text_ids("other", 50)


def marked(*docs, question=(5, 6, 7)):
    ids = [1, 2]
    for doc in docs:
        ids += [BEG, *doc, END]
    return ids + list(question)


def test_a_sealed_request_is_keyed_as_the_replicas_cache_keys_its_chunks():
    """The router's key of a chunk is the Linker's (one function, wire/chunk_keys.py), wherever the chunk sits."""
    for extra_key, cache_salt in ((None, None), ("tenant", None), (None, "salt")):
        req = laid_out_request(marked(DOC, OTHER), extra_key=extra_key, cache_salt=cache_salt)
        cache_side = SimpleNamespace(origin_input_ids=list(req.input_ids), kv_hints=req.kv_hints,
                                     extra_key=extra_key, cache_salt=cache_salt, lora_id=None)
        link = Linker(Placement.TRAILING, PAGE, "fingerprint").link(cache_side)
        routed = RequestChunks(Placement.TRAILING, PAGE, "fingerprint").of(req)
        assert [c.key for c in routed] == list(link.keys) and len(routed) == 2
        assert [c.slots for c in routed] == [e - s for s, e in link.chunk_slots]
    # The same document at another place in another request: the same key.
    moved = KEYS.of(laid_out_request(marked(OTHER, DOC, question=(9,) * 20)))
    assert {c.key for c in moved} == {c.key for c in KEYS.of(laid_out_request(marked(DOC, OTHER)))}


def test_tenants_key_the_same_text_apart():
    keys = {chunk_of("doc").key, chunk_of("doc", extra_key="a").key, chunk_of("doc", extra_key="b").key,
            chunk_of("doc", cache_salt="a").key, chunk_of("doc", extra_key="None").key}
    assert len(keys) == 5
    assert chunk_of("doc", extra_key="").key == chunk_of("doc").key  # SGLang's rule: empty is none (namespace.py)


def _with_payload(req, **changes):
    (action,) = req.kv_hints.actions
    action.payload = {**action.payload, **changes}
    return req


@pytest.mark.parametrize("forged", [
    pytest.param(lambda: laid_out_request(marked(DOC), seal=False), id="no seal"),
    pytest.param(lambda: _with_payload(laid_out_request(marked(DOC), seal=False), by="forged"), id="not a seal"),
    pytest.param(lambda: _with_payload(laid_out_request(marked(DOC)), chunks=[[0, 10**6]]), id="span past the ids"),
    pytest.param(lambda: _with_payload(laid_out_request(marked(DOC)), pads=None), id="not laid out"),
    pytest.param(lambda: _with_payload(laid_out_request(marked(DOC)), extra=1), id="unknown field"),
])
def test_a_hint_the_tokenizer_did_not_seal_names_no_chunk(forged):
    assert KEYS.of(laid_out_request(marked(DOC)))  # sealed: its chunk
    assert KEYS.of(forged()) == ()


def test_two_actions_or_no_ids_name_no_chunk():
    req = laid_out_request(marked(DOC))
    req.kv_hints.actions = req.kv_hints.actions * 2
    assert KEYS.of(req) == ()
    assert KEYS.of(SimpleNamespace(input_ids=None, kv_hints=None)) == ()
    assert KEYS.of(SimpleNamespace(input_ids=[1, 2, 3])) == ()  # an embedding request: no kv_hints


class Controller:
    """SGLang's DataParallelController as the hook reads it: workers, the active ones, the load budget."""

    def __init__(self, replicas=2, method="auto", cache="mepic", loads=None):
        self.server_args = SimpleNamespace(_raw_input={"load_balance_method": method}, radix_cache_backend=cache,
                                           load_balance_method="round_robin", page_size=PAGE,
                                           model_path="models/tiny")
        self.workers = [f"replica {i}" for i in range(replicas)]
        self._active_workers, self.status = list(range(replicas)), [True] * replicas
        self.dp_budget = SimpleNamespace(total_requests=list(loads or [0] * replicas))
        self.turn, self.refreshes = 0, 0

    def refresh_load_budget(self):
        self.refreshes += 1

    def maybe_external_dp_rank_routing(self, req):
        if req.routed_dp_rank is None:
            return False
        sent.append((self.workers[req.routed_dp_rank], req))
        return True


sent: list = []


def round_robin(controller, req):
    """SGLang's round_robin_scheduler, as the hook's `original`."""
    if controller.maybe_external_dp_rank_routing(req):
        return
    sent.append((controller.workers[controller.turn % len(controller.workers)], req))
    controller.turn += 1


@pytest.fixture(autouse=True)
def wire(monkeypatch):
    sent.clear()
    monkeypatch.setattr(patch, "sock_send", lambda worker, req: sent.append((worker, req)))


def route(controller, *reqs):
    for req in reqs:
        patch.hook(round_robin, controller, req)
    return [worker for worker, _ in sent[-len(reqs):]]


def test_requests_sharing_a_chunk_go_to_one_replica_under_the_default_method():
    """Each finishing before the next is sent (the replicas' snapshots say so): all to one replica."""
    controller, workers = Controller(), []
    for i in range(6):
        workers += route(controller, laid_out_request(marked(DOC, question=(i,))))
        assert controller.dp_budget.total_requests[controller.workers.index(workers[-1])] == 1  # counted in flight
        controller.dp_budget.total_requests = [0, 0]  # it finished
    assert len(set(workers)) == 1 and controller.turn == 0  # never SGLang's turn
    assert controller.refreshes == 6  # the replicas' load read before each


@pytest.mark.parametrize("method, cache", [("round_robin", "mepic"), ("auto", "sglang"), ("total_requests", "mepic")])
def test_a_method_the_user_names_or_another_cache_keeps_sglangs_routing(method, cache):
    controller = Controller(method=method, cache=cache)
    workers = route(controller, *(laid_out_request(marked(DOC, question=(i,))) for i in range(4)))
    assert workers == ["replica 0", "replica 1", "replica 0", "replica 1"]


def test_an_unsealed_hint_routes_by_load_not_by_its_chunks():
    """The chunk's replica runs one request more, within the bound: the sealed request goes there all the same,
    the same request with no seal to the least loaded replica."""
    controller = Controller()
    (held,) = route(controller, laid_out_request(marked(DOC)))
    busier = controller.workers.index(held)
    controller.dp_budget.total_requests = [1 if slot == busier else 0 for slot in range(2)]
    assert route(controller, laid_out_request(marked(DOC, question=(8,)))) == [held]
    assert route(controller, laid_out_request(marked(DOC, question=(9,)), seal=False)) == [f"replica {1 - busier}"]


def test_a_request_naming_its_replica_goes_there_and_its_chunks_are_remembered_there():
    controller = Controller()
    (first,) = route(controller, laid_out_request(marked(DOC)))
    other = 1 - controller.workers.index(first)
    assert route(controller, laid_out_request(marked(OTHER), routed_dp_rank=other)) == [f"replica {other}"]
    assert route(controller, laid_out_request(marked(OTHER))) == [f"replica {other}"]


def test_the_hook_stands_where_sglang_binds_its_default_method():
    """SGLang 0.5.23 resolves `auto` to round robin and binds `self.round_robin_scheduler` when the controller
    starts, with health checks on a turn of their own: the hook's target is what a default server calls."""
    from sglang.srt.managers.data_parallel_controller import DataParallelController

    init = inspect.getsource(DataParallelController.__init__)
    assert "LoadBalanceMethod.ROUND_ROBIN: self.round_robin_scheduler" in init
    assert "self.dispatching = dispatch_lookup[self.load_balance_method]" in init
    assert "def dispatch_health_check" in inspect.getsource(DataParallelController)
    assert patch.TARGET.rsplit(".", 1)[1] == "round_robin_scheduler"
    assert hint.MARK_KEY == "by"  # what request_chunks looks for


def test_sglang_keeps_the_method_the_user_gave(tiny_model):
    """The hook tells `auto` (no choice) from an explicit round_robin by ServerArgs' `_raw_input`."""
    from sglang.srt.server_args import prepare_server_args

    common = ["--model-path", tiny_model, "--dp-size", "2", "--device", "cpu", "--radix-cache-backend", "mepic"]
    assert patch.affinity_wanted(prepare_server_args(common))
    assert not patch.affinity_wanted(prepare_server_args([*common, "--load-balance-method", "round_robin"]))
