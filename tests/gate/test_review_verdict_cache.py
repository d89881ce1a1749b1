"""Review: a verdict file is shared storage, so what it says is not taken on trust.

`--mepic-verify` serves with reuse on when the cached verdict passes. A record whose
figures fail the key's thresholds must not pass because its `failures` list is empty,
and a record another user wrote (or could have rewritten) must not be used at all:
the gate then runs again, which costs time, never accuracy.
"""

import json
import os

import pytest

from sglang_mepic.gate import verdict as gate
from sglang_mepic.gate import verdict_cache
from sglang_mepic.tiers import weights

FAILING = gate.Figures(questions=8, top1=0.1, kl=3.0, prefix=0.0, positions=128)


@pytest.fixture
def key(tmp_path, monkeypatch):
    monkeypatch.setenv(verdict_cache.CACHE_DIR_ENV, str(tmp_path / "cache"))
    return verdict_cache.key("f" * 32, "mepic", 8, gate.Thresholds(), {"server_args": []})


def _rewrite(path, **changes):
    record = json.loads(path.read_text())
    record.update(changes)
    path.write_text(json.dumps(record))


def test_a_record_claiming_a_pass_for_failing_figures_is_judged_again(key):
    path = verdict_cache.store(key, gate.judge("mepic", FAILING, gate.Thresholds()))
    assert not verdict_cache.load(key).passed
    _rewrite(path, failures=[])  # the figures still fail
    loaded = verdict_cache.load(key)
    assert loaded is None or not loaded.passed, loaded
    _rewrite(path, failures=[], thresholds={"min_top1": 0.0, "max_kl": 100.0, "min_prefix": 0.0})
    loaded = verdict_cache.load(key)  # the key's thresholds judge, not the record's
    assert loaded is None or not loaded.passed, loaded


def test_a_record_for_another_mode_is_not_used(key):
    path = verdict_cache.store(key, gate.judge("mepic", gate.Figures(8, 1.0, 0.0, 1.0, 128), gate.Thresholds()))
    _rewrite(path, mode="epic-16")
    loaded = verdict_cache.load(key)
    assert loaded is None or loaded.mode == "mepic"


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX file modes")
def test_a_record_others_may_write_is_not_used(key):
    passing = gate.judge("mepic", gate.Figures(8, 1.0, 0.0, 1.0, 128), gate.Thresholds())
    path = verdict_cache.store(key, passing)
    assert path.stat().st_mode & 0o022 == 0  # written for its owner alone
    assert verdict_cache.load(key) == passing
    for mode in (0o666, 0o646):
        path.chmod(mode)
        assert verdict_cache.load(key) is None, oct(mode)


def test_changed_bytes_anywhere_in_a_weight_file_change_the_fingerprint(tmp_path):
    """A fine-tune may change a few MiB in the middle of a large shard: every byte is hashed."""
    model = tmp_path / "model"
    model.mkdir()
    data = bytearray(os.urandom(3 * weights.BLOCK + 12345))
    (model / "model.safetensors").write_bytes(data)
    before = verdict_cache.model_fingerprint(model)
    data[len(data) // 2 + 7] ^= 1
    (model / "model.safetensors").write_bytes(data)
    assert verdict_cache.model_fingerprint(model) != before


def test_the_key_names_the_code_that_measured_it(key):
    """A verdict measured before a change to how KV is reused is not taken after it."""
    assert key["code"] == verdict_cache.code_fingerprint() and len(key["code"]) == 16


def test_stored_chunk_keys_follow_the_weights_not_only_the_path(tmp_path):
    """Chunk KV in storage outlives the process: weights saved over the same folder must key apart."""
    from types import SimpleNamespace

    from sglang_mepic.cache import cache_backend

    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"\0" * 1000)
    model_config = SimpleNamespace(model_path=str(model), revision=None, dtype="float32", hf_config=None)
    before = cache_backend.model_fingerprint(model_config, stored=True)  # a storage backend is set
    (model / "model.safetensors").write_bytes(b"\1" + b"\0" * 999)
    assert cache_backend.model_fingerprint(model_config, stored=True) != before


def test_stored_chunk_keys_follow_the_kv_scales_file(tmp_path):
    """Issue 73: an fp8 cache is stored divided by the layers' scales; SGLang's --quantization-param-path file
    gives them. Two servers of one model with other scales files must not read each other's entries."""
    from types import SimpleNamespace

    from sglang_mepic.cache import cache_backend

    (tmp_path / "model").mkdir()
    model_config = SimpleNamespace(model_path=str(tmp_path / "model"), revision=None, dtype="bfloat16", hf_config=None)
    scales = tmp_path / "kv_scales.json"
    scales.write_text('{"kv_cache": {"scaling_factor": {"0": {"0": 0.5}}}}')
    first = cache_backend.model_fingerprint(model_config, str(scales), stored=True)
    scales.write_text('{"kv_cache": {"scaling_factor": {"0": {"0": 0.25}}}}')
    assert cache_backend.model_fingerprint(model_config, str(scales), stored=True) != first
    assert cache_backend.model_fingerprint(model_config, stored=True) not in (first, cache_backend.model_fingerprint(
        model_config, str(scales), stored=True))
