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


def register() -> None:
    global _registered
    if _registered:
        return
    version = check_sglang_version()
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
