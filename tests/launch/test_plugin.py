from importlib.metadata import entry_points

import sglang

from sglang_mepic import SGLANG_VERSION, plugin


def test_plugin_entry_point_is_declared_and_loads():
    eps = {ep.name: ep for ep in entry_points(group="sglang.srt.plugins")}
    assert "mepic" in eps
    assert eps["mepic"].load() is plugin.register


def test_pinned_sglang_version():
    assert sglang.__version__ == SGLANG_VERSION
    plugin.register()


def test_kernels_and_patches_live_inside_the_package():
    import importlib.util

    import sglang_mepic.kernels
    import sglang_mepic.patches

    assert sglang_mepic.kernels.__file__.endswith("kernels/__init__.py")
    assert sglang_mepic.patches.__file__.endswith("patches/__init__.py")
    spec = importlib.util.find_spec("kernels")
    # Either absent or a real third-party package, never our folder.
    assert spec is None or spec.origin != sglang_mepic.kernels.__file__


def test_a_cpu_server_starts_its_children_by_fork_and_a_gpu_server_by_spawn():
    # SGLang forces spawn; on CPU a spawned child re-imports SGLang, torch and transformers (about 19 s).
    import multiprocessing as mp
    from types import SimpleNamespace

    from sglang_mepic.patches.launcher import engine_set_envs_and_config as patch

    def sglang_sets_spawn(server_args):
        mp.set_start_method("spawn", force=True)

    before = mp.get_start_method(allow_none=True)
    try:
        patch.hook(sglang_sets_spawn, SimpleNamespace(device="cpu"))
        assert mp.get_start_method() == "fork"
        patch.hook(sglang_sets_spawn, SimpleNamespace(device="cuda"))
        assert mp.get_start_method() == "spawn"
    finally:
        mp.set_start_method(before, force=True)


def test_the_cpu_gets_an_fp8_e5m2_pool_under_mepic_only():
    """SGLang 0.5.23 refuses fp8_e5m2 on the CPU: under the mepic backend alone the hook gives the pool SGLang
    builds for the flag on a GPU; any other backend, a draft worker or another dtype meets SGLang's own answer."""
    from unittest import mock

    import torch

    from sglang_mepic.patches.scheduler import kv_cache_dtype_configure_kv_cache_dtype as patch

    def sglang(**kwargs):
        return "sglang's", kwargs["server_args_kv_cache_dtype"]

    def hooked(backends, **kwargs):
        with mock.patch("sglang.srt.runtime_context.attention_backends", return_value=backends):
            return patch.hook(sglang, **{"server_args_kv_cache_dtype": "fp8_e5m2", "is_draft_worker": False,
                                         **kwargs})

    assert hooked(("mepic", "mepic")) == (None, torch.float8_e5m2)
    assert hooked(("torch_native", "torch_native")) == ("sglang's", "fp8_e5m2")
    assert hooked(("mepic", "torch_native")) == ("sglang's", "fp8_e5m2")
    assert hooked(("mepic", "mepic"), is_draft_worker=True) == ("sglang's", "fp8_e5m2")
    assert hooked(("mepic", "mepic"), server_args_kv_cache_dtype="fp8_e4m3") == ("sglang's", "fp8_e4m3")
