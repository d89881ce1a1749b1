"""SGLang's known start-up noise, summarised in one line.

A CPU start-up printed ~25 KB before the first request: the whole resolved
`server_args=` dict, the same CUDA-only UserWarnings once per process, a line
per model module that needs CUDA kernels, and `/v1/responses disabled`. None of
it is actionable on a CPU. The launcher hides it (`--log-level debug` keeps
everything) and says so in one line; other warnings are untouched.

Filters sit on the loggers that emit the lines, so SGLang's own logging set-up
(which replaces the root handlers) keeps them. Child processes get them from
the plugin, which SGLang loads in every process, and the warning filters from
PYTHONWARNINGS, read before their imports warn.
"""

import logging
import os
import warnings

ENV = "SGLANG_MEPIC_QUIET"  # "cpu": CPU-only notices hidden too; "args": only server_args shortened

# (logger, message prefix) of log lines that are expected on a CPU-only install.
CPU_LOG_LINES = (
    ("sglang.srt.models.registry", "Ignore import error when loading"),
    ("sglang.srt.managers.multimodal_processor", "Ignore import error when loading"),
    ("sglang.srt.entrypoints.http_server", "OpenAI Responses API (/v1/responses) disabled"),
)
# UserWarning prefixes from SGLang modules imported on a machine without CUDA.
CPU_WARNINGS = ("Only CUDA", "Triton is not supported on current platform")
SERVER_ARGS_LOGGER = "sglang.srt.entrypoints.engine"

SUMMARY = ("on CPU, SGLang's CUDA-only notices are hidden (quantization warnings, model modules that need "
           "CUDA kernels, /v1/responses without openai_harmony); --log-level debug shows them")


class _Drop(logging.Filter):
    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


class _ShortServerArgs(logging.Filter):
    """The resolved settings (~20 KB) become the command line they came from.

    SGLang's dict never held the MEPIC settings (the launcher consumes the --mepic-*
    flags), so the line names them too, defaults included: that is where a reader
    looks to learn what the server runs with."""

    def __init__(self, argv: str, mepic: str | None = None):
        super().__init__()
        self.argv = argv
        self.mepic = mepic

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith("server_args="):
            shown = self.argv if self.mepic is None else f"{self.argv}; sglang-mepic: {self.mepic}"
            record.msg, record.args = "server_args: %s (every resolved setting: --log-level debug)", (shown,)
        return True


def install(cpu: bool, argv: str | None = None, mepic: str | None = None) -> None:
    """Filters for this process (idempotent per logger). mepic: the effective MEPIC settings."""
    if argv is not None:
        _add(SERVER_ARGS_LOGGER, _ShortServerArgs(argv, mepic))
    if cpu:
        for name, prefix in CPU_LOG_LINES:
            _add(name, _Drop(prefix))
        for prefix in CPU_WARNINGS:
            warnings.filterwarnings("ignore", message=prefix, category=UserWarning)


def _add(name: str, new: logging.Filter) -> None:
    logger = logging.getLogger(name)
    if not any(type(f) is type(new) and vars(f) == vars(new) for f in logger.filters):
        logger.addFilter(new)


def for_children(cpu: bool) -> None:
    """Pass the CPU filters on to the processes SGLang starts."""
    os.environ[ENV] = "cpu" if cpu else "args"
    if cpu:
        ours = ",".join(f"ignore:{prefix}:UserWarning" for prefix in CPU_WARNINGS)
        os.environ["PYTHONWARNINGS"] = ",".join(filter(None, (os.environ.get("PYTHONWARNINGS"), ours)))


def install_from_env() -> None:
    """In a process SGLang started: the filters its launcher chose."""
    mode = os.environ.get(ENV)
    if mode:
        install(cpu=mode == "cpu")
