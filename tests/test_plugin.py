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
