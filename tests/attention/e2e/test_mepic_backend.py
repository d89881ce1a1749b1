"""The mepic attention backend on a real server: without chunks it is SGLang's torch_native, token for token."""

import os

import pytest

from sglang_mepic.launch import defaults
from sglang_mepic.process.server_process import ServerProcess



def test_mepic_backend_equals_torch_native(servers, run_prompt_set):
    tiny_server = servers.get()
    assert "--attention-backend" not in tiny_server.args  # the launcher's default, mepic
    assert "mepic attention: NoPE keys" in tiny_server.log()
    cpus = len(os.sched_getaffinity(0))
    threads = defaults.CpuThreads.plan(tiny_server.env, cpus, cpus, 128)  # torch's own count: the cores
    line = (f"CPU scheduler: {threads.fewer} torch thread(s) for decodes and short extends, {threads.every} for an "
            "extend of") if threads else "CPU scheduler:"
    assert (line in tiny_server.log()) == (threads is not None)
    mepic_seq, mepic_conc = run_prompt_set(tiny_server)
    # Same cache as the launcher's default (mepic tree, page size 16), SGLang's own attention.
    native = servers.get("--attention-backend", "torch_native", "--radix-cache-backend", "mepic")
    native_seq, native_conc = run_prompt_set(native)
    assert mepic_seq == native_seq
    assert mepic_conc == native_conc
    assert any(cached > 0 for _, cached in mepic_seq)


def test_model_without_supported_rope_is_refused_at_startup(tmp_path, tiny_model):
    import json
    import shutil

    model = tmp_path / "gpt2ish"
    shutil.copytree(tiny_model, model)
    cfg = json.loads((model / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "dynamic", "factor": 2.0}
    (model / "config.json").write_text(json.dumps(cfg))
    server = ServerProcess(model, "--dtype", "float32")
    with pytest.raises(Exception) as err:
        server.start()
    assert "cannot rotate keys for DynamicNTKScalingRotaryEmbedding" in str(err.value)
