"""eval.agent with several seeds: each figure is the median over them, with its range."""

import importlib
import importlib.util
import sys
from pathlib import Path

# eval/ is not installed and the repository root stays off sys.path (its kernels/ would shadow
# the PyPI package), so the package is registered from its folder, as test_eval_checkpoint does.
EVAL = Path(__file__).resolve().parent.parent / "eval"
if "eval" not in sys.modules:
    _spec = importlib.util.spec_from_file_location("eval", EVAL / "__init__.py", submodule_search_locations=[str(EVAL)])
    sys.modules["eval"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["eval"])
agent = importlib.import_module("eval.agent")
medians, table = agent.medians, agent.table


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
