"""The per-request report (wire/report.py): made by the scheduler, sent as one customized-info entry,
turned into the response's `mepic_*` figures on the tokenizer side."""

import inspect
from array import array
from types import SimpleNamespace

from sglang_mepic.cache import output_report
from sglang_mepic.cache.link import Link
from sglang_mepic.cache.shape import Shape
from sglang_mepic.frontend import openai_report
from sglang_mepic.wire import report
from sglang_mepic.wire.report import Report


def test_a_report_travels_as_one_entry_and_becomes_the_figures_clients_read():
    sent = Report(recomputed_tokens=39, compiled_tokens=12, chunk_hits=2, chunk_misses=1,
                  residency=["device", "absent", "host"], cached_tokens=58)

    class Accumulator:
        rids, prompt_tokens, cached_tokens, cached_tokens_details = [], [], [], []

    def accept(acc, *, req):
        acc.rids.append(req.rid)
        acc.prompt_tokens.append(len(req.origin_input_ids))
        acc.cached_tokens.append(0)

    req = SimpleNamespace(rid="r", mepic=Link(Shape(array("q", [7] * 64), (), (), (), False), report=sent),
                          customized_info={"other": [1]}, origin_input_ids=[7] * 64, stream=False,
                          finished=lambda: True)
    acc = Accumulator()
    output_report.accept(accept, acc, req=req)
    assert set(req.customized_info) == {"other", report.KEY}  # one entry, SGLang's own kept
    assert acc.cached_tokens == [58]  # cached_tokens replaces SGLang's count, it is not a figure

    # The tokenizer side: a stream repeats the entry; the newest is the one read.
    meta = {"prompt_tokens": 64, report.KEY: [Report().to_wire(), *req.customized_info[report.KEY]]}
    from sglang_mepic.frontend.response_report import unpack
    unpack(meta)
    assert report.KEY not in meta
    assert meta == {"prompt_tokens": 64, "mepic_recomputed_tokens": 39, "mepic_compiled_tokens": 12,
                    "mepic_chunk_hits": 2, "mepic_chunk_misses": 1, "mepic_residency": ["device", "absent", "host"]}
    openai_report.complete(meta)
    assert openai_report.summed([{"meta_info": meta}]) == {
        "recomputed_tokens": 39, "compiled_tokens": 12, "chunk_hits": 2, "chunk_misses": 1,
        "residency": ["device", "absent", "host"], "chunks": []}


def test_anything_else_under_the_key_is_not_a_report():
    from sglang_mepic.frontend.response_report import unpack

    for junk in (None, [], ["x"], [3], "text", {"recomputed_tokens": 1, "evil": 2}):
        meta = {report.KEY: junk}
        unpack(meta)
        assert report.KEY not in meta
        assert set(meta) <= {"mepic_recomputed_tokens", "mepic_compiled_tokens", "mepic_chunk_hits",
                             "mepic_chunk_misses", "mepic_residency"}
    assert Report.from_wire({"recomputed_tokens": 1, "evil": 2}) == Report(recomputed_tokens=1)


def test_the_streamer_hook_sends_the_report_once_per_request():
    from sglang_mepic.patches.scheduler import output_streamer_is_request_level_customized_info_key as hook

    assert hook.hook(lambda streamer, key: False, None, report.KEY)
    assert not hook.hook(lambda streamer, key: False, None, "mepic_recomputed_tokens")


def test_the_wire_form_is_every_field_and_costs_no_deep_copy(monkeypatch):
    """Built once a request a decode step (every streamed output carries it): dataclasses.asdict's deep copy
    took 19 us of the scheduler's time each (eval.bench.step: 1.2 ms a step at batch 64)."""
    import dataclasses
    sent = Report(recomputed_tokens=3, compiled_tokens=1, chunk_hits=2, chunk_misses=0, residency=["host"],
                  cached_tokens=9)
    expected = dataclasses.asdict(sent)
    monkeypatch.setattr(dataclasses, "asdict", lambda *a, **k: (_ for _ in ()).throw(AssertionError("deep copy")))
    monkeypatch.setattr(dataclasses, "_asdict_inner", lambda *a, **k: (_ for _ in ()).throw(AssertionError("deep copy")))
    wire = sent.to_wire()
    assert wire == expected and wire["residency"] is not sent.residency
    assert Report.from_wire(wire) == sent


class _StreamedReq:
    """What SGLang's `_GenerationStreamAccumulator.accept` reads of a request (0.5.23), no more."""

    def __init__(self, stream: bool, link):
        self.rid, self.stream, self.mepic, self.beam_group = "r", stream, link, None
        self.output_ids, self.send_token_offset, self.finished_reason = [], 0, None
        self.send_output_token_logprobs_offset = 0
        self.finished_output, self.finished_len, self.customized_info = None, None, None
        self.sampling_params = SimpleNamespace(stream_interval=None, skip_special_tokens=True,
                                               spaces_between_special_tokens=True, no_stop_trim=False)
        self.origin_input_ids, self.reasoning_tokens, self.cached_tokens = [7] * 64, 0, 0
        self.retraction_count, self.weight_version_events = 0, []
        self.time_stats, self.http_worker_ipc, self.decoded_text, self.send_decode_id_offset = None, None, "", 0

    def finished(self):
        return self.finished_reason is not None

    def check_match_stop_str_prefix(self):
        return False

    @property
    def output_ids_through_stop(self):
        return self.output_ids

    def get_mm_token_counts(self):
        return 0, 0, 0

    def init_incremental_detokenize(self):
        return self.output_ids, 0


def test_the_report_is_built_only_for_the_output_sglang_sends_it_with(monkeypatch):
    """SGLang reads a request-level entry at a stream's first output and at another request's last; at every
    other output it drops it. Built at each, the report cost the scheduler its time once a request a decode
    step. Driven through SGLang's own accumulator, one a step as its streamer makes them."""
    from sglang.srt.managers.scheduler_components.output_streamer import _GenerationStreamAccumulator

    from sglang_mepic.patches.scheduler import output_streamer_is_request_level_customized_info_key as level

    # SGLang's own method: where another test applied the plugin's hooks in this process, the class holds the hook
    sglang_accept = inspect.unwrap(_GenerationStreamAccumulator.accept)
    built = []
    to_wire = Report.to_wire
    monkeypatch.setattr(Report, "to_wire", lambda self: built.append(1) or to_wire(self))
    sent = Report(recomputed_tokens=5, cached_tokens=40)
    shape = Shape(array("q", [7] * 64), ((5, 11),), (), (), False)
    for stream in (True, False):
        built.clear()
        req = _StreamedReq(stream, Link(shape, report=sent))
        payloads = []
        for step in range(6):
            req.output_ids.append(100 + step)
            if step == 5:
                req.finished_reason = SimpleNamespace(to_json=lambda: {"type": "length"})
            acc = _GenerationStreamAccumulator(
                return_logprob=False, return_hidden_states=False, return_routed_experts=False,
                return_indexer_topk=False, spec_algorithm=SimpleNamespace(is_none=lambda: True),
                disaggregation_mode=None, default_stream_interval=1, default_force_stream_interval=3,
                get_cached_tokens_details=lambda r: None, current_weight_version=None,
                is_request_level_customized_info_key=lambda key: level.hook(lambda streamer, k: False, None, key))
            output_report.accept(sglang_accept, acc, req=req)
            if acc.rids:
                assert acc.prompt_tokens == [64 - 11] and acc.cached_tokens == [40]
                payloads.append(acc.customized_info.get(report.KEY, [[]])[0])
        # a stream sends every step, another request every third token and at its end
        assert len(payloads) == (6 if stream else 2)
        with_report = [i for i, entry in enumerate(payloads) if entry]
        assert with_report == ([0] if stream else [1]), (stream, payloads)
        assert len(built) == 1, (stream, len(built))
        assert payloads[with_report[0]] == [sent.to_wire()]
