"""The per-request report (wire/report.py): made by the scheduler, sent as one customized-info entry,
turned into the response's `mepic_*` figures on the tokenizer side."""

from types import SimpleNamespace

from sglang_mepic.cache import output_report
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

    req = SimpleNamespace(rid="r", mepic=SimpleNamespace(report=sent, pads=()), customized_info={"other": [1]},
                          origin_input_ids=[7] * 64)
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
