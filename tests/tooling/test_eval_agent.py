"""eval.experiments.agent with several seeds: each figure is the median over them, with its range."""

from eval.experiments.agent import medians, table  # the eval package is registered by conftest.py


def row(system, ttft, computed, turns):
    return {"system": system, "requests": 8, "prompt_tokens": 480.0, "computed_tokens": computed,
            "computed_per_turn": turns, "peak_kv_pages": 100.0, "ttft_p50": ttft, "ttft_p99": ttft * 2,
            "agreement": 1.0, "top1": 1.0, "seconds": 10.0}


def test_medians_and_ranges_over_seeds():
    per_seed = [[row("vanilla", 2.0, 300, [1, 5]), row("mepic", 1.0, 200, [2, 6])],
                [row("vanilla", 4.0, 320, [3, 7]), row("mepic", 0.5, 210, [4, 8])],
                [row("vanilla", 3.0, 310, [5, 9]), row("mepic", 0.9, 190, [6, 10])]]
    vanilla, mepic = medians(per_seed)
    assert (vanilla["ttft_p50"], vanilla["ttft_p50_range"]) == (3.0, (2.0, 4.0))
    assert (mepic["computed_tokens"], mepic["computed_tokens_range"]) == (200, (190, 210))
    assert mepic["computed_per_turn"] == [4, 8] and mepic["requests"] == 24 and mepic["seeds"] == 3
    text = table([vanilla, mepic])
    assert "| mepic | 480 | 200 (190-210) | 100 | 0.90 (0.50-1.00) |" in text
    # One seed: the figures alone, no range.
    assert "| vanilla | 480 | 300 | 100 | 2.00 | 4.00 |" in table(medians(per_seed[:1]))
