"""The --mepic-* flags, one per row of config.SETTINGS: parsed out of argv into the environment every SGLang
process reads, checked where a row's check belongs to another part, and shown back on the start-up line."""

import argparse
import os
from typing import Any, Callable

from sglang_mepic import config, env, modes
from sglang_mepic.frontend import auto_chunk
from sglang_mepic.gate import calibration, verdict_cache, verify
from sglang_mepic.launch.sglang_flags import LaunchError, Parser, known_flags


def _rules() -> dict[config.Setting, Callable[[str], Any]]:
    """The checks that belong to another part than config (which imports nothing of the package)."""
    return {config.SEPARATOR: auto_chunk.parse_separator,
            config.VERIFY_QUESTIONS: lambda text: config.parse_questions(text, calibration.size())}


def help_fields() -> dict[str, object]:
    """What the settings' help texts name from other parts."""
    return {"min_pages": auto_chunk.MIN_PAGES, "questions": calibration.size(),
            "cache_dir_env": verdict_cache.CACHE_DIR_ENV}


def mepic_parser() -> argparse.ArgumentParser:
    """The --mepic-* flags, one per row of config.SETTINGS."""
    p = Parser(add_help=False, allow_abbrev=False)
    g = p.add_argument_group("sglang-mepic options (consumed here, not passed to SGLang)")
    rules, fields = _rules(), help_fields()
    for setting in config.SETTINGS:
        text = setting.help.format(**fields)
        if setting.switch:
            g.add_argument(setting.flag, action="store_true", default=None, help=text)
        elif setting.choices:
            g.add_argument(setting.flag, choices=setting.choices, default=None, help=text)
        else:
            g.add_argument(setting.flag, type=_checked(rules.get(setting, setting.parse)), default=None,
                           metavar=setting.metavar, help=text)
    return p


def _shown(setting: config.Setting, backend: str | None, settings: env.Settings) -> bool:
    """Whether the start-up line names a setting: the shared tier's only where one is set."""
    return {"always": True, "never": False, "file": backend == "file", "storage": backend is not None,
            "storage-set": backend is not None and bool(os.environ.get(setting.env)),
            "known": settings.known_texts, "epic": settings.mode.kind is modes.Kind.EPIC}[setting.shown]


def _display(setting: config.Setting) -> str:
    """A setting's value on the start-up line, as a flag would give it."""
    if setting.secret:
        return "(set)"
    if setting is config.SEPARATOR:
        separator = auto_chunk.active_separator()
        return "none" if separator is None else repr(separator)
    text = setting.text(os.environ)  # as the flag gave it (the launcher set the variable)
    assert text is not None  # a setting without a default is shown only where it is set (_shown)
    if setting in (config.KNOWN_TEXTS_MB, config.RECOMPUTE_BLOCKS, config.TEXT_MARKUP):  # a count, 'all', on/off
        return text
    if setting is config.STORAGE_CONFIG:  # JSON, as given
        return f"'{text}'"
    value = setting.parse(text)
    if isinstance(value, modes.Mode):
        return value.name
    if isinstance(value, float):
        return f"{value:g}"
    return str(getattr(value, "value", value))


def mepic_settings(argv: list[str]) -> str:
    """The MEPIC settings the server runs with, defaults included, as the flags that set them.

    Read back from the environment the --mepic-* flags became (what every SGLang
    process reads), and from argv after `with_defaults`; a note says when chunks are
    not reused at all, since the flags then change nothing."""
    settings = env.settings()
    backend = settings.storage_backend
    shown = []
    for setting in config.SETTINGS:
        if setting is config.STORAGE_BACKEND:
            shown.append(f"{setting.flag} {backend or 'none'}")
        elif _shown(setting, backend, settings):
            shown.append(f"{setting.flag} {_display(setting)}")
    line = " ".join(shown)
    if settings.verify:
        line += f" --mepic-verify --mepic-verify-questions {verify.questions()}"
    if settings.reuse_refused:
        line += f" (reuse refused: --mepic-mode {settings.reuse_refused} failed the accuracy gate on this model)"
    known = known_flags(argv)
    if (known.attention_backend, known.radix_cache_backend) != ("mepic", "mepic"):
        line += (" (chunks are not reused: that needs --attention-backend mepic and --radix-cache-backend mepic; "
                 "markers are still removed)")
    elif not settings.mode.reuses:
        line += " (full mode: chunks are computed in context, never reused)"
    return line


def _checked(parse: Callable[[str], Any]) -> Callable[[str], str]:
    """An argparse type that keeps the text but rejects what `parse` rejects, with its message."""
    def check(text: str) -> str:
        try:
            parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return text
    return check


def split_mepic_flags(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """Remove the --mepic-* flags from argv and return them as environment settings."""
    known, rest = mepic_parser().parse_known_args(argv)
    variables: dict[str, str] = {}
    for setting in config.SETTINGS:
        value = getattr(known, setting.dest)
        if value is None or value is False:
            continue
        if setting is config.STORAGE_DIR:
            value = check_storage_dir(value)
        variables[setting.env] = "on" if setting.switch else value
    check_storage(known.mepic_storage_backend or ("file" if known.mepic_storage_dir else None), known)
    try:  # the rules between settings (env.Settings.from_env), over the variables already set too
        env.Settings.from_env({**os.environ, **variables})
    except ValueError as e:
        raise LaunchError(str(e)) from None
    return rest, variables


def check_storage(backend: str | None, known: argparse.Namespace) -> None:
    """Refuse a shared tier that cannot work, before anything heavy loads."""
    if backend is None:
        if known.mepic_storage_config or known.mepic_storage_timeout or known.mepic_storage_secret:
            raise LaunchError("--mepic-storage-config, --mepic-storage-timeout and --mepic-storage-secret need "
                              "--mepic-storage-backend")
        return
    from sglang_mepic.tiers import backends

    usable = [b for b in backends.backends() if b not in backends.NO_BYTES]
    if backend not in usable:
        raise LaunchError(f"--mepic-storage-backend {backend}: "
                          + ("it keeps no KV bytes (a stand-in of SGLang's)" if backend in backends.NO_BYTES
                             else "SGLang has no such storage backend")
                          + f"; choose one of {', '.join(usable)}")
    try:
        backends.importable(backend)
    except ImportError as e:
        raise LaunchError(f"--mepic-storage-backend {backend}: {e}") from None
    if backend == "dynamic":
        extra = config.parse_storage_config(known.mepic_storage_config or "{}")
        missing = [f for f in ("backend_name", "module_path", "class_name") if f not in extra]
        if missing:
            raise LaunchError(f"--mepic-storage-backend dynamic needs {', '.join(missing)} in --mepic-storage-config "
                              "(the HiCacheStorage class to make, as in SGLang's dynamic backend)")
    if backend != "file" and known.mepic_storage_dir:
        raise LaunchError(f"--mepic-storage-dir is the file backend's; {backend} is set up by --mepic-storage-config")
    if backend == "file" and not known.mepic_storage_dir:
        raise LaunchError("--mepic-storage-backend file needs --mepic-storage-dir DIR")
    if backend == "mooncake":
        from sglang_mepic.process.mooncake_master import MasterError, check_client

        try:
            check_client()
        except MasterError as e:
            raise LaunchError(f"--mepic-storage-backend mooncake: {e}") from None
        extra = config.parse_storage_config(known.mepic_storage_config or "{}")
        addressed = {"master_server_address", "client_server_address"} & extra.keys() or any(
            os.environ.get(v) for v in ("MOONCAKE_MASTER", "MOONCAKE_CLIENT", "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH"))
        if not addressed:
            raise LaunchError("--mepic-storage-backend mooncake needs the master's address: --mepic-storage-config "
                              "'{\"master_server_address\": \"HOST:PORT\", ...}' or MOONCAKE_MASTER "
                              "(python -m sglang_mepic.launch_cluster starts a master and passes it on)")


def check_storage_dir(path: str) -> str:
    """The file tier's directory, created if missing; refused if it cannot be written."""
    path = os.path.abspath(path)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise LaunchError(f"--mepic-storage-dir {path}: cannot create it ({e.strerror})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise LaunchError(f"--mepic-storage-dir {path}: not writable")
    return path
