"""SGLang's own usage gauges follow the pool on an idle server (metrics.refresh_sglang_usage_when_stale).

SGLang publishes `sglang:num_used_tokens` and `sglang:token_usage` with each batch and,
when idle, every 30 s: after the last request, or a flush, a dashboard or autoscaler
read a busy server (80-5,424 tokens, usage 0.08) while the `sglang_mepic:*` gauges
read every page free.
"""

import time
from concurrent.futures import ThreadPoolExecutor

import requests


DOC = " ".join(f"line{i} says {i * 5 % 11}." for i in range(60))


def gauge(server, name: str) -> float:
    text = requests.get(server.url + "/metrics", timeout=30).text
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{")]
    assert values, f"{name} is not on /metrics"
    return max(values)


def test_usage_gauges_read_zero_soon_after_a_flush_on_an_idle_server(tiny_server):
    def generate(i):
        return requests.post(tiny_server.url + "/generate", timeout=120, json={
            "text": f"Question {i}: <|chunk|>{DOC}<|/chunk|> what does line{i} say?",
            "sampling_params": {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True}})

    with ThreadPoolExecutor(6) as pool:
        answers = [pool.submit(generate, i) for i in range(6)]
        busy = 0.0
        while not all(a.done() for a in answers):
            busy = max(busy, gauge(tiny_server, "sglang:num_used_tokens"))
            time.sleep(0.05)
        assert all(a.result().status_code == 200 for a in answers)
    assert busy > 0, "no batch published any use: nothing is tested"
    assert requests.post(tiny_server.url + "/flush_cache", timeout=60).status_code == 200
    deadline = time.monotonic() + 10  # SGLang alone refreshes an idle server's gauges every 30 s
    while gauge(tiny_server, "sglang:num_used_tokens") > 0 or gauge(tiny_server, "sglang:token_usage") > 0:
        assert time.monotonic() < deadline, "SGLang's usage gauges still read a busy pool on an idle server"
        time.sleep(0.5)
