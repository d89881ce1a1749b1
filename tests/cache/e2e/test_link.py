"""The link path end to end on real SGLang servers (tiny model, float32): modes,
memory against its bound and against EPIC, concurrency, flush, and exactness.

Prompts are token ids with the id markup, so every server sees exactly the
same tokens (text markup tokenizes each piece on its own)."""

import json
import math
import random
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from sglang_mepic.frontend.markup import CHUNK_BEGIN_ID, CHUNK_END_ID
from sglang_mepic.process.server_process import ServerProcess
from sglang_mepic.wire.layout import Kind, Piece, layout
from support.server_log import prefill_logged


B = 16
MAX_NEW = 8


def ids(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(10, 4000) for _ in range(n)]


CHUNKS = [ids(n, seed) for seed, n in enumerate([200, 260, 330, 400, 450, 510, 560, 600])]
INSTRUCTION = ids(11, 100)


def marked(chunks, question):
    out = list(INSTRUCTION)
    for c in chunks:
        out += [CHUNK_BEGIN_ID, *c, CHUNK_END_ID]
    return out + question


def stripped(prompt):
    return [t for t in prompt if t not in (CHUNK_BEGIN_ID, CHUNK_END_ID)]


def workload():
    """24 requests drawing 3-5 chunks from the 8, in shuffled orders."""
    rng = random.Random(7)
    out = []
    for i in range(24):
        order = rng.sample(range(8), rng.randint(3, 5))
        question = ids(9, 1000 + i)
        out.append((order, question, marked([CHUNKS[j] for j in order], question)))
    return out


def generate(server, input_ids, max_new=MAX_NEW):
    r = requests.post(server.url + "/generate", timeout=300, json={
        "input_ids": input_ids, "sampling_params": {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    return r.json()


def mepic_stats(server):
    r = requests.get(server.url + "/server_info", timeout=30)
    return r.json()["internal_states"][0]["mepic"]


def flush(server):
    assert requests.post(server.url + "/flush_cache", timeout=60).status_code == 200


def run(server, prompts, in_flight=4):
    with ThreadPoolExecutor(in_flight) as pool:
        return list(pool.map(lambda p: generate(server, p), prompts))


def start(tiny_model, *args):
    return ServerProcess(tiny_model, "--dtype", "float32", *args)


MODE_FLAGS = {"vanilla": ["--attention-backend", "torch_native", "--radix-cache-backend", "mepic"],
              "full": ["--mepic-mode", "full"], "mepic": [], "all": ["--mepic-recompute-blocks", "all"],
              "epic-16": ["--mepic-mode", "epic-16"], "naive": ["--mepic-mode", "naive"],
              "cacheblend-0.15": ["--mepic-mode", "cacheblend-0.15"]}


@pytest.fixture(scope="session")
def modes(servers):
    """mode -> a running server of the session's shared ones (conftest `servers`), flushed and clean."""
    return lambda mode: servers.get(*MODE_FLAGS[mode])


def test_full_mode_equals_vanilla_sglang_with_markers_stripped(modes):
    prompts = [p for *_, p in workload()[:6]]
    full_server, vanilla_server = modes("full"), modes("vanilla")
    full = [generate(full_server, p)["output_ids"] for p in prompts]
    vanilla = [generate(vanilla_server, stripped(p))["output_ids"] for p in prompts]
    assert full == vanilla


def test_every_block_recomputed_equals_full(modes):
    """Exactness of the reuse path: laid out, padded, planned, nothing shared."""
    prompts = [p for *_, p in workload()[:6]]
    full_server, all_server = modes("full"), modes("all")
    full = [generate(full_server, p)["output_ids"] for p in prompts]
    every = [generate(all_server, p) for p in prompts]
    assert [r["output_ids"] for r in every] == full
    # nothing is shared: whatever is not a prefix-cache hit is computed
    for r in every:
        m = r["meta_info"]
        assert m["mepic_recomputed_tokens"] + m["cached_tokens"] == m["prompt_tokens"]


def per_request_pages(order, question):
    """Pages a request holds besides canonical ones: prompt pages, one first block per chunk, decode."""
    pieces = [Piece(Kind.PROMPT, tuple(INSTRUCTION))] + [Piece(Kind.CHUNK, tuple(CHUNKS[j])) for j in order] + \
        [Piece(Kind.PROMPT, tuple(question))]
    lay = layout(pieces, B)
    canonical = sum(s.size // B - 1 for s in lay.chunks)
    return math.ceil((lay.size + MAX_NEW) / B) - canonical


def peak_pages(server, work):
    flush(server)
    start_free = mepic_stats(server)["kv_pages_free"]
    outputs = run(server, [p for *_, p in work])
    stats = mepic_stats(server)
    flush(server)
    end_free = mepic_stats(server)["kv_pages_free"]
    return stats, start_free, end_free, outputs


def test_mepic_memory_bound_and_half_of_epic(modes, capsys):
    work = workload()
    mepic, start_free, end_free, _ = peak_pages(modes("mepic"), work)
    assert end_free == start_free, "a flush after the load must give every page back"
    epic, e_start, e_end, _ = peak_pages(modes("epic-16"), work)
    assert e_end == e_start

    canonical = sum(math.ceil(len(c) / B) - 1 for c in CHUNKS)
    assert mepic["canonical_chunk_pages"] == canonical  # one copy of each chunk, whatever its positions
    in_flight = sorted((per_request_pages(o, q) for o, q, _ in work), reverse=True)[:4]
    bound = canonical + sum(in_flight)
    with capsys.disabled():  # the figures belong in the test log
        print(f"\n[memory] mepic peak KV pages {mepic['kv_pages_in_use_peak']}, bound {bound} "
              f"(canonical {canonical} + in flight {sum(in_flight)}), "
              f"ratio {mepic['kv_pages_in_use_peak'] / bound:.3f}")
        print(f"[memory] epic-16 peak KV pages {epic['kv_pages_in_use_peak']}, "
              f"mepic/epic-16 = {mepic['kv_pages_in_use_peak'] / epic['kv_pages_in_use_peak']:.3f}")
    assert mepic["kv_pages_in_use_peak"] <= 1.10 * bound
    assert mepic["kv_pages_in_use_peak"] <= 0.5 * epic["kv_pages_in_use_peak"]
    assert mepic["chunk_hits"] > 0 and mepic["chunks_compiled"] >= 8


def test_epic_computes_only_what_it_recomputes_and_answers_as_before(modes):
    """EPIC copies a reused chunk's KV into its own pages before the forward, so the model runs
    only on the prompt and each chunk's first 16 tokens. Its outputs are those recorded before
    that change, when it ran every token and overwrote the copied ones (tests/data)."""
    server = modes("epic-16")
    flush(server)
    mark = len(server.log())  # a shared server: this test's part of its log
    recorded = json.loads((Path(__file__).resolve().parents[2] / "data" / "epic16_outputs.json").read_text())["output_ids"]
    work = workload()[:len(recorded)]
    outputs = [generate(server, p) for *_, p in work]
    assert [o["output_ids"] for o in outputs] == recorded
    log = server.log()[mark:]
    for (order, question, prompt), o in zip(work, outputs):
        m = o["meta_info"]
        computed = len(INSTRUCTION) + len(question) + B * len(order)  # every chunk is longer than a page
        assert m["mepic_recomputed_tokens"] == computed
        assert m["cached_tokens"] + m["mepic_compiled_tokens"] + computed == len(stripped(prompt))
        # SGLang's own prefill log: the tokens the forward ran, and the prefix it did not
        assert prefill_logged(log, computed, m["cached_tokens"])
    assert mepic_stats(server)["private_copy_fallbacks"] == 0


def test_same_chunk_at_different_positions_concurrently_equals_one_at_a_time(modes):
    """IBM spans PR#88: concurrent requests reusing one chunk at different positions."""
    server = modes("mepic")
    shared = CHUNKS[2]
    prompts = [marked([CHUNKS[j] for j in others[:k]] + [shared] + [CHUNKS[j] for j in others[k:]], ids(9, 50 + k))
               for k, others in enumerate([[0, 1, 3], [4, 0], [5, 6, 7], [1], [7, 3, 0]])]
    flush(server)
    together = run(server, prompts, in_flight=len(prompts))
    flush(server)
    alone = []
    for p in prompts:
        alone.append(generate(server, p))
        flush(server)
    assert [r["output_ids"] for r in together] == [r["output_ids"] for r in alone]
    assert all(r["meta_info"]["mepic_chunk_hits"] >= 1 for r in together)


def test_meta_info_reports_reuse_and_recompute(modes):
    server = modes("mepic")
    flush(server)
    order, _, prompt = workload()[0]
    first = generate(server, prompt)["meta_info"]
    again = generate(server, prompt)["meta_info"]
    real = len(stripped(prompt))
    assert first["prompt_tokens"] == real
    # every chunk was compiled just before the request, for it, and reused by it: compiled, not cached
    assert first["mepic_chunk_hits"] == len(order) and first["mepic_chunk_misses"] == 0
    assert first["mepic_compiled_tokens"] == sum(len(CHUNKS[j]) - B for j in order)
    assert first["cached_tokens"] + first["mepic_compiled_tokens"] + first["mepic_recomputed_tokens"] == real
    assert again["mepic_compiled_tokens"] == 0
    assert again["cached_tokens"] + again["mepic_recomputed_tokens"] == real
    # computed: instruction, question and the first block (16 real tokens) of each chunk
    assert first["mepic_recomputed_tokens"] == real - sum(len(CHUNKS[j]) - B for j in order)
    # the identical request matches the tree through its first blocks: only the last page is computed
    assert again["mepic_recomputed_tokens"] <= B
    metrics = requests.get(server.url + "/metrics", timeout=30).text
    for name in ("kv_pages_in_use", "canonical_chunk_pages", "shared_pages", "chunk_hits", "chunk_misses",
                 "chunk_evictions", "recomputed_tokens"):
        assert f"sglang_mepic:{name} " in metrics, name


def test_metrics_equal_server_info_once_idle(modes):
    """The gauges follow the frees of the last requests, not just the allocations before them."""
    server = modes("mepic")
    run(server, [p for *_, p in workload()[:6]])
    time.sleep(5)  # idle
    metrics = requests.get(server.url + "/metrics", timeout=30).text
    info = mepic_stats(server)
    for name in ("kv_pages_in_use", "kv_pages_free", "canonical_chunk_pages", "chunks_resident"):
        value = re.search(rf"^sglang_mepic:{name}(?:{{[^}}]*}})? (\S+)$", metrics, re.M)
        assert value is not None, name
        assert float(value.group(1)) == info[name], (name, value.group(1), info[name])
    assert info["kv_pages_in_use"] == 0  # nothing runs: the pages left are the tree's and the store's


@pytest.mark.parametrize("mode", ["naive", "cacheblend-0.15"])
def test_other_modes_serve_the_workload_with_their_memory_behaviour(modes, mode):
    work = workload()[:8]
    stats, start_free, end_free, outputs = peak_pages(modes(mode), work)
    assert end_free == start_free
    assert all(len(o["output_ids"]) == MAX_NEW for o in outputs)
    mepic, _, _, mepic_outputs = peak_pages(modes("mepic"), work)
    if mode == "naive":  # shares like mepic, recomputes nothing of a reused chunk
        assert stats["kv_pages_in_use_peak"] <= mepic["kv_pages_in_use_peak"]
        recomputed = [sum(o["meta_info"]["mepic_recomputed_tokens"] for o in out) for out in (outputs, mepic_outputs)]
        assert recomputed[0] < recomputed[1]
    else:  # private copies, like EPIC
        assert stats["kv_pages_in_use_peak"] > 1.5 * mepic["kv_pages_in_use_peak"]


def test_cacheblend_charges_each_page_once_at_light_load(modes, capsys):
    """CacheBlend copies the stored KV into the request's own slots when they are allocated and
    lets the stored pages go there. One request at a time, it holds its own laid-out row and
    its stored pages no more: `full`'s pages plus at most the chunks' padding (a page per
    chunk), where it held the stored pages too until its first decode step before (twice
    `full`'s pages)."""
    work = workload()[:4]
    blend = [peak_pages(modes("cacheblend-0.15"), [w])[0]["kv_pages_in_use_peak"] for w in work]
    full = [peak_pages(modes("full"), [w])[0]["kv_pages_in_use_peak"] for w in work]
    rows = []
    for order, question, _ in work:
        pieces = [Piece(Kind.PROMPT, tuple(INSTRUCTION))] + [Piece(Kind.CHUNK, tuple(CHUNKS[j])) for j in order] + \
            [Piece(Kind.PROMPT, tuple(question))]
        rows.append(math.ceil((layout(pieces, B).size + MAX_NEW) / B))
    with capsys.disabled():
        print(f"\n[memory] one request at a time, peak KV pages: cacheblend-0.15 {blend}, full {full}, "
              f"cacheblend's laid-out rows {rows}")
    assert all(b <= f + len(order) for b, f, (order, _, _) in zip(blend, full, work)), (blend, full)
    assert mepic_stats(modes("cacheblend-0.15"))["kv_pages_in_use"] == 0  # idle: nothing left pinned


def test_cacheblend_selecting_every_token_equals_full_on_four_layers():
    """On a model with layers after CacheBlend's check layer, copied KV sits in the request's own
    slots and is overwritten by fresh KV only for selected tokens: selecting all of them
    (ratio 1) must give full recompute's tokens exactly, chunks first compiled and then reused."""
    from sglang_mepic.launch import models

    four = str(models.build(models.EVAL_MODEL))
    prompts = [p for *_, p in workload()[:6]]
    with start(four, "--mepic-mode", "full") as full:
        expected = [generate(full, p)["output_ids"] for p in prompts]
    with start(four, "--mepic-mode", "cacheblend-1.0") as blend:
        got = [generate(blend, p)["output_ids"] for p in prompts]
        info = mepic_stats(blend)
    assert got == expected
    assert info["chunk_hits"] > 0  # later prompts read stored chunks: the copies ran


def test_chunked_prefill_and_mixed_batches_give_the_same_tokens(modes, tiny_model):
    """Requests with and without chunks in one batch, split by chunked prefill, against one at a time."""
    prompts = [p for *_, p in workload()[8:14]] + [ids(300, 77), ids(40, 78)]
    reference = modes("mepic")
    flush(reference)
    alone = [generate(reference, p)["output_ids"] for p in prompts]
    with start(tiny_model, "--chunked-prefill-size", "128") as chunked:
        together = run(chunked, prompts, in_flight=len(prompts))
        info = mepic_stats(chunked)
    assert [r["output_ids"] for r in together] == alone
    assert info["chunk_hits"] > 0 and info["shared_pages"] > 0


def test_streamed_responses_report_the_same_figures(modes):
    import json

    server = modes("mepic")
    _, _, prompt = workload()[3]
    plain = generate(server, prompt)["meta_info"]
    with requests.post(server.url + "/generate", stream=True, timeout=300, json={
            "input_ids": prompt, "stream": True,
            "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}}) as r:
        chunks = [json.loads(line[5:]) for line in r.iter_lines()
                  if line.startswith(b"data:") and line[5:].strip() != b"[DONE]"]
    last = chunks[-1]["meta_info"]
    for key in ("mepic_chunk_hits", "mepic_chunk_misses"):
        assert last[key] == plain[key], key
    assert isinstance(last["mepic_recomputed_tokens"], int)


MEPIC_FIELDS = ("mepic_recomputed_tokens", "mepic_chunk_hits", "mepic_chunk_misses", "mepic_residency")


def test_every_copy_of_an_n2_request_and_every_stream_carries_the_mepic_fields(modes):
    import json

    server = modes("mepic")
    _, _, prompt = workload()[5]
    sampling = {"max_new_tokens": MAX_NEW, "temperature": 0.8, "n": 2}
    copies = requests.post(server.url + "/generate", timeout=300,
                           json={"input_ids": prompt, "sampling_params": sampling}).json()
    assert isinstance(copies, list) and len(copies) == 2
    with requests.post(server.url + "/generate", stream=True, timeout=300,
                       json={"input_ids": prompt, "stream": True, "sampling_params": sampling}) as r:
        streamed = [json.loads(line[5:]) for line in r.iter_lines()
                    if line.startswith(b"data:") and line[5:].strip() != b"[DONE]"]
    finals = [c["meta_info"] for c in streamed if c["meta_info"].get("finish_reason")]
    assert len(finals) == 2
    chunks = len(workload()[5][0])
    for meta in [c["meta_info"] for c in copies] + finals:
        for key in MEPIC_FIELDS:
            assert key in meta, (key, meta)
        assert len(meta["mepic_residency"]) == chunks
        assert meta["mepic_chunk_hits"] + meta["mepic_chunk_misses"] == chunks


@pytest.mark.parametrize("mode", ["vanilla", "full", "epic-16"])
def test_empty_prompts_are_refused_in_every_mode(modes, mode):
    """SGLang's own torch_native path crashes on an empty extend as well: refused before it."""
    from support.intake import EMPTY, send, still_serving

    server = modes(mode)
    for path, body, message in EMPTY:
        r = send(server, path, body)
        assert r.status_code == 400 and message in r.text, (path, body, r.text)
    still_serving(server)
