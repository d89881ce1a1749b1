"""The TP ranks' agreement without a server: two real processes over gloo on loopback (tiers/agreement.py),
the launcher that now serves shared storage and the host tier under TP (counting every rank's host pool),
the rank check's setting, and a forward fault injected on one rank only (batch_guard). One rank's tiers
against a stand-in for the other's: tests/tiers/test_agreement.py; TP-2 servers: e2e/."""

import json
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from sglang_mepic import config, env
from sglang_mepic.hardening import batch_guard
from sglang_mepic.launch import checks
from sglang_mepic.launch.defaults import with_defaults
from sglang_mepic.process.server_process import free_port

# One TP rank: the agreement over a real gloo group of two, each rank with its own answers.
RANK = textwrap.dedent("""
    import json, sys
    from datetime import timedelta
    import torch.distributed as dist
    from sglang_mepic.tiers.agreement import Agreement, RanksDiverged

    rank, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))  # a rank that died does not leave the other waiting 30 min
    agreement = Agreement.of_group(dist.new_group([0, 1], backend="gloo"))
    codes = agreement.min_codes([[2, 2, 0, 1, 2], [2, 0, 2, 2, 1]][rank])
    size = agreement.min_int([4096, 1024][rank])
    agreement.check_same(b"same plan")
    try:
        agreement.check_same([b"rank 0 plan", b"rank 1 plan"][rank])  # (the first 7 bytes are compared)
        diverged = None
    except RanksDiverged as e:
        diverged = str(e)
    with open(out, "w") as f:
        json.dump({"size": agreement.size, "rank": agreement.rank, "codes": codes, "min": size,
                   "collectives": agreement.collectives, "diverged": diverged}, f)
    # A rank that exits while the other still holds the group aborts in gloo's teardown ("terminate called
    # without an active exception", about 1 run in 12): both leave together, and the group goes first.
    dist.barrier()
    dist.destroy_process_group()
""")


def test_two_gloo_ranks_agree_on_the_lowest_code_and_both_see_a_divergence(tmp_path):
    port, script = free_port(), tmp_path / "rank.py"
    script.write_text(RANK)
    ranks = [subprocess.Popen([sys.executable, str(script), str(r), str(port), str(tmp_path / f"{r}.json")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    try:
        for proc in ranks:
            out, _ = proc.communicate(timeout=120)
            assert proc.returncode == 0, out[-3000:]
    finally:
        for proc in ranks:  # a failed check leaves no rank running
            proc.kill()
            proc.wait()
    got = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    for r, answer in enumerate(got):
        assert (answer["size"], answer["rank"]) == (2, r)
        assert answer["codes"] == [2, 0, 0, 1, 1] and answer["min"] == 1024  # the same on both ranks
        assert answer["collectives"] == 4  # one per call: min_codes, min_int, two checks
        assert answer["diverged"].startswith("round 2: the TP ranks planned differently (rank 0: round 2 plan ")
        assert ", rank 1: round 2 plan " in answer["diverged"]


def _tp2(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": 4, "num_key_value_heads": 2}))
    return with_defaults(["--model-path", str(tmp_path), "--tp-size", "2"], cuda=False)[0]


@pytest.mark.parametrize("setting, value", [("STORAGE_DIR", "/tmp/mepic-tp-store"), ("HOST_TIER_GB", "0.05")])
def test_shared_storage_and_the_host_tier_are_served_under_tp(tmp_path, monkeypatch, setting, value):
    """Refused before the ranks agreed (a read's timeout, an outage, the host pool's size were one rank's)."""
    monkeypatch.setenv(getattr(config, setting).env, value)
    env.reload()
    checks.check_parallelism(_tp2(tmp_path))


def test_the_host_tiers_memory_check_counts_every_rank(tmp_path, monkeypatch):
    """Each TP rank makes a host pool of the size asked: two ranks of 1 GB want 2 GB beside SGLang's reserve."""
    monkeypatch.setenv(config.HOST_TIER_GB.env, "1")
    monkeypatch.setattr(checks, "free_host_memory", lambda: 12_000_000_000)  # 1 GB + 10 GiB fit, 2 GB do not
    env.reload()
    checks.check_combinations(with_defaults(["--model-path", str(tmp_path)], cuda=False)[0], cuda=False)
    with pytest.raises(SystemExit, match=r"--mepic-host-tier-gb 1: the host tier needs 12\.7 GB of free RAM \(2 TP "
                                         r"ranks, 1 GB each for the tier and the 10 GiB"):
        checks.check_combinations(_tp2(tmp_path), cuda=False)


def test_the_rank_check_is_off_unless_its_variable_is_1():
    assert not env.Settings.from_env({}).check_ranks
    assert not env.Settings.from_env({env.CHECK_RANKS_ENV: "0"}).check_ranks
    assert env.Settings.from_env({env.CHECK_RANKS_ENV: "1"}).check_ranks


def test_a_fault_named_for_one_rank_fails_only_that_ranks_forward(monkeypatch):
    from sglang.srt.runtime_context import get_parallel

    monkeypatch.setenv(batch_guard.FAULT_ENV, "rank1:one-rank,everywhere,rank0:decode:first")
    assert batch_guard._fault_prefixes(decode=False, tp_rank=1) == ["one-rank", "everywhere"]
    assert batch_guard._fault_prefixes(decode=False, tp_rank=0) == ["everywhere"]
    assert batch_guard._fault_prefixes(decode=True, tp_rank=0) == ["everywhere", "first"]
    mode = SimpleNamespace(is_decode=lambda: False)
    batch = SimpleNamespace(forward_mode=mode, reqs=[SimpleNamespace(rid="one-rank-7")])
    for rank, raises in ((0, False), (1, True)):
        worker = SimpleNamespace()
        with get_parallel().override(tp_size=2, tp_rank=rank):
            with batch_guard.injected_fault(SimpleNamespace(model_worker=worker), batch):
                assert hasattr(worker, "forward_batch_generation") == raises
