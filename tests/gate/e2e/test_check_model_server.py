"""The per-model accuracy gate: check_model's figures, verdicts and exit status, and --mepic-verify.

The tiny model is random, so reuse changes its predictions at chance and it must
fail; SmolLM2-135M-Instruct passes with the mepic mode (docs/answers.md, "Is my model a good fit?").
"""

import re

import pytest
import requests

from sglang_mepic.gate import verdict_cache
from sglang_mepic.process.server_process import ServerProcess
from support.check_model import check_model


QUESTIONS = "8"  # the tiny model is at chance on every question: a few show it


SMOLLM2_QUESTIONS = "16"


def test_tiny_random_model_fails(tiny_model):
    result = check_model("--model-path", tiny_model, "--questions", QUESTIONS)
    print(result.stdout)  # the figures, for `pytest -rA`
    assert result.returncode == 1, result.stdout + result.stderr
    assert "verdict: FAIL" in result.stdout
    assert re.search(r"top-1 agreement \(first token\)\s+0\.\d+", result.stdout)
    assert "check_model" in result.stderr  # the progress bar


@pytest.mark.slow
def test_smollm2_passes_with_mepic():
    from sglang_mepic.launch import models

    model = str(models.build(models.DEFAULT_MODEL))
    result = check_model("--model-path", model, "--questions", SMOLLM2_QUESTIONS)
    print(result.stdout)  # the figures, for `pytest -rA`
    assert result.returncode == 0, result.stdout + result.stderr
    assert "verdict: PASS" in result.stdout


@pytest.fixture(scope="module")
def verify_cache(tmp_path_factory):
    return {verdict_cache.CACHE_DIR_ENV: str(tmp_path_factory.mktemp("verdicts"))}


@pytest.fixture(scope="module")
def refused_server(tiny_model, verify_cache):
    """The tiny model launched with --mepic-verify: it fails the gate and serves as full."""
    with ServerProcess(tiny_model, "--mepic-verify", "--mepic-verify-questions", QUESTIONS, startup_timeout=900,
                       env=verify_cache) as server:
        yield server


def test_verify_refuses_reuse_and_says_so_in_the_log(refused_server):
    log = refused_server.log()
    assert "--mepic-verify: running the accuracy gate for mode mepic" in log
    assert "--mepic-verify: verdict: FAIL" in log
    assert "reuse refused for this model: mode mepic failed the accuracy gate, serving as --mepic-mode full" in log
    assert "--mepic-mode full" in log and "(reuse refused: --mepic-mode mepic failed" in log


def test_verify_refusal_in_server_info_and_metrics(refused_server):
    info = requests.get(refused_server.url + "/server_info", timeout=60).json()["internal_states"][0]["mepic"]
    assert info["mode"] == "full" and info["reuse_refused"] == "mepic"
    metrics = requests.get(refused_server.url + "/metrics", timeout=60).text
    assert re.search(r'^sglang_mepic:reuse_refused\{mode="mepic"\} 1\.0$', metrics, re.M), metrics
    r = requests.post(refused_server.url + "/generate", timeout=120, json={
        "text": "Read.\n<|chunk|>" + "word " * 40 + "<|/chunk|>\nQuestion: what?",
        "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
    assert r.status_code == 200 and r.json()["meta_info"].get("mepic_chunk_hits", 0) == 0


def test_verify_restart_uses_the_cached_verdict(refused_server, tiny_model, verify_cache):
    refused_server.stop()  # one server at a time on 2 cores
    with ServerProcess(tiny_model, "--mepic-verify", "--mepic-verify-questions", QUESTIONS, startup_timeout=900,
                       env=verify_cache) as server:
        log = server.log()
        assert "--mepic-verify: cached verdict used for this model" in log
        assert "running the accuracy gate" not in log
        info = requests.get(server.url + "/server_info", timeout=60).json()["internal_states"][0]["mepic"]
        assert info["mode"] == "full" and info["reuse_refused"] == "mepic"
