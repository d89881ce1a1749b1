"""A request's output does not depend on how SGLang schedules it: the scheduling-flag matrix.

Under each set of SGLang flags that changes how a request's tokens reach the forward, the same
chunked and plain requests are sent one at a time on an empty cache, then together, arriving a
little apart so that new prefills meet decoding requests (mixed batches, preemption, chunked
prefill splitting a chunk). Greedy tokens in float32 must be the same both times.

Every flag of the matrix appears in at least one server; flags that do not interfere share one,
because each server costs a start (about a minute on 2 cores). A flag the project cannot serve is
refused at launch, and `test_refused_scheduling_flags` checks the refusal instead.

| server | flags | what it exercises |
|---|---|---|
| mixed | --enable-mixed-chunk, lpm | decode tokens riding in prefill batches (issue 68); a cache-aware policy |
| split | --enable-mixed-chunk, --chunked-prefill-size 32, lof, 2 continuous decode steps, fp8_e5m2 KV | chunks split across prefill passes, mixed, over an fp8 pool (issue 73) |
| one-at-a-time | --page-size 32, --max-running-requests 1, dfs-weight, --max-prefill-tokens 256 | larger pages, strictly serial running |
| wide-pages | --page-size 64, random, --disable-overlap-schedule, --schedule-conservativeness 0.3 | larger pages, no overlap, eager admission |
| preempt | --enable-priority-scheduling, --max-running-requests 2, fcfs, SGLANG_TEST_RETRACT=1, fp8_e5m2 KV | priority preemption (compile rows ranked as their readers) and forced retraction, over an fp8 pool |
| interval | hrrn, --prefill-decode-interval 2 | decode rounds forced between prefills |
| shortest | shortest-prefill-first, --max-running-requests 3, --max-queued-requests 64 | a cache-aware sort by prefill length |
| keyed | routing-key, --stream-interval 4 | the routing-key sort (requests carry keys) |

An fp8 KV cache (`--kv-cache-dtype fp8_e5m2`, the CPU's fp8) rides on two servers: it changes what a page
holds, not how the scheduler moves requests, so it shares them; `mixed` keeps the float32 pool under mixed
batches.

Every `--schedule-policy` SGLang offers but `priority` (an alias SGLang maps onto
--enable-priority-scheduling's sort, run by `preempt`) is one server's.
"""

import random

import pytest
import requests

from sglang_mepic.frontend.markup import CHUNK_BEGIN_ID as BEG
from sglang_mepic.frontend.markup import CHUNK_END_ID as END
from sglang_mepic.process.server_process import ServerProcess
from support import warm_alone


NEW_TOKENS = 24
# preempt's forced retraction (SGLANG_TEST_RETRACT) acts only on a decode batch of 2 or more: with 24 tokens a
# request ended before the next one arrived on a 2-core Xeon VM (2026-11-30: no request retracted, 3 runs out of
# 3, on the landed code too), so there its requests decode long enough to overlap whatever the machine's speed.
NEW_TOKENS_OF = {"preempt": 96}


ARRIVAL_GAP_S = 0.12


SERVERS = {
    "mixed": (["--enable-mixed-chunk", "--schedule-policy", "lpm"], {}),
    "split": (["--enable-mixed-chunk", "--chunked-prefill-size", "32", "--schedule-policy", "lof",
               "--num-continuous-decode-steps", "2", "--kv-cache-dtype", "fp8_e5m2"], {}),
    "one-at-a-time": (["--page-size", "32", "--max-running-requests", "1", "--schedule-policy", "dfs-weight",
                       "--max-prefill-tokens", "256"], {}),
    "wide-pages": (["--page-size", "64", "--schedule-policy", "random", "--disable-overlap-schedule",
                    "--schedule-conservativeness", "0.3"], {}),
    "preempt": (["--enable-priority-scheduling", "--max-running-requests", "2", "--schedule-policy", "fcfs",
                 "--kv-cache-dtype", "fp8_e5m2"], {"SGLANG_TEST_RETRACT": "1"}),
    "interval": (["--schedule-policy", "hrrn", "--prefill-decode-interval", "2"], {}),
    "shortest": (["--schedule-policy", "shortest-prefill-first", "--max-running-requests", "3",
                  "--max-queued-requests", "64"], {}),
    "keyed": (["--schedule-policy", "routing-key", "--stream-interval", "4"], {}),
}


def workload(seed: int = 68) -> list[list[int]]:
    """Chunked requests that share and reorder chunks, and plain ones, of mixed lengths."""
    rng = random.Random(seed)
    chunks = [[rng.randrange(100, 400) for _ in range(rng.randint(20, 70))] for _ in range(4)]
    out = []
    for i in range(10):
        if i % 4 == 3:  # plain
            out.append([rng.randrange(100, 400) for _ in range(rng.randint(10, 90))])
            continue
        ids = [rng.randrange(100, 400) for _ in range(rng.randint(0, 6))]
        for c in rng.sample(chunks, rng.randint(1, 3)):
            ids += [BEG, *c, END]
        out.append(ids + [rng.randrange(100, 400) for _ in range(rng.randint(2, 8))])
    return out


def generate(url: str, ids: list[int], extra: dict | None = None, new_tokens: int = NEW_TOKENS) -> list[int]:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0,
                                                  "ignore_eos": True}, **(extra or {})}
    r = requests.post(url + "/generate", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["output_ids"]


def alone_then_together(url: str, work: list[list[int]], extras: list[dict] | None = None,
                        new_tokens: int = NEW_TOKENS):
    items = list(zip(work, extras or [{}] * len(work)))
    send = lambda item: generate(url, *item, new_tokens=new_tokens)  # noqa: E731
    first = warm_alone.alone(url, items, send)
    warm_alone.flush(url)
    return first, warm_alone.together(items, send, len(items), ARRIVAL_GAP_S)


def assert_same(name: str, work, alone, together) -> None:
    differ = [i for i in range(len(work)) if alone[i] != together[i]]
    detail = "; ".join(f"request {i} ({'chunked' if BEG in work[i] else 'plain'}): alone {alone[i]} "
                       f"together {together[i]}" for i in differ[:3])
    assert not differ, f"[{name}] {len(differ)} of {len(work)} answers changed with the schedule: {detail}"


@pytest.mark.parametrize("name", list(SERVERS))
def test_outputs_do_not_depend_on_the_schedule(tiny_model, name):
    flags, env = SERVERS[name]
    work = workload()
    extras = None
    if name == "preempt":  # the later half outranks the earlier, so it preempts what runs
        extras = [{"priority": 0 if i < len(work) // 2 else 100} for i in range(len(work))]
    elif name == "keyed":
        extras = [{"routing_key": f"tenant-{i % 3}"} for i in range(len(work))]
    with ServerProcess(tiny_model, "--dtype", "float32", *flags, env=env, startup_timeout=900) as server:
        alone, together = alone_then_together(server.url, work, extras, NEW_TOKENS_OF.get(name, NEW_TOKENS))
        metrics = requests.get(server.url + "/metrics", timeout=30).text
    assert_same(name, work, alone, together)
    if "SGLANG_TEST_RETRACT" in env:  # the schedule under test did happen
        assert retracted(metrics) > 0, "no request was retracted"


def retracted(metrics: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("sglang:num_retracted_requests_total"))
