"""The per-model accuracy gate: check_model's figures, verdicts and exit status, and --mepic-verify. The unit half: the whole description, and the tests on a server, are in
e2e/test_check_model_server.py."""

import math
import os

import pytest

from sglang_mepic.gate import calibration
from sglang_mepic.gate import verdict as gate
from sglang_mepic.gate import verdict_cache
from sglang_mepic.gate.agreement import lumped_kl
from support.check_model import check_model


def test_lumped_kl_is_exact_over_the_buckets():
    p = {1: math.log(0.5), 2: math.log(0.3)}  # rest 0.2
    assert lumped_kl(p, p) == 0.0
    q = {1: math.log(0.25), 2: math.log(0.25)}  # rest 0.5
    expected = 0.5 * math.log(0.5 / 0.25) + 0.3 * math.log(0.3 / 0.25) + 0.2 * math.log(0.2 / 0.5)
    assert lumped_kl(p, q) == pytest.approx(expected)


def test_verdict_names_each_failed_threshold():
    figures = gate.Figures(questions=8, top1=0.5, kl=0.01, prefix=0.1, positions=128)
    verdict = gate.judge("mepic", figures, gate.Thresholds(min_top1=0.9, max_kl=0.5, min_prefix=0.2))
    assert not verdict.passed
    assert verdict.failures == ("top-1 0.500 < 0.9", "prefix 0.100 < 0.2")
    assert verdict.lines()[-1].startswith("verdict: FAIL")
    assert gate.judge("mepic", figures, gate.Thresholds(0.5, 0.5, 0.1)).passed
    assert not gate.judge("mepic", gate.Figures(8, 1.0, float("nan"), 1.0, 0), gate.Thresholds()).passed


def test_calibration_prompts_mark_the_same_tokens_as_plain(tiny_model):
    from transformers import AutoTokenizer

    prompts = calibration.prompts(AutoTokenizer.from_pretrained(tiny_model), 3)
    for p in prompts:
        assert [t for t in p.marked if t >= 0] == list(p.plain)
        assert p.marked.count(-100) == p.marked.count(-101) >= 2


def test_verdict_cache_is_keyed_by_contents_not_path(tmp_path, monkeypatch, tiny_model):
    monkeypatch.setenv(verdict_cache.CACHE_DIR_ENV, str(tmp_path / "cache"))
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in os.listdir(tiny_model):
        (copy / f).write_bytes(open(os.path.join(tiny_model, f), "rb").read())
    assert verdict_cache.model_fingerprint(copy) == verdict_cache.model_fingerprint(tiny_model)
    key = verdict_cache.key(verdict_cache.model_fingerprint(copy), "mepic", 8, gate.Thresholds(), {})
    assert verdict_cache.load(key) is None
    verdict = gate.judge("mepic", gate.Figures(8, 0.5, 0.01, 0.1, 128), gate.Thresholds())
    verdict_cache.store(key, verdict)
    assert verdict_cache.load(key) == verdict
    assert verdict_cache.load({**key, "mode": "epic-16"}) is None
    (copy / "config.json").write_text((copy / "config.json").read_text() + " ")
    assert verdict_cache.model_fingerprint(copy) != verdict_cache.model_fingerprint(tiny_model)


@pytest.mark.parametrize("args, message", [
    (["--questions", "0"], "--questions 0: give 1 to"),
    (["--questions", "100000"], "--questions 100000: give 1 to"),
    (["--mode", "bogus"], "--mode 'bogus': choose one of"),
    (["--min-top1", "1.5"], "--min-top1 '1.5': give a number between 0 and 1"),
    (["--max-kl", "-1"], "--max-kl '-1': give a number of nats >= 0"),
    (["--", "--port", "1"], "--port after `--`: the gate sets it itself"),
])
def test_bad_arguments_exit_2_with_a_clear_message(tiny_model, args, message):
    result = check_model("--model-path", tiny_model, *args)
    assert result.returncode == 2, result
    assert message in result.stderr


def test_missing_model_folder_exits_2(tmp_path):
    result = check_model("--model-path", str(tmp_path / "nowhere"))
    assert result.returncode == 2 and "not a local HF model folder" in result.stderr


def test_full_mode_has_nothing_to_check(tiny_model):
    result = check_model("--model-path", tiny_model, "--mode", "full")
    assert result.returncode == 0 and "nothing to check" in result.stdout


def test_verify_has_nothing_to_check_in_full_mode(tiny_model, monkeypatch, capsys):
    from sglang_mepic import config
    from sglang_mepic.gate import verify

    monkeypatch.setenv(config.MODE.env, "full")
    lines = []
    assert verify.verify(tiny_model, [], lines.append) is None
    assert "nothing to check" in lines[0]


def test_gate_server_drops_the_launch_address_and_key():
    from sglang_mepic.gate.verify import gate_server_args

    argv = ["--model-path", "m", "--host", "0.0.0.0", "--port=8000", "--api-key", "k", "--dtype", "float32"]
    assert gate_server_args(argv) == ["--dtype", "float32"]


def test_the_gate_runs_with_the_kv_dtype_the_server_will_use(tiny_model):
    """Issue 73: --mepic-verify's server gets the launch's --kv-cache-dtype, and a verdict for an fp8 cache is
    another verdict than one for the model's dtype (the key holds the server flags)."""
    from sglang_mepic.gate.verify import gate_server_args

    fp8 = gate_server_args(["--model-path", "m", "--port", "8000", "--kv-cache-dtype", "fp8_e5m2"])
    assert fp8 == ["--kv-cache-dtype", "fp8_e5m2"]
    fingerprint = verdict_cache.model_fingerprint(tiny_model)
    thresholds = gate.Thresholds()
    keys = [verdict_cache.key(fingerprint, "mepic", 8, thresholds, {"server_args": args}) for args in (fp8, [])]
    assert keys[0] != keys[1]
