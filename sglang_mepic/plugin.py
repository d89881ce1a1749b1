"""SGLang plugin entry point (group `sglang.srt.plugins`).

SGLang calls `register()` early in every process it starts (server, scheduler,
detokenizer). Backends and hooks are registered here so they exist wherever
SGLang looks them up.
"""

import logging

from sglang_mepic import SGLANG_VERSION

logger = logging.getLogger(__name__)
_registered = False


def check_sglang_version() -> str:
    import sglang

    if sglang.__version__ != SGLANG_VERSION:
        raise RuntimeError(
            f"sglang-mepic was written for sglang {SGLANG_VERSION}, "
            f"but sglang {sglang.__version__} is installed"
        )
    return sglang.__version__


def check_one_checkout() -> None:
    """Refuse hooks and kernels from another checkout than the package's.

    An editable install maps `sglang_mepic.patches` and `sglang_mepic.kernels` to the checkout it
    was made from; with `PYTHONPATH` set to another checkout (a git worktree) the package would come
    from one tree and its hooks from the other, and a hook importing a module the other tree lacks
    would leave the server running without MEPIC's hooks. One checkout, or none at all."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for part in ("patches", "kernels"):
        if not (root / part).is_dir():
            continue  # an installed wheel: its parts live inside the package
        spec = importlib.util.find_spec(f"sglang_mepic.{part}")
        found = Path(spec.origin).resolve().parent if spec is not None and spec.origin else None
        if found != root / part:
            raise ImportError(f"sglang_mepic is loaded from {root}, but sglang_mepic.{part} from {found}: run from "
                              "the checkout the environment is installed from, or install this one (pip install -e .)")


def register() -> None:
    global _registered
    if _registered:
        return
    version = check_sglang_version()
    check_one_checkout()
    from sglang_mepic.launch import quiet

    quiet.install_from_env()  # the launcher's log filters, in this process too

    from sglang.srt.arg_groups.choices import add_attention_backend_choices
    from sglang.srt.layers.attention.attention_registry import register_attention_backend
    from sglang.srt.mem_cache.registry import register_radix_cache_backend

    from sglang_mepic.attention import backend
    from sglang_mepic.cache import cache_backend
    from sglang_mepic.patches import register_all

    register_radix_cache_backend(cache_backend.BACKEND_NAME, cache_backend.build)
    add_attention_backend_choices([backend.BACKEND_NAME])
    register_attention_backend(backend.BACKEND_NAME)(backend.create)
    register_all(version)
    _registered = True
    logger.debug("sglang-mepic plugin registered")
