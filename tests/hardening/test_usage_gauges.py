"""SGLang's own usage gauges follow the pool on an idle server (metrics.refresh_sglang_usage_when_stale). The unit half: the whole description, and the tests on a server, are in
e2e/test_usage_gauges_server.py."""


def test_an_idle_pass_publishes_sglang_usage_when_the_pool_changed():
    """The mechanism, without a server: the idle pass forces SGLang's own publication (its
    `last_log_time = 0`) exactly when the pool's use differs from the published figure."""
    from types import SimpleNamespace

    from sglang_mepic.cache import metrics

    def scheduler(published: int, used: int):
        pool = SimpleNamespace(get_kv_token_stats=lambda: (used, used / 1000))
        return SimpleNamespace(
            pool_stats_observer=SimpleNamespace(get_pool_stats=lambda: pool),
            metrics_reporter=SimpleNamespace(current_scheduler_metrics_enabled=True,
                                             stats=SimpleNamespace(num_used_tokens=published),
                                             metrics_collector=SimpleNamespace(last_log_time=123.0)))

    stale = scheduler(published=5424, used=0)
    metrics.refresh_sglang_usage_when_stale(stale)
    assert stale.metrics_reporter.metrics_collector.last_log_time == 0.0
    current = scheduler(published=80, used=80)
    metrics.refresh_sglang_usage_when_stale(current)
    assert current.metrics_reporter.metrics_collector.last_log_time == 123.0
