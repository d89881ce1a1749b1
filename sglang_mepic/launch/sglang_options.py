"""SGLang's command line read the way SGLang's own parser reads it: every abbreviation resolved.

SGLang's parser (argparse, `allow_abbrev` on) takes any unique prefix of a long flag: `--tp 2` is
`--tp-size 2`. The launcher's checks and defaults read a few flags by their full names, so `canonical`
rewrites each abbreviation to the flag SGLang resolves it to before anything reads argv; a check then sees
what SGLang will see, and a default never overrides what the user gave in another spelling.

The flags come from `sglang_options.json`, written from SGLang's live parser (`python -m
sglang_mepic.launch.sglang_options --write`): building that parser imports SGLang (5-9 s) and reads the
environment the launcher has not finished setting. Under another SGLang version the live parser is read
instead (tests/launch/test_sglang_options.py checks that the file equals it)."""

import argparse
import functools
import importlib.metadata
import json
import re
import sys
from pathlib import Path

TABLE = Path(__file__).with_name("sglang_options.json")
# argparse's `_negative_number_matcher`: such a token is a value while no flag looks like a number.
MAX_CONFIG_FILES = 8  # config files naming config files: a loop is refused
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


class AmbiguousFlag(ValueError):
    """A prefix of more than one flag: SGLang's parser refuses it (argparse's own wording)."""


def live_groups() -> list[list[str]]:
    """Each action of SGLang's parser (as `prepare_server_args` builds it) as its option strings."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    return [list(a.option_strings) for a in parser._actions if a.option_strings]


@functools.lru_cache(maxsize=1)
def groups() -> tuple[tuple[str, ...], ...]:
    """SGLang's flags, one tuple of spellings per action: from the table when it was written for the
    installed SGLang, else from its live parser."""
    table = json.loads(TABLE.read_text())
    try:
        installed = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:  # importable without its metadata (a bare copy)
        installed = None
    if table["sglang"] != installed:
        return tuple(tuple(g) for g in live_groups())
    return tuple(tuple(g) for g in table["groups"])


@functools.lru_cache(maxsize=1)
def _spellings() -> tuple[str, ...]:
    return tuple(s for g in groups() for s in g)


def spellings_of(flag: str) -> tuple[str, ...]:
    """Every full spelling of the action `flag` names (`--tp-size`: also `--tensor-parallel-size`)."""
    return next((g for g in groups() if flag in g), (flag,))


def resolve(token: str) -> str:
    """The flag SGLang's parser reads `token` as, in full (with `=value` kept); any other token as it is.

    The rules of argparse's `_parse_optional` (Python 3.11), which classifies each token on its own:
    an exact flag, `--flag=value`, then the flags the token is a prefix of."""
    spellings = _spellings()
    if not token.startswith("-") or len(token) == 1 or token in spellings:
        return token
    head, eq, value = token.partition("=")
    if eq and head in spellings:
        return token
    if token.startswith("--"):
        matches = [s for s in spellings if s.startswith(head)]
    else:  # one dash: a short flag, or a prefix of a one-dash long one (SGLang has only -h)
        matches = [s for s in spellings if s == token[:2] or (s.startswith(head) and not s.startswith("--"))]
    if len(matches) > 1:
        raise AmbiguousFlag(f"ambiguous option: {token} could match {', '.join(matches)}")
    if len(matches) == 1:
        full = matches[0]
        if token.startswith("--"):
            return full + eq + value
        return token if full == token[:2] else full + eq + value  # -hX stays as SGLang reads it
    return token  # a negative number, a value with a space, or a flag SGLang does not know (it refuses it)


def canonical(argv: list[str]) -> list[str]:
    """argv with each abbreviated SGLang flag written out; tokens after a lone `--` are values."""
    out: list[str] = []
    for i, token in enumerate(argv):
        if token == "--":
            return out + argv[i:]
        out.append(resolve(token))
    return out


def with_config_file(argv: list[str]) -> list[str]:
    """argv with SGLang's `--config file.yaml` merged in, by SGLang's own merger, as the flags SGLang will
    read (its keys may be abbreviations too); argv as it is without one. Imports SGLang's parser (5-9 s):
    only a start with a config file pays it. Raises ValueError with SGLang's reason for a bad file."""
    if "--config" not in argv:
        return argv
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    # A file may name another (`config: b.yaml`, or a `--config` among a list's values): SGLang merges the
    # `--config` it is given, so every one is merged here, and SGLang is given none.
    for _ in range(MAX_CONFIG_FILES):
        argv = canonical(ConfigArgumentMerger(parser).merge_config_with_args(argv))
        if "--config" not in argv:
            return argv
    raise ValueError(f"more than {MAX_CONFIG_FILES} config files, each naming the next")


def write_table() -> None:
    import sglang

    TABLE.write_text(json.dumps({"sglang": sglang.__version__, "groups": live_groups()}, indent=0) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: python -m sglang_mepic.launch.sglang_options --write")
    write_table()
    print(f"{TABLE}: {len(groups())} flags of SGLang {json.loads(TABLE.read_text())['sglang']}")
