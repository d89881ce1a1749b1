"""SGLang plugin entry point (group `sglang.srt.plugins`).

SGLang calls `register()` early in every process it starts (server, scheduler,
detokenizer). Backends and hooks are registered here so they exist wherever
SGLang looks them up.
"""

import logging

from sglang_mepic import SGLANG_VERSION

logger = logging.getLogger(__name__)


def check_sglang_version() -> str:
    import sglang

    if sglang.__version__ != SGLANG_VERSION:
        raise RuntimeError(
            f"sglang-mepic was written for sglang {SGLANG_VERSION}, "
            f"but sglang {sglang.__version__} is installed"
        )
    return sglang.__version__


def register() -> None:
    check_sglang_version()
    logger.debug("sglang-mepic plugin loaded")
