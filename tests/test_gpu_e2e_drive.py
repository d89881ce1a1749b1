"""The GPU end-to-end script (eval/gpu/e2e), checked here without CUDA: the model it writes loads, its checks
can fail, its parts merge, and `run.sh --cpu --smoke` goes through every step against a real CPU server."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eval.gpu.e2e import drive  # the eval package is registered by conftest.py

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "models" / "tiny"


def tokenizer_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "carry" / "model"
    folder.mkdir(parents=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(TINY / f, folder / f)
    return folder


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


@pytest.mark.server
def test_run_sh_cpu_smoke_goes_through_every_step(tmp_path):
    tokenizer_folder(tmp_path)
    carry = tmp_path / "carry"
    subprocess.run([sys.executable, "-m", "eval.gpu.e2e.workload", "--tokenizer", str(TINY), "--requests", "24",
                    "--out", str(carry / "workload.json")], cwd=ROOT, check=True, timeout=300)
    work = json.loads((carry / "workload.json").read_text())
    assert len(work["texts"]) == 24 and work["checks"] and work["chunks"] == 7
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "CARRY": str(carry), "PY": sys.executable}
    run = subprocess.run(["bash", str(ROOT / "eval/gpu/e2e/run.sh"), "--cpu", "--smoke", "--checks", "3",
                          "--new-tokens", "4", "--pool-pages", "1024", "--budget", "900"],
                         env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    mepic = results["systems"]["mepic"]
    assert "error" not in mepic
    assert mepic["server"]["attention_backend"] == "mepic" and mepic["server"]["radix_cache_backend"] == "mepic"
    assert [p["requests"] for p in mepic["points"]] == [16]
    assert len(mepic["checks_cold"]) == 3 and all(len(t) == drive.TOP for t in mepic["checks_cold"])
    assert mepic["warm_vs_cold"]["ok"]  # the invariant: a warm cache does not change a first token's logprobs
    assert mepic["abort_flush"]["ok"] and mepic["abort_flush"]["pages_after_flush"] == 0
    assert (out / "table.md").is_file() and (out / "logs.tar.gz").is_file() and (out / "log.txt").is_file()
    assert not list(out.glob("server-*.log"))  # packed into logs.tar.gz


def test_the_device_sync_check_runs_its_calls_here(tmp_path):
    """eval/gpu/e2e/sync_check.py, the per-batch calls under torch.cuda.set_sync_debug_mode("error") on the
    device: here its dry run (tiny shapes, the Triton interpreter, no sync mode) goes through every call."""
    from eval.gpu.e2e import sync_check

    assert sync_check.main(["--cpu", "--out", str(tmp_path / "sync.json")]) == 0
    verdict = json.loads((tmp_path / "sync.json").read_text())
    assert verdict["ok"] and len(verdict["calls"]) == 8 and "dry run" in verdict["device"]
    assert any("prefill graph hooks" in c["call"] for c in verdict["calls"])
