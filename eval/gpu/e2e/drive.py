"""The real SGLang server on a GPU, end to end: vanilla (SGLang's triton backend and radix cache), `full`,
`epic-16` and mepic, on an 8B-shaped model, with correctness checks. Run by run.sh on the device:

    bash eval/gpu/e2e/run.sh --smoke          # one server (mepic), a few requests: about 3 minutes
    bash eval/gpu/e2e/run.sh --part 1         # vanilla, mepic (the workload at both rates, the checks)
    bash eval/gpu/e2e/run.sh --part 2         # full, epic-16 (the same), recompute-all (the checks only)
    bash eval/gpu/e2e/run.sh --part 3         # mepic (prefill graphs, the default) and mepic-eager
    bash eval/gpu/e2e/run.sh --part 4         # issue 69 in one call: vanilla and mepic at 4 and 12 req/s,
                                              # the sync check, graphs vs eager, decode profile, TTFT parts

Here, without CUDA, the same steps on a tiny model (float32, torch_native for vanilla, no graphs):

    .venv/bin/python -m eval.gpu.e2e.drive --cpu --smoke --carry .gpu_e2e --out /tmp/e2e

Per call: one model is written (config of the chosen shape, SmolLM2's tokenizer from the carry, random
normal weights of std 0.02 with a fixed seed, so every call writes the same model), then each system's
server is started once with CUDA graphs for decode, and runs, in order:
1. checks, cold: the first output token's top-20 logprobs of the workload's check prompts;
2. the SQuAD paper workload (7 chunks, 0.85 reuse; pre-rendered in the carry) at each rate, through
   eval.experiments.run.run_point (flush, Poisson arrivals, streaming, KV pages sampled from /metrics);
3. checks, warm: the same prompts after the workload (a request's output must not depend on the cache);
4. an abort (a stream dropped after its first token) and a flush: the server keeps serving, and the
   pages in use return to zero;
5. CUDA-graph passes from /metrics (`sglang:cuda_graph_passes_total`: decode with and without a graph).
Besides, where asked (part 4 asks all): before the servers, the attention side's per-batch calls on the device
under torch.cuda's sync debug mode "error" (`sync_check.py`); on a mepic server with prefill graphs, right after
the cold checks, the same requests' greedy tokens with prefill graphs and without (the backend's eager switch,
one server, one cache state; judged: identical); per rate, the TTFT of each request in parts (SGLang's
timestamps) and the decode step time of the decode-only intervals in the server log, beside the per-request
decode rate; after the workload, one decode step profiled at batches 8/16/32/64 (wall step time from the log,
GPU forward time from SGLang's device timer, the scheduler's CPU time); the mepic server's per-batch calls
watched for host syncs (MEPIC_SYNC_DEBUG=warn; judged: none).
Everything lands in --out: results.json, table.md, the server logs (logs.tar.gz). The two parts' results
are put together here, after the calls (the checks compare systems across them; the weights' checksum
says whether both calls wrote the same model):

    .venv/bin/python -m eval.gpu.e2e.drive --merge PART1_DIR PART2_DIR --out eval/results/gpu-e2e
"""

import argparse
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests
from tqdm import tqdm

import eval.experiments.run as eval_run
from eval.experiments.run import USED_TOKENS, Sampler, flush, mepic_stats, pct, run_point
from sglang_mepic.launch.sglang_flags import MEPIC_PAGE_SIZE
from sglang_mepic.process.server_process import ServerError, ServerProcess

ROOT = Path(__file__).resolve().parents[3]
# Llama-3-8B's shape; the vocabulary is the tokenizer's (SmolLM2's), so the embedding and head are smaller.
SHAPES = {
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, head_dim=128, max_position_embeddings=8192, rope_theta=500000.0,
                      rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 8192, "rope_type": "llama3"}),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, max_position_embeddings=8192, rope_theta=10000.0),
}
WEIGHT_STD = 0.02  # what Llama initialises with: logits spread by ~std * sqrt(hidden), not a flat distribution
SEED = 49
TOP = 20  # logprobs compared per check prompt
# bf16 tolerance of the checks (stated in README.md): of two systems' top-20 first tokens, at least
# MIN_OVERLAP in common, and on those the logprobs within MAX_DIFF nats.
MIN_OVERLAP = {"bfloat16": 18, "float32": 20}
MAX_DIFF = {"bfloat16": 0.15, "float32": 1e-3}
# The systems, as eval.experiments.run names them; vanilla is SGLang's own triton backend and radix cache.
GPU_VANILLA = ["--attention-backend", "triton", "--radix-cache-backend", "sglang"]
CPU_VANILLA = ["--attention-backend", "torch_native", "--radix-cache-backend", "sglang"]
SYSTEMS = {"vanilla": None, "full": ["--mepic-mode", "full"], "epic-16": ["--mepic-mode", "epic-16"],
           # EPIC as on LMCache's CPU backend: its chunks in pinned host memory, each request's copy loaded
           # from there across PCIe (docs/modes.md); the private-copy baseline to read first (issue 86).
           "epic-16-host": ["--mepic-mode", "epic-16", "--mepic-chunk-store", "host"],
           "mepic": ["--mepic-mode", "mepic"],
           "recompute-all": ["--mepic-mode", "mepic", "--mepic-recompute-blocks", "all"],
           # mepic runs under SGLang's breakable prefill CUDA graphs (the launcher no longer turns them off,
           # issue 69); mepic-eager is mepic without them, on a server of its own (part 3).
           "mepic-eager": ["--mepic-mode", "mepic", "--cuda-graph-backend-prefill", "disabled"]}
CHECK_ONLY = {"recompute-all"}  # served for the checks, not the workload
HOST_TIER_GB = {"epic-16": 4, "epic-16-host": 4, "mepic": 4, "recompute-all": 4, "mepic-eager": 4}  # pinned host memory, as eval.experiments.run gives PIC systems
# The dry run gives no host tier, except where the system is its store (the launcher refuses one without it).
CPU_HOST_TIER_GB = {"epic-16-host": 1}
GREEDY_SYSTEMS = {"mepic"}  # the graphs-vs-eager check: mepic under prefill graphs, switched eager on its server
# Timing ratios only hold within one call (one machine): vanilla and mepic share the first. The checks
# compare across calls, on the same weights (their checksum says so).
PARTS = {1: ["vanilla", "mepic"], 2: ["full", "epic-16", "recompute-all"], 3: ["mepic", "mepic-eager"],
         4: ["vanilla", "mepic"]}
# Part 4 (issue 69) is one device call of about 9 minutes (timeout_s 590; the install takes ~26 s of it): 150
# requests a rate, not 300, leave room for the sync check (~45 s, Triton compiling), the graphs-vs-eager check
# and the decode profile beside vanilla's and mepic's starts (110-131 s, and ~125 s for mepic now that it
# captures prefill graphs, 30 s of vanilla's start). An option given on the command line wins.
PART_DEFAULTS = {4: {"requests": 150, "budget": 540, "sync_check": True, "decode_profile": "8,16,32,64"}}
# Checks that compare two systems' first-token distributions: (system, reference, judged). Unjudged
# pairs are reported: mepic and epic-16 reuse chunk KV computed elsewhere and approximate `full` by
# design (what their accuracy costs is measured by F1 on real models, not on random weights).
PAIRS = [("vanilla", "full", True), ("recompute-all", "full", True), ("mepic", "full", False),
         ("epic-16", "full", False), ("mepic", "mepic-eager", False)]
# SGLANG_FORCE_FUSED_OP_BACKEND unless --jit: a value of sglang.kernels.spec.KernelBackend ("torch": each
# BaseFusedOp's forward_native; SGLang refuses any other word at the first fused op, so no request is served).
FUSED_OP_BACKEND = "torch"
GRAPH_PASSES = re.compile(r'^sglang:cuda_graph_passes_total\{[^}]*mode="(\w+)"[^}]*\} ([0-9.e+]+)$', re.M)
# The timestamps SGLang puts in a finished request's meta_info (with --enable-metrics, which the launcher sets)
# that the TTFT parts need, kept beside what eval.experiments.run keeps.
TIME_META = ("request_received_ts", "api_server_dispatch_finish_ts", "first_token_latency", "queue_time",
             "forward_entry_time", "prefill_finished_time")


def keep_time_meta() -> None:
    """eval.experiments.run keeps the TIME_META fields too, in the process that drives a run (main): done at import,
    it changed eval.experiments.run for every other user of that process (the test suite's)."""
    eval_run.META = tuple(dict.fromkeys((*eval_run.META, *TIME_META)))


GREEDY_NEW_TOKENS = 16  # tokens each request of the graphs-vs-eager check decodes, greedily


def log(msg: str) -> None:
    print(f"[e2e {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------- the model

def llama_tensors(cfg: dict):
    """(name, shape) of every weight of a LlamaForCausalLM with this config, layer by layer."""
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    yield "model.embed_tokens.weight", (v, h)
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        yield p + "input_layernorm.weight", (h,)
        yield p + "self_attn.q_proj.weight", (q, h)
        yield p + "self_attn.k_proj.weight", (kv, h)
        yield p + "self_attn.v_proj.weight", (kv, h)
        yield p + "self_attn.o_proj.weight", (h, q)
        yield p + "post_attention_layernorm.weight", (h,)
        yield p + "mlp.gate_proj.weight", (i, h)
        yield p + "mlp.up_proj.weight", (i, h)
        yield p + "mlp.down_proj.weight", (h, i)
    yield "model.norm.weight", (h,)
    yield "lm_head.weight", (v, h)


def write_model(out: Path, tokenizer_dir: Path, shape: str, dtype: str, device: str) -> dict:
    """A random-weight Llama of `shape` with the carried tokenizer; the same bytes on every call."""
    import torch
    from safetensors.torch import save_file

    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    for f in tokenizer_dir.iterdir():
        if f.is_file() and f.name != "config.json":
            shutil.copy(f, out / f.name)
    tok = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    vocab = max(len(tok["model"]["vocab"]) + len(tok.get("added_tokens", [])),
                1 + max([t["id"] for t in tok.get("added_tokens", [])] + list(tok["model"]["vocab"].values())))
    tcfg = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    ids = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
           "rms_norm_eps": 1e-5, "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
           "torch_dtype": dtype, "vocab_size": vocab, **SHAPES[shape],
           "bos_token_id": ids.get(tcfg.get("bos_token"), 0), "eos_token_id": ids.get(tcfg.get("eos_token"), 0)}
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    torch_dtype = getattr(torch, dtype)
    gen = torch.Generator(device=device).manual_seed(SEED)
    shard, shards, index, params = {}, 0, {}, 0
    first_q = head = None

    def flush():
        nonlocal shard, shards
        if shard:
            name = f"model-{shards:05d}.safetensors"
            save_file(shard, str(out / name), metadata={"format": "pt"})
            index.update({k: name for k in shard})
            shard, shards = {}, shards + 1

    for name, dims in llama_tensors(cfg):
        if name.endswith("norm.weight"):
            t = torch.ones(dims, dtype=torch_dtype)
        else:
            t = (torch.randn(dims, generator=gen, device=device, dtype=torch.float32) * WEIGHT_STD).to(torch_dtype).cpu()
        shard[name] = t
        params += t.numel()
        if name == "model.layers.0.self_attn.q_proj.weight":
            first_q = t
        elif name == "lm_head.weight":
            head = t
        if name.endswith("mlp.down_proj.weight") and int(name.split(".")[2]) % 4 == 3:
            flush()
    flush()
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
    checksum = sum(float(shard_t.double().sum()) for shard_t in (first_q, head))
    info = {"shape": shape, "params": params, "checksum": round(checksum, 6), "dtype": dtype, "vocab_size": vocab, "std": WEIGHT_STD, "seed": SEED,
            "path": str(out), "seconds": round(time.perf_counter() - started, 1),
            "gib": round(sum(f.stat().st_size for f in out.glob("*.safetensors")) / 2**30, 2)}
    log(f"model written: {params / 1e9:.2f} B parameters, {info['gib']} GiB {dtype} in {info['seconds']} s -> {out}")
    return info


def model_dir(cpu: bool) -> Path:
    """Memory-backed where there is room (loading 15 GiB three or more times a call)."""
    shm = Path("/dev/shm")
    if not cpu and shm.is_dir() and shutil.disk_usage(shm).free > 40 * 2**30:
        return shm / "mepic-e2e-model"
    return Path("/tmp/mepic-e2e-model")


# ---------------------------------------------------------------- talking to a server

def first_token_top(url: str, text: str) -> list[tuple[int, float]]:
    """The first output token's top-20 (token id, logprob), greedy."""
    r = requests.post(url + "/generate", timeout=300, json={
        "text": text, "sampling_params": {"max_new_tokens": 1, "temperature": 0},
        "return_logprob": True, "top_logprobs_num": TOP, "logprob_start_len": -1})
    r.raise_for_status()
    top = r.json()["meta_info"]["output_top_logprobs"][0]
    return [(int(t[1]), float(t[0])) for t in top]


def compare(a: list, b: list) -> dict:
    """Two top-20 lists: tokens in common and the largest logprob difference on them."""
    da, db = dict(a), dict(b)
    common = set(da) & set(db)
    return {"overlap": len(common), "max_diff": max((abs(da[t] - db[t]) for t in common), default=math.inf),
            "same_top1": a[0][0] == b[0][0]}


def judged(diffs: list[dict], dtype: str) -> dict:
    worst_overlap = min(d["overlap"] for d in diffs)
    worst_diff = max(d["max_diff"] for d in diffs)
    return {"prompts": len(diffs), "min_overlap": worst_overlap, "max_diff": round(worst_diff, 5),
            "top1_agree": sum(d["same_top1"] for d in diffs),
            "ok": worst_overlap >= MIN_OVERLAP[dtype] and worst_diff <= MAX_DIFF[dtype]}


def metrics(url: str) -> str:
    return requests.get(url + "/metrics", timeout=30).text


def graph_passes(url: str) -> dict:
    out = {}
    for mode, n in GRAPH_PASSES.findall(metrics(url)):
        out[mode] = out.get(mode, 0) + int(float(n))
    return out


def used_pages(server, mepic: bool) -> float:
    if mepic:
        return mepic_stats(server).get("kv_pages_in_use", 0)
    m = USED_TOKENS.search(metrics(server.url))
    return float(m.group(1)) / MEPIC_PAGE_SIZE if m else float("nan")


def abort_and_flush(server, mepic: bool) -> dict:
    """Drop a stream after its first token, flush once idle, serve once more: the pages return to zero."""
    url = server.url
    with requests.post(url + "/generate", stream=True, timeout=300, json={
            "text": "Count slowly from one to one thousand: one, two,", "stream": True,
            "sampling_params": {"max_new_tokens": 512, "temperature": 0, "ignore_eos": True}}) as r:
        for line in r.iter_lines():
            if line.startswith(b"data:"):
                break  # closing the response drops the connection mid-stream
    try:
        flush(url)
        flushed = True
    except RuntimeError:
        flushed = False
    time.sleep(1.0)
    pages = used_pages(server, mepic)
    after = requests.post(url + "/generate", timeout=300, json={
        "text": "One more request after the abort.", "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
    return {"flushed": flushed, "pages_after_flush": pages, "serves_after": after.status_code == 200,
            "ok": flushed and pages == 0 and after.status_code == 200}


# ---------------------------------------------------------------- where the time goes (issue 69)

PROM_LINE = re.compile(r'^(sglang:\w+)(?:\{([^}]*)\})? ([-+0-9.eEnaif]+)$', re.M)
PROM_LABEL = re.compile(r'(\w+)="([^"]*)"')
# The counters the profiles read; a series is told apart by these labels only (model name, ranks: summed).
COUNTERS = ("sglang:forward_execution_seconds_total", "sglang:cuda_graph_passes_total",
            "sglang:scheduler_stage_seconds_total", "sglang:scheduler_process_cpu_seconds_total",
            "sglang:scheduler_idle_seconds_total")
KEYED_LABELS = ("category", "mode")


def counters(text: str) -> dict:
    """The profiles' counters from a /metrics page: {"name{label=value}": total}. forward_execution_seconds (GPU
    time of the forward passes, CUDA events: SGLANG_ENABLE_METRICS_DEVICE_TIMER=1) by category, graph passes by
    mode, the scheduler loop's wall time by stage (its forward-overlap label summed), its process CPU time."""
    out: dict = {}
    for name, labels, value in PROM_LINE.findall(text):
        if name not in COUNTERS:
            continue
        keep = ",".join(f"{k}={v}" for k, v in PROM_LABEL.findall(labels or "") if k in KEYED_LABELS)
        key = f"{name}{{{keep}}}" if keep else name
        out[key] = out.get(key, 0.0) + float(value)
    return out


def delta(after: dict, before: dict) -> dict:
    return {k: round(v - before.get(k, 0.0), 6) for k, v in after.items() if abs(v - before.get(k, 0.0)) > 1e-9}


def passes(d: dict, phase: str) -> float:
    """Forward passes of a phase ("decode", "prefill") in a counter delta, with and without a graph."""
    return sum(d.get(f"sglang:cuda_graph_passes_total{{mode={phase}_{m}}}", 0.0) for m in ("cuda_graph", "none"))


def gpu_seconds(d: dict, category: str):
    """GPU seconds of the forward passes of a category ("decode", "extend"); None without the device timer."""
    return d.get(f"sglang:forward_execution_seconds_total{{category={category}}}")


def stage_seconds(d: dict) -> dict:
    out: dict = {}
    for key, v in d.items():
        m = re.match(r"sglang:scheduler_stage_seconds_total\{category=(\w+)", key)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + v
    return out


def pass_costs(d: dict) -> dict:
    """Per forward pass of a delta: the GPU forward time of a decode and of a prefill pass, the scheduler's
    CPU time and its loop's wall time by stage (idle left out), in ms."""
    dec, pre = passes(d, "decode"), passes(d, "prefill")
    every = dec + pre
    gd, gp = gpu_seconds(d, "decode"), gpu_seconds(d, "extend")
    cpu = d.get("sglang:scheduler_process_cpu_seconds_total")
    ms = lambda x, n: round(1e3 * x / n, 3) if x is not None and n else None  # noqa: E731
    return {"decode_passes": dec, "prefill_passes": pre,
            "prefill_graph_passes": d.get("sglang:cuda_graph_passes_total{mode=prefill_cuda_graph}", 0.0),
            "gpu_forward_ms_per_decode_pass": ms(gd, dec), "gpu_forward_ms_per_prefill_pass": ms(gp, pre),
            "scheduler_cpu_ms_per_pass": ms(cpu, every),
            "scheduler_stage_ms_per_pass": {k: ms(v, every) for k, v in sorted(stage_seconds(d).items())
                                            if k != "idle" and every}}


DECODE_LINE = re.compile(r"Decode batch.*?#running-req: (\d+),.*?gen throughput \(token/s\): ([0-9.]+)")
PREFILL_LINE = re.compile(r"Prefill batch")


def decode_only_steps(log_text: str) -> list[tuple[int, float]]:
    """(batch, seconds a step) of each decode-only interval of a server log.

    SGLang logs a `Decode batch` line every --decode-log-interval decode steps, with the interval's generated
    tokens over its seconds. An interval is decode-only when the batch line before it was a `Decode batch` too
    (no `Prefill batch` logged between: no prefill ran in it) with the same #running-req (no request joined or
    left, so each step decoded that batch): its step time is batch / throughput. What a request waits while
    others prefill is left out, which the per-request decode rate (`decode_tok_s_p50`) keeps."""
    steps, previous = [], None
    for line in log_text.splitlines():
        if PREFILL_LINE.search(line):
            previous = None
            continue
        m = DECODE_LINE.search(line)
        if not m:
            continue
        batch, throughput = int(m.group(1)), float(m.group(2))
        if previous == batch and throughput > 0:
            steps.append((batch, batch / throughput))
        previous = batch
    return steps


def step_summary(steps: list[tuple[int, float]]) -> dict:
    """The decode-only steps of a run, beside the per-request rate: the step time and the batch it ran."""
    if not steps:
        return {"decode_step_windows": 0, "decode_step_ms_p50": None, "decode_step_tok_s_p50": None}
    ms = statistics.median(s for _, s in steps) * 1e3
    return {"decode_step_windows": len(steps), "decode_step_ms_p50": round(ms, 3),
            # one request's tokens a second while only decodes run: 1 / step time
            "decode_step_tok_s_p50": round(1e3 / ms, 1),
            "decode_step_batch_p50": statistics.median(b for b, _ in steps)}


TTFT_PARTS = ("client_to_tokenizer", "tokenizer", "scheduler_intake", "queue", "prefill_forward", "return_path")


def ttft_parts(output) -> dict | None:
    """One streamed request's TTFT in parts that add up to it, from SGLang's timestamps (wall clock, one machine):
    client_to_tokenizer (HTTP in), tokenizer (tokenizing, mepic's markup, dispatch), scheduler_intake (to the
    scheduler's wait queue), queue (waiting there: running batches, the rounds' scheduling and planning),
    prefill_forward (from entering a prefill batch until its result is processed: batch preparation, the forward,
    sampling), return_path (detokenizer, tokenizer, HTTP out)."""
    meta, ttft, sent = output[2], output[3], output[5] if len(output) > 5 else None
    if ttft is None or sent is None or any(k not in meta for k in TIME_META[:2] + TIME_META[3:]):
        return None
    recv, dispatched = meta["request_received_ts"], meta["api_server_dispatch_finish_ts"]
    queue, entered, done = meta["queue_time"], meta["forward_entry_time"], meta["prefill_finished_time"]
    return {"client_to_tokenizer": recv - sent, "tokenizer": dispatched - recv,
            "scheduler_intake": entered - queue - dispatched, "queue": queue, "prefill_forward": done - entered,
            "return_path": ttft - (done - sent)}


def ttft_summary(outputs: list) -> dict:
    parts = [p for p in (ttft_parts(o) for o in outputs) if p is not None]
    if not parts:
        return {"requests": 0}
    return {"requests": len(parts), **{f"{k}_ms_p50": round(1e3 * statistics.median(p[k] for p in parts), 2)
                                       for k in TTFT_PARTS}}


def generate(url: str, text: str, new_tokens: int, top: int = 0) -> dict:
    """One greedy request (ignore_eos), not streamed; with `top`, the top logprobs of each output token."""
    body = {"text": text, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}}
    if top:
        body.update(return_logprob=True, top_logprobs_num=top, logprob_start_len=-1)
    r = requests.post(url + "/generate", timeout=300, json=body)
    r.raise_for_status()
    return r.json()


def greedy_tokens(out: dict) -> dict:
    """Output ids, and at each the margin of the top-1 logprob over the top-2 (how near a tie the choice was)."""
    tops = out["meta_info"].get("output_top_logprobs") or []
    margins = [round(t[0][0] - t[1][0], 4) if t and len(t) > 1 else None for t in tops]
    return {"tokens": list(out["output_ids"]), "margins": margins}


def compare_greedy(graphs: list[dict], eager: list[dict]) -> dict:
    """The same prompts' greedy tokens under prefill graphs and eagerly: identical, or where they part and how
    near a tie the eager choice was there."""
    parted = []
    for i, (g, e) in enumerate(zip(graphs, eager)):
        if g["tokens"] != e["tokens"]:
            at = next((k for k, (a, b) in enumerate(zip(g["tokens"], e["tokens"])) if a != b),
                      min(len(g["tokens"]), len(e["tokens"])))
            margin = e["margins"][at] if at < len(e["margins"]) else None
            parted.append({"prompt": i, "at_token": at, "eager_top2_margin": margin})
    return {"prompts": len(graphs), "identical": len(graphs) - len(parted), "parted": parted,
            "ok": not parted and len(graphs) == len(eager) and bool(graphs)}


def greedy_graphs_vs_eager(server, texts: list[str], new_tokens: int, switch: Path, cpu: bool) -> dict:
    """The same requests, one at a time on a flushed cache, with prefill graphs and then with the backend's
    eager switch on (MEPIC_PREFILL_GRAPHS_OFF_FILE): one server, one weights load, one sequence of cache states.
    Judged: identical greedy tokens, prefill graph passes in the first run and none in the second (on CPU, with
    no graphs, not judged)."""
    runs, used = {}, {}
    try:
        for label in ("graphs", "eager"):
            if label == "eager":
                switch.touch()
            else:
                switch.unlink(missing_ok=True)
            flush(server.url)
            before = graph_passes(server.url)
            runs[label] = [greedy_tokens(generate(server.url, t, new_tokens, top=2)) for t in texts]
            after = graph_passes(server.url)
            used[label] = {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}
    finally:
        switch.unlink(missing_ok=True)
    result = compare_greedy(runs["graphs"], runs["eager"])
    tokens_ok = result["ok"]
    graphs_ran = used["graphs"].get("prefill_cuda_graph", 0) > 0
    eager_ran = used["eager"].get("prefill_cuda_graph", 0) == 0 and used["eager"].get("prefill_none", 0) > 0
    result.update(passes=used, graphs_ran=graphs_ran, eager_ran=eager_ran, judged=not cpu,
                  ok=tokens_ok and (cpu or (graphs_ran and eager_ran)), new_tokens=new_tokens)
    return result


def settle(url: str) -> None:
    """Before a run's counters and log are read: one tiny request, whose forward makes SGLang's device timer
    report the passes before it that have completed (it polls its CUDA events at the next forward, never
    waiting), and a moment for the log's last lines. Its own prefill pass is counted as a prefill."""
    generate(url, "settle", 1)
    time.sleep(0.5)


def decode_profile(server, texts: list[str], sizes: list[int], new_tokens: int) -> list[dict]:
    """One decode step at each batch size: that many requests at once (ignore_eos, `new_tokens` each), then
    the decode-only intervals of that batch in the log (wall time a step), and over the run the GPU forward time
    a decode pass (SGLang's device timer: kernel time) and the scheduler's CPU and stage time a pass (host)."""
    rows = []
    for batch in sizes:
        if batch > len(texts):
            break
        log_from, before = len(server.log()), counters(metrics(server.url))
        started = time.perf_counter()
        with ThreadPoolExecutor(batch) as pool:
            list(pool.map(lambda t: generate(server.url, t, new_tokens), texts[:batch]))
        seconds = time.perf_counter() - started
        settle(server.url)
        d = delta(counters(metrics(server.url)), before)
        steps = [s for b, s in decode_only_steps(server.log()[log_from:]) if b == batch]
        row = {"batch": batch, "seconds": round(seconds, 2), "windows": len(steps),
               "decode_step_ms_p50": round(statistics.median(steps) * 1e3, 3) if steps else None, **pass_costs(d)}
        gpu = row["gpu_forward_ms_per_decode_pass"]
        # The step's wall time not spent in the decode forward on the GPU: sampling, and the GPU waiting on the host.
        row["step_minus_gpu_forward_ms"] = (round(row["decode_step_ms_p50"] - gpu, 3)
                                            if gpu is not None and row["decode_step_ms_p50"] is not None else None)
        rows.append(row)
        log(f"decode profile @ batch {batch}: {json.dumps(row)}")
    return rows


SYNC_FOUND = re.compile(r"mepic sync debug: (\S+) synchronised \((\d+) so far\): (.*)")


def sync_probe_verdict(log_text: str) -> dict:
    """A served mepic server's per-batch calls under MEPIC_SYNC_DEBUG=warn (sglang_mepic/attention/sync_probe.py):
    judged when the probe was on, ok when no call synchronised."""
    on = "mepic sync debug: on" in log_text
    found = [{"call": m.group(1), "count": int(m.group(2)), "at": m.group(3)[:300]} for m in SYNC_FOUND.finditer(log_text)]
    watched = [int(x) for x in re.findall(r"mepic sync debug: (\d+) calls watched", log_text)]
    return {"on": on, "watched_calls": max(watched, default=None), "synchronised": found, "judged": on,
            "ok": on and not found}


def run_sync_check(args, out: Path) -> dict:
    """eval/gpu/e2e/sync_check.py in a process of its own (it sets torch.cuda's sync debug mode)."""
    started = time.perf_counter()
    cmd = [sys.executable, "-m", "eval.gpu.e2e.sync_check", "--out", str(out / "sync_check.json")]
    if args.cpu:
        cmd.append("--cpu")
    env = {**os.environ, **({"TRITON_INTERPRET": "1"} if args.cpu else {})}
    try:
        run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.sync_check_timeout)
        text = run.stdout + run.stderr[-3000:]
    except subprocess.TimeoutExpired as e:
        text, run = f"timed out after {e.timeout} s", None
    log("sync check:\n" + "\n".join(line for line in text.splitlines() if line.startswith("sync check")))
    path = out / "sync_check.json"
    verdict = json.loads(path.read_text()) if path.is_file() else {"ok": False, "error": text[-2000:]}
    verdict.update(judged=not args.cpu, wall_s=round(time.perf_counter() - started, 1))
    return verdict


# ---------------------------------------------------------------- one system

def summary(outputs: list, sampler: Sampler, exact_peak, seconds: float, new_tokens: int) -> dict:
    ttft = [o[3] for o in outputs if o[3] is not None]
    e2e = [o[4] for o in outputs]
    tokens = sum(o[2].get("completion_tokens", 0) for o in outputs)
    decode = [(o[4] - o[3]) / max(1, o[2].get("completion_tokens", 1) - 1) for o in outputs if o[3] is not None]
    pages = sampler.pages
    return {"requests": len(outputs), "seconds": round(seconds, 2), "req_s": round(len(outputs) / seconds, 3),
            "ttft_p50": round(statistics.median(ttft), 4), "ttft_p99": round(pct(ttft, 0.99), 4),
            "e2e_p50": round(statistics.median(e2e), 4), "e2e_p99": round(pct(e2e, 0.99), 4),
            "output_tok_s": round(tokens / seconds, 1), "tpot_p50": round(statistics.median(decode), 5),
            # A request's own decode rate, first token to last (waits while others prefill included): at an
            # open-loop rate below saturation output_tok_s is the offered load for every system, so the decode
            # target reads this. The decode-only step time from the log stands beside it (decode_step_*).
            "decode_tok_s_p50": round(1 / statistics.median(decode), 1) if statistics.median(decode) > 0 else None,
            "peak_kv_pages": exact_peak if exact_peak is not None else (max(pages) if pages else None),
            "sampled_peak_kv_pages": max(pages) if pages else None,
            "mean_kv_pages": round(statistics.fmean(pages), 1) if pages else None,
            "computed_tokens_p50": statistics.median(o[2].get("mepic_recomputed_tokens", o[2].get("prompt_tokens", 0)
                                                              - o[2].get("cached_tokens", 0)) for o in outputs)}


class LogCopier(threading.Thread):
    """Copies a server's log into --out every few seconds, and once more at stop()."""

    def __init__(self, server: ServerProcess, dest: Path, period: float = 5.0):
        super().__init__(daemon=True)
        self.server, self.dest, self.period, self.done = server, dest, period, threading.Event()

    def copy(self) -> None:
        if self.server.log_path and self.server.log_path.exists():
            shutil.copy(self.server.log_path, self.dest)

    def run(self) -> None:
        while not self.done.wait(self.period):
            self.copy()

    def stop(self) -> None:
        self.done.set()
        self.copy()


def needed_seconds(name: str, args) -> float:
    """What one system needs of the budget: its start, the workload at each rate, the checks, and where asked
    the decode profile (about 4 s a batch size, warm) and the graphs-vs-eager check (two passes of
    one-at-a-time requests, about 0.3 s each, and two flushes)."""
    # Measured on the H200 (2026-11-27): a rate's 300 requests ran for requests/rate + 1-2 s, the checks,
    # abort, flush and stop took about 10 s; the start is --startup-estimate (vanilla 131 s, mepic 78-103 s).
    work = 0.0 if name in CHECK_ONLY else sum(args.requests / r + 5 for r in args.rates)
    if name not in CHECK_ONLY:
        work += 4.0 * len(getattr(args, "decode_profile", None) or [])
    if greedy_prompts(name, args):
        work += 2 * 0.3 * greedy_prompts(name, args) + 6
    return args.startup_estimate + work + 15


def greedy_prompts(name: str, args) -> int:
    """How many requests the graphs-vs-eager check sends (0: not for this system)."""
    return (getattr(args, "greedy", 0) or 0) if name in GREEDY_SYSTEMS else 0


def gpu_flags(args) -> list[str]:
    """The flags only the GPU run adds (tests/tooling/test_gpu_e2e_drive.py parses them with SGLang's own parser)."""
    return ["--cuda-graph-max-bs-decode", str(args.graph_max_bs), "--mem-fraction-static", "0.85"]


def server_args(name: str, args, pool_pages: int, context_length: int = 8192) -> tuple[list[str], list[str], dict]:
    """One system's server as every device run starts it: (its system's flags, the flags all share, env)."""
    mepic = name != "vanilla"
    flags = (CPU_VANILLA if args.cpu else GPU_VANILLA) if name == "vanilla" else list(SYSTEMS[name])
    tier_gb = (CPU_HOST_TIER_GB if args.cpu else HOST_TIER_GB).get(name)
    if tier_gb:
        flags += ["--mepic-host-tier-gb", str(tier_gb)]
    common = ["--dtype", args.dtype, "--max-total-tokens", str(pool_pages * MEPIC_PAGE_SIZE),
              "--decode-log-interval", "8", "--sampling-backend", "pytorch", "--context-length", str(context_length)]
    if not args.cpu:
        common += gpu_flags(args)
    env = {"SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}
    if not args.jit:
        # SGLang 0.5.23 sends RMSNorm, SiLU-and-mul, rotary and clamp_position to kernels it compiles on
        # first use (nvcc and tvm_ffi, per fresh machine); their torch forms run instead, the same for
        # every system. --jit tries SGLang's compiled kernels.
        env["SGLANG_FORCE_FUSED_OP_BACKEND"] = FUSED_OP_BACKEND
    if not args.cpu:
        # On the H200 (2026-11-27, torch 2.11 there, the wheel built against a later one) SGLang's Rust
        # TreeCore refused vanilla's first insert ("insert value must be an int64 tensor, got Float", the
        # tensor being int64) and the scheduler died. Its Python TreeCore, the same tree, serves; every
        # system gets the same setting. The CPU dry run keeps the Rust one, which works with the venv's torch.
        env["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] = "python"
        # The forward passes' GPU time (CUDA events, read without a sync) for the decode profile and the
        # TTFT parts: sglang:forward_execution_seconds_total. Every system gets it.
        env["SGLANG_ENABLE_METRICS_DEVICE_TIMER"] = "1"
        if mepic and args.sync_debug:
            env["MEPIC_SYNC_DEBUG"] = args.sync_debug  # the backend's per-batch calls watched (sync_probe.py)
    return flags, common, env


def serve_system(name: str, args, model: Path, work: dict, out: Path) -> dict:
    mepic = name != "vanilla"
    flags, common, env = server_args(name, args, args.pool_pages)
    switch = out / f"eager-switch-{name}"
    if greedy_prompts(name, args):
        env["MEPIC_PREFILL_GRAPHS_OFF_FILE"] = str(switch)
    record: dict = {"system": name, "flags": flags + common, "env": env, "device": args.call_id}
    started = time.perf_counter()
    log(f"{name}: starting ({' '.join(flags + common)})")
    server = ServerProcess(model, *flags, *common, startup_timeout=args.startup_timeout, env=env)
    copier = LogCopier(server, out / f"server-{name}.log")  # a call killed at its limit still brings the log back
    try:
        server.launch()
        copier.start()
        server.wait_ready()
        record["startup_s"] = round(time.perf_counter() - started, 1)
        info = requests.get(server.url + "/server_info", timeout=60).json()
        record["server"] = {k: info.get(k) for k in ("attention_backend", "radix_cache_backend", "page_size",
                                                     "max_total_num_tokens", "cuda_graph_max_bs_decode", "dtype",
                                                     "disable_cuda_graph", "version")}
        log(f"{name}: up in {record['startup_s']} s; {record['server']}")
        texts, checks = work["texts"], work["checks"][:args.checks]
        record["checks_cold"] = [first_token_top(server.url, texts[i]) for i in checks]
        if greedy_prompts(name, args):
            # The check prompts and the requests before them (whose documents they repeat), one at a time.
            count = min(len(texts), greedy_prompts(name, args))
            record["greedy_graphs_vs_eager"] = g = greedy_graphs_vs_eager(
                server, texts[:count], args.greedy_new_tokens, switch, args.cpu)
            log(f"{name}: greedy, prefill graphs vs eager: {g['identical']}/{g['prompts']} identical, "
                f"passes {g['passes']}; ok {g['ok']}" + (f"; parted {g['parted']}" if g["parted"] else ""))
        if name not in CHECK_ONLY:
            record["points"] = []
            for rate in args.rates:
                batch = texts[:args.requests]
                log_from, before = len(server.log()), counters(metrics(server.url))
                with tqdm(total=len(batch), desc=f"{name} @ {rate:g} req/s", unit="req", mininterval=5) as bar:
                    outputs, sampler, exact, seconds, mepic_counters = run_point(
                        server, MEPIC_PAGE_SIZE, args.pool_pages, batch, rate, args.new_tokens, 0, bar,
                        ignore_eos=True)  # every system decodes the same number of tokens
                settle(server.url)
                point = {"rate": rate, **summary(outputs, sampler, exact, seconds, args.new_tokens),
                         **step_summary(decode_only_steps(server.log()[log_from:])),
                         "ttft_parts": ttft_summary(outputs),
                         "passes": pass_costs(delta(counters(metrics(server.url)), before)),
                         "counters": mepic_counters}
                record["points"].append(point)
                log(f"{name} @ {rate:g}: {json.dumps({k: v for k, v in point.items() if k != 'counters'})}")
            if args.decode_profile:
                record["decode_profile"] = decode_profile(server, texts, args.decode_profile,
                                                          args.profile_new_tokens)
        record["checks_warm"] = [first_token_top(server.url, texts[i]) for i in checks]
        record["warm_vs_cold"] = judged([compare(w, c) for w, c in zip(record["checks_warm"], record["checks_cold"])],
                                        args.dtype)
        record["abort_flush"] = abort_and_flush(server, mepic)
        record["graph_passes"] = graph_passes(server.url)
        if env.get("MEPIC_SYNC_DEBUG"):
            record["sync_probe"] = sync_probe_verdict(server.log())
            log(f"{name}: host syncs in the backend's per-batch calls (served): {record['sync_probe']}")
        log(f"{name}: warm vs cold {record['warm_vs_cold']}; abort/flush {record['abort_flush']}; "
            f"graph passes {record['graph_passes']}")
    except (ServerError, requests.RequestException, KeyError, ValueError) as e:
        record["error"] = f"{type(e).__name__}: {e}"[-4000:]
        log(f"{name}: FAILED {record['error'][-1500:]}")
    finally:
        server.stop()
        copier.stop()
    record["wall_s"] = round(time.perf_counter() - started, 1)
    return record


# ---------------------------------------------------------------- report

def pairs(systems: dict, dtype: str) -> dict:
    """The cross-system checks, cold (before the workload) and warm (after it: reused chunks are read),
    and the control, which must fail for every pair of different prompts or the check could not fail."""
    out = {}
    for a, b, judged_ in PAIRS:
        for when in ("cold", "warm"):
            key = f"checks_{when}"
            if key in systems.get(a, {}) and key in systems.get(b, {}):
                c = judged([compare(x, y) for x, y in zip(systems[a][key], systems[b][key])], dtype)
                out[f"{a} vs {b}, {when}"] = {**c, "judged": judged_}
    ref = next((s for s in ("full", "mepic", "vanilla") if "checks_cold" in systems.get(s, {})), None)
    if ref and len(systems[ref]["checks_cold"]) > 1:
        c = systems[ref]["checks_cold"]
        each = [judged([compare(c[k], c[(k + 1) % len(c)])], dtype) for k in range(len(c))]
        out[f"control: {ref}, each prompt vs the next"] = {
            "prompts": len(c), "min_overlap": min(x["min_overlap"] for x in each),
            "max_diff": min(x["max_diff"] for x in each), "top1_agree": sum(x["top1_agree"] for x in each),
            "ok": not any(x["ok"] for x in each), "judged": True}
    return out


def prefill_only(passes: dict | None) -> dict:
    return {k: v for k, v in (passes or {}).items() if k.startswith("prefill")}


def other_checks(results: dict) -> dict:
    """The judged checks that are not distribution pairs: graphs vs eager greedy tokens (per system), no host
    sync in a served mepic server's per-batch calls (per system), and the device sync check (per call)."""
    out = {}
    for name, s in results.get("systems", {}).items():
        if "greedy_graphs_vs_eager" in s:
            g = s["greedy_graphs_vs_eager"]
            out[f"{name}: greedy tokens, prefill graphs vs eager"] = {
                "ok": g["ok"], "judged": g["judged"],
                "detail": f"{g['identical']}/{g['prompts']} identical ({g['new_tokens']} tokens each); prefill passes "
                          f"with graphs {prefill_only(g['passes'].get('graphs'))}, eager "
                          f"{prefill_only(g['passes'].get('eager'))}"
                          + (f"; parted {g['parted']}" if g["parted"] else "")}
        if "sync_probe" in s:
            v = s["sync_probe"]
            out[f"{name}: no host sync in the backend's per-batch calls (served)"] = {
                "ok": v["ok"], "judged": v["judged"],
                "detail": f"probe on: {v['on']}; calls watched: {v['watched_calls']}; synchronised: "
                          + ("; ".join(f"{f['call']} at {f['at']}" for f in v["synchronised"]) or "none")}
    if "sync_check" in results:
        v = results["sync_check"]
        out["sync check: per-batch calls on the device, sync debug mode error"] = {
            "ok": v.get("ok", False), "judged": v.get("judged", True),
            "detail": (f"{sum(c['ok'] for c in v.get('calls', []))}/{len(v.get('calls', []))} calls without a sync"
                       + (f"; synchronised: {v['synchronised']}" if v.get("synchronised") else "")
                       if "calls" in v else v.get("error", "")[-300:])}
    return out


TIMED = ("ttft_p50", "decode_tok_s_p50", "output_tok_s", "decode_step_ms_p50", "decode_step_tok_s_p50")
# ratios that need both systems on one machine


def ratios(systems: dict) -> dict:
    out = {}
    for metric, a, b in (("ttft_p50", "mepic", "vanilla"), ("decode_tok_s_p50", "mepic", "vanilla"),
                         ("decode_step_ms_p50", "mepic", "vanilla"), ("decode_step_tok_s_p50", "mepic", "vanilla"),
                         ("peak_kv_pages", "mepic", "epic-16"), ("mean_kv_pages", "mepic", "epic-16"),
                         ("ttft_p50", "mepic", "mepic-eager")):
        if metric in TIMED and systems.get(a, {}).get("device") != systems.get(b, {}).get("device"):
            continue
        pa = {p["rate"]: p for p in systems.get(a, {}).get("points", [])}
        pb = {p["rate"]: p for p in systems.get(b, {}).get("points", [])}
        for rate in sorted(set(pa) & set(pb)):
            x, y = pa[rate].get(metric), pb[rate].get(metric)
            if x is not None and y:
                out[f"{metric} {a}/{b} @ {rate:g}"] = round(x / y, 3)
    # The decode profile, batch by batch (one machine only): wall step time and GPU forward time.
    a, b = systems.get("mepic", {}), systems.get("vanilla", {})
    if a.get("device") == b.get("device"):
        pa = {r["batch"]: r for r in a.get("decode_profile", [])}
        pb = {r["batch"]: r for r in b.get("decode_profile", [])}
        for batch in sorted(set(pa) & set(pb)):
            for metric in ("decode_step_ms_p50", "gpu_forward_ms_per_decode_pass", "scheduler_cpu_ms_per_pass"):
                x, y = pa[batch].get(metric), pb[batch].get(metric)
                if x is not None and y:
                    out[f"{metric} mepic/vanilla @ batch {batch}"] = round(x / y, 3)
    return out


def table(results: dict) -> str:
    cols = ("rate", "req_s", "ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99", "output_tok_s", "decode_tok_s_p50",
            "decode_step_ms_p50", "decode_step_tok_s_p50", "peak_kv_pages", "mean_kv_pages", "computed_tokens_p50")
    lines = [f"# GPU end-to-end run: {results['device'].get('name', '?')}, commit {results.get('commit', '?')}", "",
             "| system | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for name, s in results["systems"].items():
        for p in s.get("points", []):
            lines.append(f"| {name} | " + " | ".join(str(p.get(c)) for c in cols) + " |")
        if "error" in s:
            lines.append(f"| {name} | FAILED: {s['error'][-200:].replace('|', '/').replace(chr(10), ' ')} |")
    lines += ["", "| check | prompts | min top-20 overlap | max logprob diff | top-1 agree | ok |", "|---|---|---|---|---|---|"]
    for name, c in results["checks"].items():
        ok = c["ok"] if c.get("judged", True) else f"{c['ok']} (reported)"
        lines.append(f"| {name} | {c['prompts']} | {c['min_overlap']} | {c['max_diff']} | {c['top1_agree']} | {ok} |")
    for name, s in results["systems"].items():
        if "warm_vs_cold" in s:
            c = s["warm_vs_cold"]
            lines.append(f"| {name}: warm vs cold | {c['prompts']} | {c['min_overlap']} | {c['max_diff']} | "
                         f"{c['top1_agree']} | {c['ok']} |")
    lines += ["", "decode_tok_s_p50: a request's own rate, first token to last (its waits while others prefill "
              "included); decode_step_*: the decode-only intervals of the server log (no prefill in them, one "
              "batch throughout), step time and 1 / step time."]
    others = results.get("other_checks") or other_checks(results)
    if others:
        lines += ["", "| check | ok | detail |", "|---|---|---|"]
        for name, c in others.items():
            ok = c["ok"] if c.get("judged", True) else f"{c['ok']} (not judged)"
            lines.append(f"| {name} | {ok} | {str(c['detail']).replace('|', '/')} |")
    parts_rows = [(name, p) for name, s in results["systems"].items() for p in s.get("points", [])
                  if p.get("ttft_parts", {}).get("requests")]
    if parts_rows:
        lines += ["", "TTFT in parts, ms (medians of each part; SGLang's timestamps) and the rate's forward passes",
                  "", "| system | rate | ttft_p50 | " + " | ".join(TTFT_PARTS) + " | GPU ms/prefill pass | "
                  "prefill passes (graph) | scheduler CPU ms/pass |", "|---|---|---|" + "---|" * (len(TTFT_PARTS) + 3)]
        for name, pt in parts_rows:
            tp, ps = pt["ttft_parts"], pt.get("passes", {})
            lines.append(f"| {name} | {pt['rate']:g} | {round(pt['ttft_p50'] * 1e3, 1)} | "
                         + " | ".join(str(tp.get(f"{k}_ms_p50")) for k in TTFT_PARTS)
                         + f" | {ps.get('gpu_forward_ms_per_prefill_pass')} | {ps.get('prefill_passes')} "
                           f"({ps.get('prefill_graph_passes')}) | {ps.get('scheduler_cpu_ms_per_pass')} |")
    profile_rows = [(name, r) for name, s in results["systems"].items() for r in s.get("decode_profile", [])]
    if profile_rows:
        lines += ["", "Decode step profile (after the workload; the batch's requests at once): wall step time of the "
                  "decode-only log intervals, GPU forward time a decode pass (SGLang's device timer: kernel time), "
                  "the rest of the step, the scheduler's CPU time a pass (host)", "",
                  "| system | batch | step ms | windows | GPU forward ms/pass | step - GPU ms | scheduler CPU ms/pass "
                  "| scheduler stages ms/pass |", "|---|---|---|---|---|---|---|---|"]
        for name, r in profile_rows:
            stages = ", ".join(f"{k} {v}" for k, v in (r.get("scheduler_stage_ms_per_pass") or {}).items() if v)
            lines.append(f"| {name} | {r['batch']} | {r['decode_step_ms_p50']} | {r['windows']} | "
                         f"{r['gpu_forward_ms_per_decode_pass']} | {r['step_minus_gpu_forward_ms']} | "
                         f"{r['scheduler_cpu_ms_per_pass']} | {stages} |")
    lines += ["", "| system | startup s | abort + flush: pages after | ok | CUDA-graph passes |", "|---|---|---|---|---|"]
    for name, s in results["systems"].items():
        af = s.get("abort_flush", {})
        lines.append(f"| {name} | {s.get('startup_s')} | {af.get('pages_after_flush')} | {af.get('ok')} | "
                     f"{s.get('graph_passes')} |")
    lines += ["", "Ratios: " + ", ".join(f"{k} = {v}" for k, v in results["ratios"].items())]
    return "\n".join(lines) + "\n"


def merge(dirs: list[Path], out: Path) -> dict:
    """Several calls' results as one: systems and calls in order, later calls winning for a system run twice."""
    parts = [json.loads((d / "results.json").read_text()) for d in dirs]
    merged = {**parts[0], "systems": {}, "calls": [], "models": [p.get("model") for p in parts],
              "devices": [p.get("device") for p in parts], "commits": [p.get("commit") for p in parts]}
    for p in parts:
        merged["systems"].update(p["systems"])
        merged["calls"] += p.get("calls", [])
    sums = {(m or {}).get("checksum") for m in merged["models"]}
    merged["same_model"] = len(sums) == 1
    dtype = (merged.get("model") or {}).get("dtype", "bfloat16")
    merged["checks"] = pairs(merged["systems"], dtype) if merged["same_model"] else {}
    merged["ratios"] = ratios(merged["systems"])
    sync = [p["sync_check"] for p in parts if "sync_check" in p]
    if sync:
        merged["sync_check"] = sync[-1]
    merged["other_checks"] = other_checks(merged)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(merged, indent=1))
    text = table(merged) + ("" if merged["same_model"] else
                            "\nThe calls wrote different weights (checksums differ): no cross-call checks.\n")
    (out / "table.md").write_text(text)
    print(text)
    return merged


def device_info(cpu: bool) -> dict:
    import torch
    import triton

    info = {"torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version()}
    try:
        import sglang
        info["sglang"] = sglang.__version__
    except ImportError:
        info["sglang"] = None
    if not cpu and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(name=p.name, sms=p.multi_processor_count, memory_gib=round(p.total_memory / 2**30, 1))
        try:
            info["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                                 "--format=csv,noheader"], capture_output=True, text=True,
                                                timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            pass
    else:
        info["name"] = "cpu (dry run)"
    return info


def resolve(args) -> None:
    """Fill in what the part and the machine decide (PART_DEFAULTS; --smoke; CPU or CUDA); given options stand."""
    part = PART_DEFAULTS.get(args.part, {}) if not args.smoke else {}
    args.requests = args.requests or part.get("requests", 300)
    args.budget = args.budget or part.get("budget", 530)
    if args.sync_check is None:
        args.sync_check = part.get("sync_check", False)
    args.rates = [float(r) for r in args.rates.split(",")] if isinstance(args.rates, str) else args.rates
    args.dtype = "float32" if args.cpu else "bfloat16"
    args.startup_estimate = args.startup_estimate or (90.0 if args.cpu else 130.0)
    args.call_id = f"{platform.node()} {time.strftime('%F %T')}"
    if args.sync_debug is None:
        args.sync_debug = "" if args.cpu else "warn"
    if args.decode_profile is None:
        args.decode_profile = "2,4" if args.smoke else part.get("decode_profile", "")
    if isinstance(args.decode_profile, str):
        args.decode_profile = [int(b) for b in args.decode_profile.split(",") if b.strip()]
    if args.smoke:
        args.requests, args.rates = min(args.requests, 16), args.rates[:1]
        args.profile_new_tokens = min(args.profile_new_tokens, 16)


def main(argv=None) -> None:
    keep_time_meta()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--carry", type=Path, default=ROOT / ".gpu_e2e")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/e2e_out")))
    ap.add_argument("--smoke", action="store_true", help="mepic alone, --requests 16 at the lower rate")
    ap.add_argument("--part", type=int, choices=sorted(PARTS), help="the systems of one device call")
    ap.add_argument("--systems", help="comma-separated, from " + ", ".join(SYSTEMS))
    ap.add_argument("--rates", default="4,12", help="arrival rates (req/s): one below vanilla's saturation, one near")
    ap.add_argument("--requests", type=int, default=None, help="requests a rate (default 300; part 4: 150)")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--checks", type=int, default=8, help="check prompts (first-token top-20 logprobs)")
    ap.add_argument("--pool-pages", type=int, default=16384, help=f"KV pool of every server, in pages of {MEPIC_PAGE_SIZE}")
    ap.add_argument("--graph-max-bs", type=int, default=128)
    ap.add_argument("--shape", choices=sorted(SHAPES), default=None, help="default: llama3-8b (tiny with --cpu)")
    ap.add_argument("--startup-timeout", type=float, default=420)
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds for this call's systems: one whose start and workload would not fit is skipped "
                         "(default 530; part 4: 540)")
    ap.add_argument("--decode-profile", default=None,
                    help="batch sizes of the decode step profile after the workload, e.g. 8,16,32,64 (part 4's; "
                         "--smoke: 2,4; otherwise none)")
    ap.add_argument("--profile-new-tokens", type=int, default=64, help="tokens each request of the profile decodes")
    ap.add_argument("--greedy", type=int, default=None,
                    help="requests of the graphs-vs-eager check on a mepic server with prefill graphs (default: the "
                         "check prompts and the requests before them; 0: none)")
    ap.add_argument("--greedy-new-tokens", type=int, default=GREEDY_NEW_TOKENS)
    ap.add_argument("--sync-check", action=argparse.BooleanOptionalAction, default=None,
                    help="before the servers, the per-batch calls under torch.cuda's sync debug mode (sync_check.py; "
                         "part 4: on)")
    ap.add_argument("--sync-check-timeout", type=float, default=120)
    ap.add_argument("--sync-debug", choices=["", "warn", "error"], default=None,
                    help="MEPIC_SYNC_DEBUG of the mepic servers (default warn on CUDA: syncs logged and judged)")
    ap.add_argument("--startup-estimate", type=float, default=None,
                    help="seconds a server start is counted as in the budget (default 150 on CUDA, 90 on CPU)")
    ap.add_argument("--cpu", action="store_true", help="the dry run without CUDA: tiny model, float32")
    ap.add_argument("--jit", action="store_true",
                    help="let SGLang compile its fused-op kernels (nvcc, tvm_ffi) instead of their torch forms")
    ap.add_argument("--merge", type=Path, nargs="+", metavar="DIR",
                    help="no servers: put the results.json of several calls together into --out")
    args = ap.parse_args(argv)
    if args.merge:
        merge(args.merge, args.out)
        return
    began = time.perf_counter()
    resolve(args)
    shape = args.shape or ("tiny" if args.cpu else "llama3-8b")
    if args.smoke:
        names = ["mepic"]
    elif args.systems:
        names = args.systems.split(",")
    else:
        names = PARTS[args.part] if args.part else [*PARTS[1], *PARTS[2], *PARTS[3][1:]]
    unknown = [n for n in names if n not in SYSTEMS]
    if unknown:
        raise SystemExit(f"unknown systems {unknown}: choose from {', '.join(SYSTEMS)}")
    work = json.loads((args.carry / "workload.json").read_text())
    if args.greedy is None:  # the check prompts and the requests before them, whose documents they repeat
        args.greedy = (3 if args.smoke else max(work["checks"][:args.checks], default=-1) + 1)
    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / "results.json"
    results = {"systems": {}, "calls": []}
    results["device"] = device_info(args.cpu)
    results["commit"] = (args.carry / "COMMIT").read_text().strip() if (args.carry / "COMMIT").is_file() else None
    log(f"device {results['device']}; systems {names}; rates {args.rates}; {args.requests} requests; "
        f"decode profile {args.decode_profile}; greedy {args.greedy}; sync check {args.sync_check}; "
        f"sync debug {args.sync_debug or 'off'}; budget {args.budget:g} s")
    if args.sync_check:  # before any server: the device is all its own
        results["sync_check"] = run_sync_check(args, args.out)
        results_path.write_text(json.dumps(results, indent=1))
    model = model_dir(args.cpu)
    results["model"] = write_model(model, args.carry / "model", shape, args.dtype, "cpu" if args.cpu else "cuda")
    call = {"argv": sys.argv[1:] if argv is None else argv, "systems": names, "started": time.strftime("%F %T")}
    for name in names:
        left, need = args.budget - (time.perf_counter() - began), needed_seconds(name, args)
        if left < need:
            log(f"{name}: skipped, {left:.0f} s of the budget left and it needs about {need:.0f}")
            results["systems"][name] = {"system": name, "error": f"skipped: {left:.0f} s left, about {need:.0f} needed"}
            continue
        results["systems"][name] = serve_system(name, args, model, work, args.out)
        results["checks"] = pairs(results["systems"], args.dtype)
        results["ratios"] = ratios(results["systems"])
        results["other_checks"] = other_checks(results)
        results_path.write_text(json.dumps(results, indent=1))  # what a timeout leaves is still there
    call["seconds"] = round(time.perf_counter() - began, 1)
    results["calls"].append(call)
    results["checks"] = pairs(results["systems"], args.dtype)
    results["ratios"] = ratios(results["systems"])
    results["other_checks"] = other_checks(results)
    results_path.write_text(json.dumps(results, indent=1))
    (args.out / "table.md").write_text(table(results))
    with tarfile.open(args.out / "logs.tar.gz", "w:gz") as tar:
        for f in sorted(args.out.glob("server-*.log")):
            tar.add(f, arcname=f.name)
            f.unlink()
    print(table(results))
    failed = [n for n in names if "error" in results["systems"][n]]
    bad = [k for k, c in results["checks"].items() if c.get("judged", True) and not c["ok"]]
    bad += [f"{n}: warm vs cold" for n in names if not results["systems"][n].get("warm_vs_cold", {}).get("ok", True)]
    bad += [k for k, c in results["other_checks"].items() if c.get("judged", True) and not c["ok"]]
    log(f"done in {call['seconds']} s; failed systems {failed or 'none'}; failed checks {bad or 'none'}")
    sys.exit(1 if failed or bad else 0)


if __name__ == "__main__":
    main()
