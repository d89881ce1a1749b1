"""The GPU end-to-end script (eval/gpu/e2e), checked here without CUDA: the model it writes loads, its checks The unit half: the whole description, and the tests on a server, are in
e2e/test_gpu_e2e_drive_server.py."""

import json

import pytest

from eval.gpu.e2e import drive  # the eval package is registered by conftest.py
from support.gpu_e2e_drive import tokenizer_folder


def test_the_written_model_loads_whole_and_is_the_same_every_time(tmp_path):
    from transformers import LlamaForCausalLM

    tok = tokenizer_folder(tmp_path)
    a = drive.write_model(tmp_path / "a", tok, "tiny", "float32", "cpu")
    b = drive.write_model(tmp_path / "b", tok, "tiny", "float32", "cpu")
    assert a["checksum"] == b["checksum"] and a["params"] == b["params"]
    model, info = LlamaForCausalLM.from_pretrained(tmp_path / "a", output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched weights
    assert model.config.vocab_size == a["vocab_size"] == 4096 + 5
    std = model.model.layers[0].mlp.up_proj.weight.std().item()
    assert abs(std - drive.WEIGHT_STD) < 0.002  # random, not the near-zero of a dummy load
    shapes = dict(drive.llama_tensors({**drive.SHAPES["llama3-8b"], "vocab_size": 49152}))
    assert shapes["model.layers.31.mlp.down_proj.weight"] == (4096, 14336)
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (1024, 4096)
    assert abs(sum(int.__mul__(*s) if len(s) == 2 else s[0] for s in shapes.values()) / 1e9 - 7.38) < 0.01


def test_the_forced_fused_op_backend_is_one_sglang_knows():
    """SGLang reads SGLANG_FORCE_FUSED_OP_BACKEND as a KernelBackend at the first fused op: a word it does not
    know ("native" did) fails every request, the warm-up first."""
    from sglang.kernels.fused_op import BACKEND_METHODS
    from sglang.kernels.spec import KernelBackend

    assert BACKEND_METHODS[KernelBackend(drive.FUSED_OP_BACKEND)] == "forward_native"


def argparse_namespace(**kw):
    import argparse

    return argparse.Namespace(**kw)


def top(tokens, shift=0.0):
    return [(t, -1.0 - 0.1 * i + shift) for i, t in enumerate(tokens)]


def test_the_checks_pass_on_matching_distributions_and_fail_otherwise():
    same = drive.judged([drive.compare(top(range(20)), top(range(20), 0.01))], "bfloat16")
    assert same["ok"] and same["min_overlap"] == 20 and same["max_diff"] == pytest.approx(0.01)
    moved = drive.judged([drive.compare(top(range(20)), top(range(20), 0.5))], "bfloat16")
    assert not moved["ok"]
    other = drive.judged([drive.compare(top(range(20)), top(range(10, 30)))], "bfloat16")
    assert not other["ok"] and other["min_overlap"] == 10
    prompts = [top(range(k, k + 20)) for k in (0, 100, 200)]
    systems = {"full": {"checks_cold": prompts, "checks_warm": prompts},
               "vanilla": {"checks_cold": prompts, "checks_warm": prompts[:2] + [top(range(20), 0.5)]},
               "mepic": {"checks_cold": [top(range(20), 1.0)] * 3}}
    checks = drive.pairs(systems, "bfloat16")
    assert checks["vanilla vs full, cold"]["ok"] and not checks["vanilla vs full, warm"]["ok"]
    assert not checks["mepic vs full, cold"]["ok"] and not checks["mepic vs full, cold"]["judged"]  # reported
    assert checks["control: full, each prompt vs the next"]["ok"]  # different prompts told apart
    systems["full"]["checks_cold"] = [prompts[0], prompts[0], prompts[1]]  # one pair of prompts alike
    assert not drive.pairs(systems, "bfloat16")["control: full, each prompt vs the next"]["ok"]


def test_the_gpu_flags_are_flags_sglang_accepts():
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = argparse.Namespace(graph_max_bs=128)
    parsed = parser.parse_args(["--model-path", "m", "--dtype", "bfloat16", *drive.GPU_VANILLA, *drive.gpu_flags(args),
                                "--max-total-tokens", "262144", "--decode-log-interval", "8", "--sampling-backend",
                                "pytorch", "--context-length", "8192"])
    assert parsed.cuda_graph_max_bs_decode == 128 and parsed.attention_backend == "triton"


def test_a_system_that_would_not_fit_the_budget_is_not_started():
    args = argparse_namespace(requests=300, rates=[4.0, 12.0], startup_estimate=150.0)
    assert drive.needed_seconds("mepic", args) == 150 + (75 + 5) + (25 + 5) + 15
    assert drive.needed_seconds("recompute-all", args) == 165


def test_two_calls_merge_and_compare_across_only_on_the_same_weights(tmp_path):
    prompts = [top(range(k, k + 20)) for k in (0, 100)]
    point = {"rate": 4.0, "ttft_p50": 0.2, "peak_kv_pages": 100, "output_tok_s": 900.0, "mean_kv_pages": 50}
    one = {"systems": {"full": {"checks_cold": prompts}, "vanilla": {"checks_cold": prompts, "points": [point]}},
           "calls": [{"systems": ["vanilla", "full"]}], "model": {"checksum": 1.5, "dtype": "bfloat16"},
           "device": {"name": "H100"}, "commit": "abc"}
    two = {"systems": {"mepic": {"checks_cold": prompts, "points": [{**point, "ttft_p50": 0.1}]},
                       "epic-16": {"points": [{**point, "peak_kv_pages": 400}]}},
           "calls": [{"systems": ["epic-16", "mepic"]}], "model": {"checksum": 1.5, "dtype": "bfloat16"},
           "device": {"name": "H100"}, "commit": "abc"}
    for name, r in (("p1", one), ("p2", two)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(r))
    merged = drive.merge([tmp_path / "p1", tmp_path / "p2"], tmp_path / "out")
    assert list(merged["systems"]) == ["full", "vanilla", "mepic", "epic-16"] and len(merged["calls"]) == 2
    assert merged["checks"]["mepic vs full, cold"]["ok"]
    assert merged["ratios"]["ttft_p50 mepic/vanilla @ 4"] == 0.5
    assert merged["ratios"]["peak_kv_pages mepic/epic-16 @ 4"] == 0.25
    assert "| mepic | 4.0 |" in (tmp_path / "out" / "table.md").read_text()
    one["systems"]["vanilla"]["device"], two["systems"]["mepic"]["device"] = "h100 call 1", "h200 call 2"
    for name, r in (("p1", one), ("p2", two)):
        (tmp_path / name / "results.json").write_text(json.dumps(r))
    apart = drive.merge([tmp_path / "p1", tmp_path / "p2"], tmp_path / "out3")["ratios"]
    assert "ttft_p50 mepic/vanilla @ 4" not in apart  # timings from two machines are not compared
    assert apart["peak_kv_pages mepic/epic-16 @ 4"] == 0.25
    two["model"]["checksum"] = 2.5
    (tmp_path / "p2" / "results.json").write_text(json.dumps(two))
    assert drive.merge([tmp_path / "p1", tmp_path / "p2"], tmp_path / "out2")["checks"] == {}


def test_the_device_sync_check_runs_its_calls_here(tmp_path):
    """eval/gpu/e2e/sync_check.py, the per-batch calls under torch.cuda.set_sync_debug_mode("error") on the
    device: here its dry run (tiny shapes, the Triton interpreter, no sync mode) goes through every call."""
    from eval.gpu.e2e import sync_check

    assert sync_check.main(["--cpu", "--out", str(tmp_path / "sync.json")]) == 0
    verdict = json.loads((tmp_path / "sync.json").read_text())
    assert verdict["ok"] and len(verdict["calls"]) == 8 and "dry run" in verdict["device"]
    assert any("prefill graph hooks" in c["call"] for c in verdict["calls"])


LOG = """\
[2026-11-29 10:00:00] Prefill batch, #new-seq: 8, #new-token: 1247, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0, cuda graph: True, input throughput (token/s): 884.87
[2026-11-29 10:00:00] Decode batch, #running-req: 8, #token: 1300, token usage: 0.00, cuda graph: True, gen throughput (token/s): 400.00, #queue-req: 0
[2026-11-29 10:00:01] Decode batch, #running-req: 8, #token: 1364, token usage: 0.00, cuda graph: True, gen throughput (token/s): 800.00, #queue-req: 0
[2026-11-29 10:00:01] Decode batch, #running-req: 8, #token: 1428, token usage: 0.00, cuda graph: True, gen throughput (token/s): 1000.00, #queue-req: 0
[2026-11-29 10:00:02] Prefill batch, #new-seq: 1, #new-token: 100, #cached-token: 0, token usage: 0.00, #running-req: 8, #queue-req: 0, cuda graph: True, input throughput (token/s): 50.00
[2026-11-29 10:00:02] Decode batch, #running-req: 9, #token: 1500, token usage: 0.00, cuda graph: True, gen throughput (token/s): 300.00, #queue-req: 0
[2026-11-29 10:00:02] Decode batch, #running-req: 9, #token: 1572, token usage: 0.00, cuda graph: True, gen throughput (token/s): 900.00, #queue-req: 0
[2026-11-29 10:00:03] Decode batch, #running-req: 4, #token: 700, token usage: 0.00, cuda graph: True, gen throughput (token/s): 700.00, #queue-req: 0
"""


def test_decode_step_time_comes_from_decode_only_log_intervals():
    """An interval is decode-only when the line before it was a decode line of the same batch: no prefill ran in
    it (a Prefill batch line would sit between) and no request joined or left. Its step time is batch / rate."""
    steps = drive.decode_only_steps(LOG)
    assert steps == [(8, 8 / 800), (8, 8 / 1000), (9, 9 / 900)]  # not the first after a prefill, not 9 -> 4
    summary = drive.step_summary(steps)
    assert summary["decode_step_windows"] == 3 and summary["decode_step_ms_p50"] == 10.0
    assert summary["decode_step_tok_s_p50"] == 100.0 and summary["decode_step_batch_p50"] == 8
    assert drive.step_summary([])["decode_step_ms_p50"] is None


METRICS = """\
# HELP sglang:forward_execution_seconds_total Total time that GPU is busy executing model forward passes.
# TYPE sglang:forward_execution_seconds_total counter
sglang:forward_execution_seconds_total{category="decode",model_name="m",tp_rank="0"} {gd}
sglang:forward_execution_seconds_total{category="extend",model_name="m",tp_rank="0"} {ge}
sglang:cuda_graph_passes_total{mode="decode_cuda_graph",model_name="m"} {dg}
sglang:cuda_graph_passes_total{mode="prefill_cuda_graph",model_name="m"} {pg}
sglang:cuda_graph_passes_total{mode="prefill_none",model_name="m"} 2.0
sglang:cuda_graph_passes_created{mode="prefill_none",model_name="m"} 1.7e9
sglang:scheduler_stage_seconds_total{category="run_batch",forward_overlap="none",model_name="m"} {rb}
sglang:scheduler_stage_seconds_total{category="run_batch",forward_overlap="full",model_name="m"} 1.0
sglang:scheduler_stage_seconds_total{category="idle",forward_overlap="none",model_name="m"} {idle}
sglang:scheduler_process_cpu_seconds_total{model_name="m"} {cpu}
"""


def metrics_page(**values):
    page = METRICS
    for k, v in values.items():
        page = page.replace("{" + k + "}", str(float(v)))
    return page


def test_the_profiles_read_sglangs_counters_as_deltas_per_pass():
    before = drive.counters(metrics_page(gd=1.0, ge=2.0, dg=100, pg=10, rb=2.0, idle=5.0, cpu=10.0))
    after = drive.counters(metrics_page(gd=1.5, ge=2.2, dg=200, pg=14, rb=2.6, idle=9.0, cpu=10.5))
    assert before["sglang:cuda_graph_passes_total{mode=decode_cuda_graph}"] == 100
    assert before["sglang:scheduler_stage_seconds_total{category=run_batch}"] == 3.0  # overlap labels summed
    assert not any("created" in k for k in before)
    d = drive.delta(after, before)
    assert drive.passes(d, "decode") == 100 and drive.passes(d, "prefill") == 4
    costs = drive.pass_costs(d)
    assert costs["gpu_forward_ms_per_decode_pass"] == 5.0 and costs["gpu_forward_ms_per_prefill_pass"] == 50.0
    assert costs["scheduler_cpu_ms_per_pass"] == round(500 / 104, 3) and costs["prefill_graph_passes"] == 4
    assert costs["scheduler_stage_ms_per_pass"] == {"run_batch": round(600 / 104, 3)}  # idle left out
    assert drive.pass_costs({})["gpu_forward_ms_per_decode_pass"] is None


def test_ttft_parts_add_up_to_the_ttft(monkeypatch):
    sent = 1000.0
    meta = {"request_received_ts": 1000.002, "api_server_dispatch_finish_ts": 1000.010, "queue_time": 0.030,
            "forward_entry_time": 1000.050, "prefill_finished_time": 1000.120, "first_token_latency": 0.12}
    output = ([1], "x", meta, 0.125, 0.5, sent)
    parts = drive.ttft_parts(output)
    assert parts["tokenizer"] == pytest.approx(0.008) and parts["queue"] == 0.030
    assert parts["scheduler_intake"] == pytest.approx(0.010) and parts["prefill_forward"] == pytest.approx(0.070)
    assert sum(parts.values()) == pytest.approx(0.125) and parts["return_path"] == pytest.approx(0.005)
    assert drive.ttft_parts(([1], "x", {"queue_time": 0.1}, 0.1, 0.5, sent)) is None
    summary = drive.ttft_summary([output, output, ([1], "x", {}, 0.1, 0.5, sent)])
    assert summary["requests"] == 2 and summary["queue_ms_p50"] == 30.0
    # eval.experiments.run keeps these fields of a streamed request's meta_info once drive's main has asked, and
    # importing drive alone changes nothing of eval.experiments.run (test_eval_checkpoint saw the extra fields)
    from eval.experiments import run

    assert "request_received_ts" not in run.kept_meta({k: 1 for k in drive.TIME_META})
    monkeypatch.setattr(run, "META", run.META)
    drive.keep_time_meta()
    assert set(drive.TIME_META) <= set(run.kept_meta({k: 1 for k in drive.TIME_META}))


def test_greedy_graphs_vs_eager_is_judged_on_identical_tokens_and_on_which_path_ran(tmp_path, monkeypatch):
    """One server: a pass with prefill graphs, then one with the eager switch file present (the backend declines
    graphs while it exists); the switch is gone afterwards. Judged: identical tokens, graph passes in the first
    pass, none in the second."""
    switch = tmp_path / "eager-switch"
    state = {"graph": 0, "none": 0, "flushes": 0, "diverge": False}

    def generate(url, text, new_tokens, top=0):
        eager = switch.exists()
        state["none" if eager else "graph"] += 1
        tokens = [len(text), 2, 3] if not (eager and state["diverge"] and text == "b") else [len(text), 2, 9]
        tops = [[[-0.1, t], [-0.3, 0]] for t in tokens]
        return {"output_ids": tokens, "meta_info": {"output_top_logprobs": tops}}

    monkeypatch.setattr(drive, "generate", generate)
    monkeypatch.setattr(drive, "flush", lambda url: state.__setitem__("flushes", state["flushes"] + 1))
    monkeypatch.setattr(drive, "graph_passes", lambda url: {"prefill_cuda_graph": state["graph"],
                                                            "prefill_none": state["none"]})
    server = argparse_namespace(url="http://x")
    ok = drive.greedy_graphs_vs_eager(server, ["a", "b"], 3, switch, cpu=False)
    assert ok["ok"] and ok["identical"] == 2 and ok["graphs_ran"] and ok["eager_ran"] and not switch.exists()
    assert ok["passes"] == {"graphs": {"prefill_cuda_graph": 2}, "eager": {"prefill_none": 2}} and state["flushes"] == 2
    state["diverge"] = True
    parted = drive.greedy_graphs_vs_eager(server, ["a", "b"], 3, switch, cpu=False)
    assert not parted["ok"] and parted["parted"] == [{"prompt": 1, "at_token": 2, "eager_top2_margin": 0.2}]
    state["diverge"] = False
    monkeypatch.setattr(drive, "graph_passes", lambda url: {"prefill_none": state["graph"] + state["none"]})
    no_graphs = drive.greedy_graphs_vs_eager(server, ["a"], 3, switch, cpu=False)
    assert no_graphs["identical"] == 1 and not no_graphs["ok"]  # graphs never ran: nothing was compared
    assert drive.greedy_graphs_vs_eager(server, ["a"], 3, switch, cpu=True)["ok"]  # CPU: no graphs, not judged
    checks = drive.other_checks({"systems": {"mepic": {"greedy_graphs_vs_eager": parted}}})
    (name, check), = checks.items()
    assert name == "mepic: greedy tokens, prefill graphs vs eager" and not check["ok"] and check["judged"]


def test_the_served_sync_probe_is_judged_from_the_server_log():
    from sglang_mepic.attention import sync_probe

    p = sync_probe.LOG_PREFIX
    clean = f"[x] {p} on (warn): watching\n[x] {p} 2000 calls watched, 0 synchronised (none)\n"
    verdict = drive.sync_probe_verdict(clean)
    assert verdict["ok"] and verdict["watched_calls"] == 2000 and verdict["judged"]
    dirty = clean + (f"[x] {p} init_forward_metadata synchronised (1 so far): called a synchronizing CUDA operation "
                     "at positions.py:64 assign\n")
    verdict = drive.sync_probe_verdict(dirty)
    assert not verdict["ok"] and verdict["synchronised"][0]["call"] == "init_forward_metadata"
    assert not drive.sync_probe_verdict("")["judged"]  # the probe was not on: nothing to judge
    results = {"systems": {"mepic": {"sync_probe": verdict}},
               "sync_check": {"ok": True, "judged": True, "calls": [{"call": "c", "ok": True}], "synchronised": []}}
    checks = drive.other_checks(results)
    assert not checks["mepic: no host sync in the backend's per-batch calls (served)"]["ok"]
    assert checks["sync check: per-batch calls on the device, sync debug mode error"]["ok"]


def test_part_4_is_one_call_vanilla_and_mepic_with_every_check_and_fits_its_budget():
    """Part 4's defaults (150 requests a rate, budget 540 s, the sync check on); what is given on the command
    line wins. With the H200's measured starts the call fits: sync check, model, vanilla, mepic."""
    import argparse

    def resolved(*argv):
        ap = argparse.Namespace(part=None, smoke=False, requests=None, budget=None, sync_check=None, rates="4,12",
                                cpu=False, startup_estimate=None, sync_debug=None, decode_profile=None,
                                profile_new_tokens=64, greedy=9)
        for k, v in zip(argv[::2], argv[1::2]):
            setattr(ap, k, v)
        drive.resolve(ap)
        return ap

    args = resolved("part", 4)
    assert drive.PARTS[4] == ["vanilla", "mepic"] and args.rates == [4.0, 12.0]
    assert (args.requests, args.budget, args.sync_check, args.sync_debug) == (150, 540, True, "warn")
    assert args.decode_profile == [8, 16, 32, 64]
    assert resolved("part", 4, "requests", 300, "sync_check", False).requests == 300
    part1 = resolved("part", 1)
    assert part1.requests == 300 and not part1.sync_check and part1.decode_profile == []
    assert resolved("part", 1, "decode_profile", "8,64").decode_profile == [8, 64]
    assert resolved("cpu", True).sync_debug == ""
    smoke = resolved("smoke", True)
    assert smoke.requests == 16 and smoke.rates == [4.0] and smoke.decode_profile == [2, 4]
    need = {n: drive.needed_seconds(n, args) for n in drive.PARTS[4]}
    assert need["mepic"] > need["vanilla"]  # the graphs-vs-eager check
    # Measured on the H200: model 19 s; vanilla's start 110-131 s; the sync check is counted as 45 s.
    vanilla = 131 + need["vanilla"] - args.startup_estimate
    assert 45 + 19 + vanilla + need["mepic"] <= args.budget
    assert 26 + 45 + 19 + vanilla + (125 + need["mepic"] - args.startup_estimate) <= 590 - 20  # timeout_s 590


def test_the_table_names_both_decode_figures_and_shows_the_profiles(tmp_path):
    point = {"rate": 4.0, "ttft_p50": 0.1, "decode_tok_s_p50": 90.0, "decode_step_ms_p50": 9.5,
             "decode_step_tok_s_p50": 105.3, "peak_kv_pages": 10, "mean_kv_pages": 5,
             "ttft_parts": {"requests": 3, **{f"{k}_ms_p50": 1.0 for k in drive.TTFT_PARTS}},
             "passes": {"gpu_forward_ms_per_prefill_pass": 20.0, "prefill_passes": 5, "prefill_graph_passes": 5,
                        "scheduler_cpu_ms_per_pass": 1.5}}
    profile = [{"batch": 8, "decode_step_ms_p50": 9.0, "windows": 4, "gpu_forward_ms_per_decode_pass": 8.0,
                "step_minus_gpu_forward_ms": 1.0, "scheduler_cpu_ms_per_pass": 2.0,
                "scheduler_stage_ms_per_pass": {"run_batch": 0.5}}]
    results = {"device": {"name": "H200"}, "commit": "c", "checks": {},
               "systems": {"mepic": {"points": [point], "decode_profile": profile, "device": "one"},
                           "vanilla": {"points": [{**point, "decode_step_ms_p50": 10.0}],
                                       "decode_profile": [{**profile[0], "gpu_forward_ms_per_decode_pass": 7.0}],
                                       "device": "one"}}}
    results["ratios"] = drive.ratios(results["systems"])
    assert results["ratios"]["decode_step_ms_p50 mepic/vanilla @ 4"] == 0.95
    assert results["ratios"]["gpu_forward_ms_per_decode_pass mepic/vanilla @ batch 8"] == round(8 / 7, 3)
    text = drive.table(results)
    assert "decode_tok_s_p50: a request's own rate, first token to last" in text
    assert "| mepic | 8 | 9.0 | 4 | 8.0 | 1.0 | 2.0 | run_batch 0.5 |" in text
    assert "| mepic | 4 | 100.0 | " + " | ".join(["1.0"] * len(drive.TTFT_PARTS)) + " | 20.0 | 5 (5) | 1.5 |" in text


def test_capacity_part_5_runs_sglangs_fp8_and_mepics_at_part_1s_bytes():
    """Issue 73 on the device: SGLang's triton backend and mepic over an e4m3 cache, each given the pages
    that part 1's 2,048 bf16 pages take in bytes (4,096), and flags SGLang's own parser accepts."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    from eval.gpu.e2e import capacity as device_capacity

    args = device_capacity.parser().parse_args(["--part", "5"])
    args.dtype, args.sync_debug, args.equal_bytes = "bfloat16", "", True
    assert device_capacity.PARTS[5] == ("squad", ("vanilla-fp8", "mepic-fp8"))
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    for system, backend in (("vanilla-fp8", "triton"), ("mepic-fp8", None)):
        flags, common, _ = device_capacity.server_of(system, args, 2048, 8192)
        assert flags[-2:] == ["--kv-cache-dtype", "fp8_e4m3"]
        assert common[common.index("--max-total-tokens") + 1] == str(4096 * 16)
        mepic_flags = [f for i, f in enumerate(flags) if f.startswith("--mepic") or flags[i - 1].startswith("--mepic")]
        parsed = parser.parse_args(["--model-path", "m", *[f for f in flags if f not in mepic_flags], *common])
        assert parsed.kv_cache_dtype == "fp8_e4m3" and parsed.attention_backend == backend
    flags, common, _ = device_capacity.server_of("mepic", args, 2048, 8192)  # part 1's: the bf16 pool as it was
    assert "--kv-cache-dtype" not in flags and common[common.index("--max-total-tokens") + 1] == str(2048 * 16)


def test_every_device_capacity_part_starts_servers_the_launcher_and_sglang_accept():
    """The private-copy baseline read first, epic-16-host, runs on the device (part 2 on SQuAD, part 4 on long
    prompts), on the device and in the dry run alike: its host tier is given in both, since the launcher refuses
    --mepic-chunk-store host without one."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    from eval.gpu.e2e import capacity as device_capacity
    from sglang_mepic.launch.mepic_flags import split_mepic_flags

    assert device_capacity.PARTS[2] == ("squad", ("epic-16-host", "epic-16"))
    assert "epic-16-host" in device_capacity.PARTS[4][1]
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    for cpu in (False, True):
        args = device_capacity.parser().parse_args(["--part", "2"] + (["--cpu"] if cpu else []))
        args.dtype, args.sync_debug, args.equal_bytes = ("float32" if cpu else "bfloat16"), "", False
        for part, (_, systems) in device_capacity.PARTS.items():
            for system in systems:
                flags, common, _ = device_capacity.server_of(system, args, 2048, 8192)
                rest, variables = split_mepic_flags([*flags, *common])  # raises where the launcher would refuse
                parser.parse_args(["--model-path", "m", *rest])
                if system == "epic-16-host":
                    assert variables["SGLANG_MEPIC_CHUNK_STORE"] == "host", (part, cpu)
                    assert float(variables["SGLANG_MEPIC_HOST_TIER_GB"]) > 0, (part, cpu)
