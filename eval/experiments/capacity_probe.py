"""One capacity probe and the search over rates: a run of requests at one rate judged against the SLO
(goodput), the watch that ends a failing probe early, and the bracket-then-bisect search that finds the highest
rate that holds. What eval.experiments.capacity runs a cell with; its tables are capacity_report.py's."""

import math
import re
import statistics
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field

import requests

from eval.experiments.run import abort_all, pct, run_point
from eval.lib import anatomy
from sglang_mepic.launch.sglang_flags import MEPIC_PAGE_SIZE


RETRACTED = "sglang:num_retracted_requests_total"
STAGES = "sglang:scheduler_stage_seconds_total"


@dataclass
class Probe:
    rate: float
    requests: int
    attainment: float  # share meeting both SLOs
    queue_first: float  # median queue wait of the first third of the arrivals, s
    queue_last: float  # and of the last third
    ok: bool
    ttft_p50: float
    e2e_p50: float
    e2e_mean: float
    achieved_rps: float
    in_flight: float  # mean requests in flight: sum of e2e / wall seconds (Little's law)
    peak_kv_pages: float
    mean_kv_pages: float
    counters: dict = field(default_factory=dict)
    seconds: float = 0.0
    ended_early: bool = False  # stopped once its misses exceeded what the attainment allows
    sent: int = 0  # requests sent (fewer than `requests` when it ended early)
    anatomy: dict = field(default_factory=dict)  # where the pages went (eval/lib/anatomy.py: peak, mean, series)
    refused: int = 0  # requests the server refused (run.Refused: more KV than it takes in one request), missed
    tpot_p50: float = 0.0  # time per output token after the first, s (median over the finished requests)
    queue_p50: float = 0.0  # the scheduler's queue wait, s (median over the finished requests)
    # The finished requests that missed the SLO, each {i (arrival order), sent_s (after the probe's start), queue,
    # ttft, tpot, e2e}: what a verdict was made of, so a miss can be read request by request (the requests a probe
    # ended early did not send or aborted count against attainment too, and are not listed).
    missed: list = field(default_factory=list)


@dataclass
class Cell:
    system: str
    pool_pages: int
    seed: int
    capacity: float  # req/s: the highest rate that held (0: none from --min-rate up)
    probes: list = field(default_factory=list)  # Probe as dicts, in the order run
    kind: str = "capacity"  # or "matched-<N>"
    seconds: float = 0.0  # wall time of the cell
    load: str = ""  # the machine's load average when the cell ended
    server_pages: int = 0  # pages the server's pool held (--equal-bytes: the pool's bytes in its KV dtype)


def finish_type(output) -> str | None:
    reason = output[2].get("finish_reason")
    return reason.get("type") if isinstance(reason, dict) else None


def refused(output) -> bool:
    return finish_type(output) == "refused"


def aborted(output) -> bool:
    """A request that did not finish: aborted, or refused by the server (`run.Refused`: a request larger than the
    pool takes is one the system cannot serve, a miss)."""
    return finish_type(output) in ("abort", "refused")


def tpot(output) -> float:
    """Seconds per output token after the first (vLLM's and SGLang's TPOT); 0 for a request of one token."""
    n = output[2].get("completion_tokens") or 0
    if n <= 1 or output[3] is None:
        return 0.0
    return (output[4] - output[3]) / (n - 1)


def meets(output, args) -> bool:
    """Whether a finished request met the SLO: TTFT, e2e, and with --tpot-slo the time per output token."""
    ttft = output[3] if output[3] is not None else math.inf
    if ttft > args.ttft_slo or output[4] > args.e2e_slo:
        return False
    tpot_slo = getattr(args, "tpot_slo", None)
    return tpot_slo is None or tpot(output) <= tpot_slo


def judge(outputs: list, rate: float, seconds: float, sampler, exact_peak, counters: dict, args,
          ended_early: bool = False) -> Probe:
    """One probe's figures from eval.experiments.run.run_point's outputs: (ids, text, meta, ttft, e2e, sent) per request,
    in the order of arrival; None for a request a probe that ended early did not send or aborted. Attainment is
    over all the requests of the probe (an unsent or aborted one has not met the SLO); the latencies are over the
    requests that finished."""
    done = [o for o in outputs if o is not None and not aborted(o)]
    ttft = [o[3] if o[3] is not None else math.inf for o in done]
    e2e = [o[4] for o in done]
    met = sum(meets(o, args) for o in done)
    queue = [o[2].get("queue_time") or 0.0 for o in done] or [0.0]
    third = max(1, len(queue) // 3)
    first, last = statistics.median(queue[:third]), statistics.median(queue[-third:])
    attainment = met / len(outputs)
    pages = sampler.pages
    peak = max(pages, default=0.0)
    if exact_peak is not None:
        peak = max(peak, exact_peak)
    ok = not ended_early and attainment >= args.attainment and last <= first + args.queue_slack
    return Probe(rate=rate, requests=len(outputs), attainment=round(attainment, 4), queue_first=round(first, 4),
                 queue_last=round(last, 4), ok=ok, ttft_p50=round(pct(ttft, 0.5), 4), e2e_p50=round(pct(e2e, 0.5), 4),
                 e2e_mean=round(statistics.fmean(e2e), 4) if e2e else math.nan,
                 achieved_rps=round(len(done) / seconds, 3), in_flight=round(sum(e2e) / seconds, 2),
                 peak_kv_pages=round(peak, 1), mean_kv_pages=round(statistics.fmean(pages), 1) if pages else 0.0,
                 counters=counters, seconds=round(seconds, 1), ended_early=ended_early,
                 sent=sum(o is not None for o in outputs), anatomy=anatomy.summarise(sampler.anatomy),
                 refused=sum(o is not None and refused(o) for o in outputs),
                 tpot_p50=round(pct([tpot(o) for o in done], 0.5), 5) if done else 0.0,
                 queue_p50=round(statistics.median(queue), 4), missed=missed_requests(outputs, args))


def missed_requests(outputs: list, args) -> list[dict]:
    """The finished requests of a probe that missed the SLO, with what each waited and took (see Probe.missed)."""
    sent = [o[5] for o in outputs if o is not None]
    start = min(sent, default=0.0)
    return [{"i": i, "sent_s": round(o[5] - start, 3), "queue": round(o[2].get("queue_time") or 0.0, 3),
             "ttft": round(o[3], 3) if o[3] is not None else None, "tpot": round(tpot(o), 4), "e2e": round(o[4], 3)}
            for i, o in enumerate(outputs) if o is not None and not aborted(o) and not meets(o, args)]


class Watch:
    """Ends a probe as soon as more of its requests have missed the SLO than the attainment allows: its verdict
    is then known, and a rate above capacity would otherwise spend minutes draining a queue. A request counts
    as missed when it finished outside the SLO, or when it is still in flight past the e2e target."""

    def __init__(self, url: str, requests_n: int, args):
        self.url, self.args = url, args
        self.allowed = math.floor((1 - args.attainment) * requests_n + 1e-9)
        self.stop, self._ended = threading.Event(), threading.Event()
        self._lock = threading.Lock()
        self._sent: dict[int, float] = {}
        self._missed = 0
        self.counters_at_stop: dict | None = None  # the scheduler's counters before the abort and its idle flush

    def sent(self, i: int) -> None:
        with self._lock:
            self._sent[i] = time.perf_counter()

    def done(self, i: int, output) -> None:
        with self._lock:
            self._sent.pop(i, None)
            if not meets(output, self.args):
                self._missed += 1
        self.check()

    def check(self) -> None:
        now = time.perf_counter()
        with self._lock:
            overdue = sum(now - t > self.args.e2e_slo for t in self._sent.values())
            first = self._missed + overdue > self.allowed and not self.stop.is_set()
            if first:  # under the lock: the watch thread and a finishing request may both see it
                self.stop.set()
        if first:
            self.counters_at_stop = scheduler_counters(self.url)
            abort_all(self.url)

    def _run(self) -> None:
        while not self._ended.wait(0.25):
            self.check()

    def __enter__(self):
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._ended.set()
        self._thread.join()


def scheduler_counters(url: str) -> dict:
    """SGLang's counters of the scheduler: requests retracted, and the seconds its loop spent in each stage
    (`run_batch` is the forward, `idle` waiting for work, the rest scheduling and result handling)."""
    return scheduler_counters_of(requests.get(url + "/metrics", timeout=30).text)


def scheduler_counters_of(metrics: str) -> dict:
    """scheduler_counters from a /metrics page already read."""
    out = {"retractions": 0.0, "stages": {}}
    for line in metrics.splitlines():
        if line.startswith(RETRACTED + "{"):
            out["retractions"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith(STAGES + "{") and (m := re.search(r'category="([a-z_]+)"', line)):
            out["stages"][m.group(1)] = out["stages"].get(m.group(1), 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def scheduler_delta(before: dict, after: dict) -> dict:
    stages = {k: round(v - before["stages"].get(k, 0.0), 3) for k, v in after["stages"].items()}
    return {"retractions": after["retractions"] - before["retractions"], "stage_seconds": stages}


def probe(server, pool: int, texts: list[str], rate: float, seed: int, args, bar, clients: int | None = None) -> Probe:
    """One run at `rate` (Poisson arrivals) that ends once it has failed: a capacity probe. With `clients`, a
    closed loop of that many clients instead, run to the end (matched concurrency: its rate is what it achieved)."""
    before = scheduler_counters(server.url)
    watch = None if clients else Watch(server.url, len(texts), args)
    with watch or ExitStack():
        outputs, sampler, exact, seconds, counters = run_point(server, MEPIC_PAGE_SIZE, pool, texts, rate, args.new_tokens,
                                                               seed, bar, watch=watch, clients=clients, refusals=True)
    after = scheduler_counters(server.url)
    if watch is not None and watch.counters_at_stop is not None:  # the stages up to the stop, not the flush after
        after = {**after, "stages": watch.counters_at_stop["stages"]}
    counters = {**counters, **scheduler_delta(before, after)}
    if clients:
        rate = round(len(outputs) / seconds, 3)
    return judge(outputs, rate, seconds, sampler, exact, counters, args, ended_early=bool(watch and watch.stop.is_set()))


def search(run, start: float, lo: float, hi: float, resolution: float, max_probes: int,
           step: float = 2.0) -> tuple[float, list]:
    """The highest rate in [lo, hi] at which run(rate).ok, by multiplying or dividing by `step` from `start` to a
    bracket, then bisecting on a log scale until failing / holding <= 1 + resolution. Returns (capacity, probes).
    A start taken from a neighbouring cell is close: a step of (1 + resolution)^2 brackets it in two probes. Where
    it is not (a seed whose capacity is four times the last one's), the step is squared, up to 2, at each further
    step the same way: 5 probes from (1.2)^2 reach 8.3 times the start, where they reached 4.3."""
    probes, held, failed = [], None, None

    def attempt(rate):
        p = run(rate)
        probes.append(p)
        return p.ok

    rate = min(max(start, lo), hi)
    while len(probes) < max_probes:
        if len(probes) >= 2 and step < 2.0:  # a second step the same way: the start was not close, stride out
            step = min(2.0, step * step)
        if attempt(rate):
            held = rate
            if failed is not None or rate >= hi:
                break
            rate = min(rate * step, hi)
        else:
            failed = rate
            if held is not None or rate <= lo:
                break
            rate = max(rate / step, lo)
    while held is not None and failed is not None and failed / held > 1 + resolution and len(probes) < max_probes:
        rate = math.sqrt(held * failed)
        if attempt(rate):
            held = rate
        else:
            failed = rate
    return (held or 0.0), probes
