"""eval.experiments.capacity: the rate search, the SLO judgement, matched concurrency, the tables; and --quick end to end."""

import json
import subprocess
import sys
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[3]


def test_quick_runs_end_to_end(tiny_model, tmp_path, servers):
    # Its 4 servers start together, each with a host tier, which SGLang grants only with 10 GB of RAM
    # free beyond it: the shared servers stop first, and the tiers are small.
    servers.stop_all()
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "eval.experiments.capacity", "--quick", "--model", tiny_model, "--out",
                           str(tmp_path), "--host-tier-gb", "0.05"], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    took = time.monotonic() - started
    print(f"eval.experiments.capacity --quick took {took:.0f} s")
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    cells = results["cells"]
    assert {(c["system"], c["pool_pages"]) for c in cells} == {(s, p) for s in ("vanilla", "mepic") for p in (512, 1024)}
    for c in cells:
        assert 1 <= len(c["probes"]) <= 2 and all(p["requests"] == 12 for p in c["probes"])
        assert c["capacity"] in (0.0, 1.0, 2.0, 4.0, 8.0, 16.0)  # doubling or halving from 4 req/s or the smaller pool's
    table = (tmp_path / "table.md").read_text()
    assert "| system | pool pages | capacity req/s |" in table and "load average" in table and "stopped by" in table
    assert (tmp_path / "capacity.png").stat().st_size > 1000
    assert took < 420  # 4 servers started together; about 3 minutes on a quiet 2-core machine
