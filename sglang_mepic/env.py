"""The MEPIC settings one process runs with: config.SETTINGS read from its environment once.

A process reads its `Settings` once, as it starts: the launcher once its flags are variables, a
scheduler when SGLang makes its radix cache and attention backend (cache_backend.build and
attention.backend.create hand them on), a tokenizer at its first request's hook. `settings()` is that
one reading; only `reload()` reads the environment again, where it was set after the process started
(the launcher, a model the accuracy gate refused, tests). SGLang's processes on CPU start by fork
and inherit the launcher's.
"""

import os
from dataclasses import dataclass
from typing import Any, Mapping

from sglang_mepic.config import (PREFILL_GRAPHS_OFF_ENV, REUSE_REFUSED_ENV, ROPE_TABLE_ENV, SETTINGS, SYNC_DEBUG_ENV,
                                  Placement, Setting, parse_sync_debug)
from sglang_mepic.modes import Kind, Mode

# "1": under TP, each prefill round's plan is hashed on every rank and compared; ranks that planned
# differently end the server with one log line (cache/round_digest.py). A debugging aid: no flag.
CHECK_RANKS_ENV = "SGLANG_MEPIC_CHECK_RANKS"


@dataclass(frozen=True)
class Settings:
    """Every setting's typed value in one process, read from its environment once (`Settings.from_env`)."""
    mode: Mode
    recompute_blocks: int | None   # None: every block (nothing shared)
    compile_sink: str              # what a standalone compile puts before the chunk: "bos" or "none"
    placement: Placement
    text_markup: bool              # <|chunk|> ... <|/chunk|> in text marks chunks; off, it is text
    host_tier_gb: float            # host memory for chunk KV evicted from the device pool (0: none)
    chunk_store: str               # epic-K: "pool" (a store in the KV pool) or "host" (host memory only)
    max_chunks: int                # most chunks one request may mark for reuse
    auto_chunk: str                # --mepic-auto-chunk as given ("messages+known", ...)
    known_texts_bytes: int         # the registered texts and their index, all namespaces together
    separator: str | None          # unchecked: auto_chunk.active_separator() checks it
    storage_backend: str | None    # the shared tier's HiCache backend; "file" where only a directory is given
    storage_dir: str | None
    storage_config: dict
    storage_timeout: float         # longest wait for a shared-tier read before it counts as a miss
    storage_secret: bytes | None   # authenticates shared-tier entries (HMAC-SHA256); None: checksums only
    verify: bool
    verify_questions: int | None   # None: the whole calibration set
    reuse_refused: str | None      # the mode --mepic-verify refused on this model (it then runs as full)
    # The GPU runs' switches (config.py): no flags
    rope_table: bool = False                    # the kernels read RoPE's table, not computed on chip
    prefill_graphs_off_file: str | None = None  # while this file exists, prefill graphs are declined
    sync_debug: str | None = None               # warn or error: per-batch calls watched for host syncs
    check_ranks: bool = False                   # under TP, each round's plan compared across the ranks

    @property
    def chat_chunking(self) -> str:
        """Which chat contents become chunks without markup (auto_chunk.py): off, messages or tools."""
        return self.auto_chunk.replace("+known", "").replace("known", "off")

    @property
    def known_texts(self) -> bool:
        """Whether registered documents are found in prompts without markup (known_texts.py)."""
        return "known" in self.auto_chunk

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Settings":
        environ = os.environ if environ is None else environ
        value = {setting.dest.removeprefix("mepic_"): _parsed(setting, environ) for setting in SETTINGS}
        value["known_texts_bytes"] = value.pop("known_texts_mb")
        value["storage_config"] = value["storage_config"] or {}
        value["verify"] = bool(value["verify"])
        if value["storage_backend"] is None and value["storage_dir"]:
            value["storage_backend"] = "file"
        if value["storage_backend"] == "file" and not value["storage_dir"]:
            raise ValueError("--mepic-storage-backend file needs --mepic-storage-dir")
        if value["chunk_store"] == "host" and (value["mode"].kind is not Kind.EPIC or value["host_tier_gb"] <= 0):
            raise ValueError(f"--mepic-chunk-store host: keeps the chunks epic-K copies in the host tier; it needs "
                             f"--mepic-mode epic-K and --mepic-host-tier-gb above 0 (here {value['mode'].name} and "
                             f"{value['host_tier_gb']:g} GB)")
        return cls(**value, reuse_refused=environ.get(REUSE_REFUSED_ENV) or None,
                   rope_table=environ.get(ROPE_TABLE_ENV) == "1",
                   prefill_graphs_off_file=environ.get(PREFILL_GRAPHS_OFF_ENV) or None,
                   sync_debug=parse_sync_debug(environ.get(SYNC_DEBUG_ENV)),
                   check_ranks=environ.get(CHECK_RANKS_ENV) == "1")


def _parsed(setting: Setting, environ: Mapping[str, str]) -> Any:
    """A setting's typed value: its variable if set and not empty, else its default; None where neither is."""
    text = setting.text(environ)
    if text is None:
        return None
    try:
        return setting.parse(text)
    except ValueError as e:
        # The flag names itself; a variable set by hand is named as well, since that is where to look.
        raise ValueError(f"{e} (from ${setting.env})" if setting.env in environ else str(e)) from None


_current: Settings | None = None


def settings() -> Settings:
    """This process's settings: read from its environment once, when it starts."""
    return _current or reload()


def reload() -> Settings:
    """Read them again, where the environment was set after the process started: the launcher once the flags
    are variables (a fork server's child runs the launcher), a model the gate refused, tests."""
    global _current
    _current = Settings.from_env()
    return _current
