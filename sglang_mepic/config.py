"""MEPIC settings shared by every SGLang process.

The launcher turns `--mepic-*` flags into these environment variables, so the
scheduler and tokenizer processes SGLang spawns read the same values.
"""

import enum
import json
import os
import re
from dataclasses import dataclass



class Placement(enum.Enum):
    """Where a chunk's padding goes in its pages (segments.layout): the setting `--mepic-placement`."""
    LEADING = "leading"
    TRAILING = "trailing"


PLACEMENT_ENV = "SGLANG_MEPIC_PLACEMENT"
MODE_ENV = "SGLANG_MEPIC_MODE"
RECOMPUTE_ENV = "SGLANG_MEPIC_RECOMPUTE_BLOCKS"
SINK_ENV = "SGLANG_MEPIC_COMPILE_SINK"
TEXT_MARKUP_ENV = "SGLANG_MEPIC_TEXT_MARKUP"
HOST_TIER_ENV = "SGLANG_MEPIC_HOST_TIER_GB"
STORAGE_ENV = "SGLANG_MEPIC_STORAGE_DIR"
STORAGE_BACKEND_ENV = "SGLANG_MEPIC_STORAGE_BACKEND"
STORAGE_CONFIG_ENV = "SGLANG_MEPIC_STORAGE_CONFIG"
STORAGE_TIMEOUT_ENV = "SGLANG_MEPIC_STORAGE_TIMEOUT"
STORAGE_SECRET_ENV = "SGLANG_MEPIC_STORAGE_SECRET"
MAX_CHUNKS_ENV = "SGLANG_MEPIC_MAX_CHUNKS"
AUTO_CHUNK_ENV = "SGLANG_MEPIC_AUTO_CHUNK"
SEPARATOR_ENV = "SGLANG_MEPIC_SEPARATOR"
AUTO_CHUNKS = ("off", "messages", "tools")
DEFAULT_AUTO_CHUNK = "off"
DEFAULT_MAX_CHUNKS = 64
DEFAULT_STORAGE_TIMEOUT = 0.5
SINKS = ("bos", "none")
DEFAULT_SINK = "none"
DEFAULT_TEXT_MARKUP = "on"
TEXT_MARKUP = ("on", "off")
DEFAULT_PLACEMENT = Placement.TRAILING
DEFAULT_MODE = "mepic"
DEFAULT_RECOMPUTE_BLOCKS = 1
# `--mepic-verify` (verify.py): the launcher runs the accuracy gate before serving; a mode the
# gate refused is named here for every process to report, while the server runs as `full`.
VERIFY_ENV = "SGLANG_MEPIC_VERIFY"
VERIFY_QUESTIONS_ENV = "SGLANG_MEPIC_VERIFY_QUESTIONS"
REUSE_REFUSED_ENV = "SGLANG_MEPIC_REUSE_REFUSED"


class Kind(enum.Enum):
    FULL = "full"              # no chunk reuse; SGLang's prefix cache only
    NAIVE = "naive"            # shared chunk KV, nothing recomputed
    EPIC = "epic"              # first k tokens (whole pages) recomputed, private copy per request
    CACHEBLEND = "cacheblend"  # fraction r with the largest KV deviation recomputed, private copy
    MEPIC = "mepic"            # first block(s) recomputed, canonical pages shared


@dataclass(frozen=True)
class Mode:
    kind: Kind
    tokens: int = 0            # epic-k: leading tokens of each chunk recomputed
    ratio: float = 0.0         # cacheblend-r: fraction of chunk tokens recomputed
    # cacheblend: the layer whose KV deviation selects tokens. Layer 1, as LMCache's CacheBlend
    # (LMCACHE_BLEND_CHECK_LAYERS=1): layer 0's NoPE KV depends on the token alone, so its deviation is 0.
    check_layer: int = 1

    @property
    def name(self) -> str:
        if self.kind is Kind.EPIC:
            return f"epic-{self.tokens}"
        if self.kind is Kind.CACHEBLEND:
            return f"cacheblend-{self.ratio:g}"
        return self.kind.value

    @property
    def shares(self) -> bool:
        """Requests read the chunk store's pages in place (no private copy)."""
        return self.kind in (Kind.NAIVE, Kind.MEPIC)

    @property
    def reuses(self) -> bool:
        return self.kind is not Kind.FULL


MODE_HELP = "full | naive | mepic | epic-K (K tokens, e.g. epic-16) | cacheblend-R (fraction, e.g. cacheblend-0.15)"


def parse_mode(text: str) -> Mode:
    text = text.strip().lower()
    for kind in (Kind.FULL, Kind.NAIVE, Kind.MEPIC):
        if text == kind.value:
            return Mode(kind)
    m = re.fullmatch(r"epic-(\d+)", text)
    if m and int(m.group(1)) >= 1:
        return Mode(Kind.EPIC, tokens=int(m.group(1)))
    m = re.fullmatch(r"cacheblend-(0?\.\d+|1(\.0*)?|0)", text)
    if m and 0 < float(m.group(1)) <= 1:
        return Mode(Kind.CACHEBLEND, ratio=float(m.group(1)))
    raise ValueError(f"--mepic-mode {text!r}: choose one of {MODE_HELP}")


def parse_recompute_blocks(text: str) -> int | None:
    """Leading blocks of each chunk recomputed in mepic mode; None means all (nothing shared)."""
    text = text.strip().lower()
    if text == "all":
        return None
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise ValueError(f"--mepic-recompute-blocks {text!r}: give a whole number >= 1 or 'all' "
                     "(naive mode is the one that recomputes nothing)")


def placement() -> Placement:
    return Placement(_choice(PLACEMENT_ENV, DEFAULT_PLACEMENT.value, [p.value for p in Placement]))


def mode() -> Mode:
    return parse_mode(os.environ.get(MODE_ENV, DEFAULT_MODE))


def recompute_blocks() -> int | None:
    return parse_recompute_blocks(os.environ.get(RECOMPUTE_ENV, str(DEFAULT_RECOMPUTE_BLOCKS)))


def text_markup() -> bool:
    """Whether `<|chunk|>` ... `<|/chunk|>` in text marks chunks; off, it is text like any other
    (chunks are then marked only by input_ids markers, kv_hints or the frontend's `chunk()`)."""
    return _choice(TEXT_MARKUP_ENV, DEFAULT_TEXT_MARKUP, TEXT_MARKUP) == "on"


def _choice(env: str, default: str, choices) -> str:
    """A setting with a fixed set of values, checked where it is read."""
    value = os.environ.get(env, default)
    if value not in choices:
        raise ValueError(f"{env}={value!r}: choose from {list(choices)}")
    return value


def compile_sink() -> str:
    """What a standalone compile puts before the chunk: the model's BOS as an attention sink, or nothing."""
    return _choice(SINK_ENV, DEFAULT_SINK, SINKS)


def parse_gigabytes(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"--mepic-host-tier-gb {text!r}: give a size in GB >= 0 (0 turns the host tier off)")
    return value


def host_tier_gb() -> float:
    """Host memory for chunk KV evicted from the device pool (0: none)."""
    return parse_gigabytes(os.environ.get(HOST_TIER_ENV, "0"))


def storage_dir() -> str | None:
    """Directory of the `file` storage backend, shared by server instances."""
    return os.environ.get(STORAGE_ENV) or None


def storage_backend() -> str | None:
    """The HiCache storage backend of the shared chunk tier (None: no shared tier)."""
    name = os.environ.get(STORAGE_BACKEND_ENV) or ("file" if storage_dir() else None)
    if name == "file" and not storage_dir():
        raise ValueError("--mepic-storage-backend file needs --mepic-storage-dir")
    return name


def parse_storage_config(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--mepic-storage-config is not JSON ({e})") from None
    if not isinstance(value, dict):
        raise ValueError("--mepic-storage-config must be a JSON object")
    return value


def storage_config() -> dict:
    """The backend's extra_config (SGLang's --hicache-storage-backend-extra-config)."""
    return parse_storage_config(os.environ.get(STORAGE_CONFIG_ENV) or "{}")


def parse_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise ValueError(f"--mepic-storage-timeout {text!r}: give seconds > 0")
    return value


def storage_timeout() -> float:
    """How long a read from shared storage may take before it counts as a miss."""
    return parse_seconds(os.environ.get(STORAGE_TIMEOUT_ENV) or str(DEFAULT_STORAGE_TIMEOUT))


def storage_secret() -> bytes | None:
    """The key that authenticates shared-storage entries (HMAC-SHA256); None: entries are not authenticated."""
    value = os.environ.get(STORAGE_SECRET_ENV)
    return value.encode() if value else None


def parse_max_chunks(text: str) -> int:
    text = text.strip()
    if not (text.isdigit() and int(text) >= 1):
        raise ValueError(f"--mepic-max-chunks {text!r}: give a whole number >= 1")
    return int(text)


def max_chunks() -> int:
    """Most chunks one request may mark for reuse: each absent one is a compile row in its batch."""
    return parse_max_chunks(os.environ.get(MAX_CHUNKS_ENV) or str(DEFAULT_MAX_CHUNKS))


def verify() -> bool:
    return os.environ.get(VERIFY_ENV, "") == "on"


def parse_questions(text: str, most: int) -> int:
    text = text.strip()
    if not (text.isdigit() and 1 <= int(text) <= most):
        raise ValueError(f"--mepic-verify-questions {text!r}: give a whole number from 1 to {most} "
                         "(the calibration set's size)")
    return int(text)


def reuse_refused() -> str | None:
    """The mode the accuracy gate refused for this model (the server then runs as `full`), or None."""
    return os.environ.get(REUSE_REFUSED_ENV) or None


def canonical_from() -> int | None:
    """Index of a chunk's first page that the chunk store keeps (None: the store keeps nothing).

    Shared modes keep the pages they do not recompute; private-copy modes keep the whole
    chunk, since which tokens they patch is decided per request.
    """
    m = mode()
    if m.kind is Kind.FULL:
        return None
    if m.kind is Kind.MEPIC:
        return recompute_blocks()
    return 0


def auto_chunk() -> str:
    """Which chat contents become chunks without markup (auto_chunk.py): off, messages or tools."""
    return _choice(AUTO_CHUNK_ENV, DEFAULT_AUTO_CHUNK, AUTO_CHUNKS)


def separator() -> str | None:
    """The separator as set, or None (text is split only by markup); auto_chunk.separator() is the
    checked value its users read."""
    return os.environ.get(SEPARATOR_ENV)
