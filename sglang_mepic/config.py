"""MEPIC settings shared by every SGLang process: one table, each row a flag and a variable.

Each `Setting` row is a `--mepic-*` flag, the environment variable the launcher
turns it into (so the scheduler and tokenizer processes SGLang spawns read the
same value), its default, its check and its help. The launcher builds its
parser, the flag-to-environment split, the start-up line and the docs' flag
table from `SETTINGS`; each process reads it once into a frozen `Settings`
(env.py) and the parts take its typed fields. It imports only the mode's value
type (modes.py) of the package: the rules that belong to another part (the
separator's markup check, the calibration set's size) are added by the launcher.
"""

import enum
import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from sglang_mepic.modes import MODE_HELP, parse_mode


class Placement(enum.Enum):
    """Where a chunk's padding goes in its pages (layout.layout): the setting `--mepic-placement`."""
    LEADING = "leading"
    TRAILING = "trailing"




# The parsers: text (a flag's value or its environment variable) -> typed value, or ValueError naming the flag.

def parse_recompute_blocks(text: str) -> int | None:
    """Leading blocks of each chunk recomputed in mepic mode; None means all (nothing shared)."""
    text = text.strip().lower()
    if text == "all":
        return None
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise ValueError(f"--mepic-recompute-blocks {text!r}: give a whole number >= 1 or 'all' "
                     "(naive mode is the one that recomputes nothing)")


def _number(flag: str, text: str, ok: Callable[[float], bool], wanted: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value == value and value != float("inf") and ok(value)):
        raise ValueError(f"{flag} {text!r}: {wanted}")
    return value


def parse_gigabytes(text: str) -> float:
    return _number("--mepic-host-tier-gb", text, lambda v: v >= 0, "give a size in GB >= 0 (0 turns the host tier off)")


def parse_storage_config(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--mepic-storage-config is not JSON ({e})") from None
    if not isinstance(value, dict):
        raise ValueError("--mepic-storage-config must be a JSON object")
    return value


def parse_seconds(text: str) -> float:
    return _number("--mepic-storage-timeout", text, lambda v: v > 0, "give seconds > 0")


def parse_megabytes(text: str) -> int:
    """Megabytes (10^6 bytes), given as a positive number; returned as bytes."""
    value = _number("--mepic-known-texts-mb", text, lambda v: v > 0, "a positive number of megabytes")
    return int(value * 1_000_000)


def parse_max_chunks(text: str) -> int:
    text = text.strip()
    if not (text.isdigit() and int(text) >= 1):
        raise ValueError(f"--mepic-max-chunks {text!r}: give a whole number >= 1")
    return int(text)


def parse_questions(text: str, most: int | None = None) -> int:
    text = text.strip()
    if not (text.isdigit() and int(text) >= 1 and (most is None or int(text) <= most)):
        upto = f"from 1 to {most} (the calibration set's size)" if most else ">= 1"
        raise ValueError(f"--mepic-verify-questions {text!r}: give a whole number {upto}")
    return int(text)


def _one_of(flag: str, choices: tuple[str, ...], convert: Callable[[str], Any] = str) -> Callable[[str], Any]:
    def parse(text: str):
        if text not in choices:
            raise ValueError(f"{flag} {text!r}: choose from {list(choices)}")
        return convert(text)
    return parse


# The table.

@dataclass(frozen=True)
class Setting:
    """One `--mepic-*` setting: flag, environment variable, default, check, help, start-up display."""
    flag: str
    env: str
    default: str | None            # the text a missing flag means; None: unset
    parse: Callable[[str], Any]
    help: str                      # `--help` and the docs' flag table; "{...}" fields are filled by the launcher
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    switch: bool = False           # a flag without a value; set, its variable is "on"
    # The start-up line: "always", "storage" (when a shared tier is set), "storage-set" (a shared tier is set
    # and so is this), "file" (the file backend), "known" (known texts are on), "epic" (an epic-K mode),
    # "never" (the launcher adds it).
    shown: str = "always"
    secret: bool = False           # shown as "(set)", never the value
    see: str | None = None         # the docs page that tells more, linked from the docs' flag table

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    def text(self, environ: Mapping[str, str]) -> str | None:
        """The setting's text in `environ`: its variable if set and not empty, else its default."""
        return environ.get(self.env) or self.default


MODE = Setting(
    "--mepic-mode", "SGLANG_MEPIC_MODE", "mepic", parse_mode, metavar="MODE",
    help=f"how chunks are reused: {MODE_HELP}. Default: mepic.", see="modes.md")
RECOMPUTE_BLOCKS = Setting(
    "--mepic-recompute-blocks", "SGLANG_MEPIC_RECOMPUTE_BLOCKS", "1", parse_recompute_blocks, metavar="N|all",
    help="mepic mode: leading blocks (pages) of each chunk recomputed per request; 'all' recomputes every "
         "block and shares nothing. Default: 1.")


def _choice(flag: str, env: str, default: str, choices: tuple[str, ...], help: str, convert: Callable[[str], Any] = str,
            **more: Any) -> Setting:
    """A setting with a fixed set of values."""
    return Setting(flag, env, default, _one_of(flag, choices, convert), choices=choices, help=help, **more)


COMPILE_SINK = _choice(
    "--mepic-compile-sink", "SGLANG_MEPIC_COMPILE_SINK", "none", ("bos", "none"),
    help="what a chunk is compiled after: 'bos' (the model's BOS token, as an attention sink) or 'none' "
         "(the chunk alone). Default: none.")
PLACEMENT = _choice(
    "--mepic-placement", "SGLANG_MEPIC_PLACEMENT", Placement.TRAILING.value, tuple(p.value for p in Placement),
    help="where a chunk's pads go: 'leading' (as in the paper: the chunk ends on a page boundary) or "
         "'trailing' (its first block is all real tokens). Default: trailing.", convert=Placement)
TEXT_MARKUP = _choice(
    "--mepic-text-markup", "SGLANG_MEPIC_TEXT_MARKUP", "on", ("on", "off"), convert=lambda text: text == "on",
    help="'off': <|chunk|> ... <|/chunk|> in prompt text and chat messages is plain text (for users who type "
         "it); chunks are then marked by input_ids markers (-100/-101) or the frontend's chunk(). Default: on.")
HOST_TIER_GB = Setting(
    "--mepic-host-tier-gb", "SGLANG_MEPIC_HOST_TIER_GB", "0", parse_gigabytes, metavar="GB",
    help="host memory for chunk KV evicted from the device pool; a later use copies it back instead of "
         "compiling the chunk again. Default: 0 (no host tier).")
CHUNK_STORE = _choice(
    "--mepic-chunk-store", "SGLANG_MEPIC_CHUNK_STORE", "pool", ("pool", "host"),
    help="epic-K only: where the chunk KV that each request copies lives. 'pool': a chunk store in the KV pool "
         "(evictable), beside the copies; 'host': host memory only (--mepic-host-tier-gb), as EPIC on LMCache's CPU "
         "backend: each request loads its chunks straight into pages of its own, and the pool holds only the "
         "copies. Default: pool.", shown="epic", see="modes.md#where-epic-keeps-its-chunks")
MAX_CHUNKS = Setting(
    "--mepic-max-chunks", "SGLANG_MEPIC_MAX_CHUNKS", "64", parse_max_chunks, metavar="N",
    help="most chunks one request may mark for reuse (each absent one is a compile row in its batch); a "
         "request with more is refused with a 400. Default: 64.")
AUTO_CHUNK = _choice(
    "--mepic-auto-chunk", "SGLANG_MEPIC_AUTO_CHUNK", "off",
    ("off", "messages", "tools", "known", "messages+known", "tools+known"),
    help="reuse without markup. Chat requests: 'messages' makes every message content but the last user "
         "turn's a chunk, 'tools' only tool results and documents passed as text content parts (each text "
         "part followed by another), when at least {min_pages} pages long. 'known': in any prompt without "
         "markup (text, completions, chat), the documents registered with POST /mepic/chunks in the "
         "request's namespace are found by content and laid out as if marked; combine with '+'. Default: off.",
    see="chunks.md#using-it-from-an-unmodified-client")
KNOWN_TEXTS_MB = Setting(
    "--mepic-known-texts-mb", "SGLANG_MEPIC_KNOWN_TEXTS_MB", "64", parse_megabytes,
    metavar="MB", shown="known",
    help="memory the server may use for the texts registered for --mepic-auto-chunk known, all namespaces "
         "together: the texts (a byte a character for ASCII) and the index over them, every namespace's share "
         "included. A namespace's new texts push out its own least recently registered or found ones, "
         "never another's: texts that do not fit beside other namespaces' are refused (507). Default: 64.",
    see="chunks.md#using-it-from-an-unmodified-client")
SEPARATOR = Setting(
    "--mepic-separator", "SGLANG_MEPIC_SEPARATOR", None, str, metavar="STR",
    help="split text prompts (and chat message contents) into chunks on STR, as LMCache's CacheBlend does "
         "with blend_special_str (' # # ' there): instruction STR chunk STR ... STR question; STR never "
         "reaches the model. Default: none.")
STORAGE_BACKEND = Setting(
    "--mepic-storage-backend", "SGLANG_MEPIC_STORAGE_BACKEND", None, str, metavar="NAME", shown="never",
    help="shared chunk tier, one of SGLang HiCache's storage backends: every compiled chunk is written to it "
         "by hash (with the model fingerprint, length and checksum, checked on load), so other instances, or "
         "this one after a restart, reuse it. 'file' is a directory (--mepic-storage-dir); 'mooncake' is "
         "Mooncake Store, set up from --mepic-storage-config or Mooncake's own MOONCAKE_* environment; "
         "'dynamic' is a HiCacheStorage class of yours named in --mepic-storage-config (backend_name, "
         "module_path, class_name), as in SGLang; any other backend SGLang registers is used through its "
         "get/set/exists. A backend that is down or slow is a miss. Default: file when --mepic-storage-dir "
         "is given, else none.")
STORAGE_DIR = Setting(
    "--mepic-storage-dir", "SGLANG_MEPIC_STORAGE_DIR", None, str, metavar="DIR", shown="file",
    help="the file backend's directory (implies --mepic-storage-backend file). Default: none.")
STORAGE_CONFIG = Setting(
    "--mepic-storage-config", "SGLANG_MEPIC_STORAGE_CONFIG", None, parse_storage_config, metavar="JSON",
    shown="storage-set",
    help="the backend's extra_config, as SGLang's --hicache-storage-backend-extra-config. Mooncake: "
         "{{\"master_server_address\": \"HOST:PORT\", \"metadata_server\": \"http://HOST:PORT/metadata\", "
         "\"protocol\": \"tcp\", \"global_segment_size\": BYTES}} (launch_cluster writes it). Default: none.")
STORAGE_TIMEOUT = Setting(
    "--mepic-storage-timeout", "SGLANG_MEPIC_STORAGE_TIMEOUT", "0.5", parse_seconds, metavar="S", shown="storage",
    help="longest wait for a read from the shared tier before the chunk counts as a miss. Default: 0.5.")
STORAGE_SECRET = Setting(
    "--mepic-storage-secret", "SGLANG_MEPIC_STORAGE_SECRET", None, str.encode, metavar="SECRET",
    shown="storage-set", secret=True,
    help="authenticate shared-tier entries with HMAC-SHA256 under SECRET: an entry not written with it is a "
         "miss, so a writer without the secret cannot make this server load its KV. Also read from "
         "$SGLANG_MEPIC_STORAGE_SECRET (preferred: a flag shows in the process list). Default: none "
         "(entries are checksummed, not authenticated).", see="scale-out.md")
# `--mepic-verify` (gate/verify.py): the launcher runs the accuracy gate before serving.
VERIFY = Setting(
    "--mepic-verify", "SGLANG_MEPIC_VERIFY", None, lambda text: text == "on", switch=True, shown="never",
    help="before serving, run the accuracy gate (python -m sglang_mepic.check_model) for this model and mode "
         "on a server of its own; a model that fails is served as --mepic-mode full (reuse refused: said in "
         "the log, /server_info and /metrics). Verdicts are cached per model fingerprint, mode and settings "
         "(${cache_dir_env}, default ~/.cache/sglang-mepic), so a restart does not run it again. Default: off.",
    see="answers.md#is-my-model-a-good-fit")
VERIFY_QUESTIONS = Setting(
    "--mepic-verify-questions", "SGLANG_MEPIC_VERIFY_QUESTIONS", None, parse_questions, metavar="N",
    shown="never",
    help="calibration questions the gate runs for --mepic-verify (1-{questions}). Default: all {questions}.")

SETTINGS: tuple[Setting, ...] = (
    MODE, RECOMPUTE_BLOCKS, COMPILE_SINK, PLACEMENT, TEXT_MARKUP, HOST_TIER_GB, CHUNK_STORE, MAX_CHUNKS, AUTO_CHUNK,
    KNOWN_TEXTS_MB, SEPARATOR, STORAGE_BACKEND, STORAGE_DIR, STORAGE_CONFIG, STORAGE_TIMEOUT, STORAGE_SECRET, VERIFY,
    VERIFY_QUESTIONS)

# Not a flag: a mode the accuracy gate refused, named by the launcher for every process to report while
# the server runs as `full`.
REUSE_REFUSED_ENV = "SGLANG_MEPIC_REUSE_REFUSED"

# Not flags: the GPU runs' switches (eval/gpu), read into env.Settings with the rest (docs/flags.md).
ROPE_TABLE_ENV = "MEPIC_ROPE_TABLE"  # "1": the kernels read RoPE's cos/sin table, not computed on chip
PREFILL_GRAPHS_OFF_ENV = "MEPIC_PREFILL_GRAPHS_OFF_FILE"  # while this file exists, prefill graphs are declined
SYNC_DEBUG_ENV = "MEPIC_SYNC_DEBUG"  # warn or error: the backend's per-batch calls watched for host syncs


def parse_sync_debug(text: str | None) -> str | None:
    value = (text or "").strip().lower()
    if value in ("", "0", "off"):
        return None
    if value not in ("warn", "error"):
        raise ValueError(f"{SYNC_DEBUG_ENV}={value!r}: use one of warn, error (or leave it unset)")
    return value
