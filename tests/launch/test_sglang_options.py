"""SGLang's command line read as SGLang's parser reads it: the flag table, and abbreviations resolved by
argparse's own rules."""

import argparse

import pytest
from hypothesis import given, settings, strategies as st

from sglang_mepic.launch import sglang_options
from sglang_mepic.launch.sglang_flags import known_flags
from sglang_mepic.launch.defaults import with_defaults
from support.abbreviations import shortest_abbreviation


def test_the_table_is_sglangs_parser():
    """The committed table names every flag of the installed SGLang's parser, each action's spellings
    together (regenerate with `python -m sglang_mepic.launch.sglang_options --write`)."""
    live = sglang_options.live_groups()
    assert [list(g) for g in sglang_options.groups()] == live


class _Refused(Exception):
    pass


class _Argparse(argparse.ArgumentParser):
    def error(self, message):
        raise _Refused(message)


def _argparse():
    parser = _Argparse(prog="sglang serve", add_help=False)
    for group in sglang_options.groups():
        parser.add_argument(*group)
    return parser


ARGPARSE = _argparse()
FLAGS = sorted(sglang_options._spellings())


def _argparse_reading(token):
    """What Python's argparse makes of one token: the flag, 'value', 'unknown' or its refusal."""
    try:
        found = ARGPARSE._parse_optional(token)
    except _Refused as e:
        return ("refused", str(e))
    if found is None:
        return ("value",)
    action, option_string, explicit = found[:3]
    if action is None:
        return ("unknown",)
    return (action.option_strings, explicit)


def _ours(token):
    try:
        resolved = sglang_options.resolve(token)
    except sglang_options.AmbiguousFlag as e:
        return ("refused", str(e))
    head, eq, value = resolved.partition("=")
    if resolved in FLAGS or (eq and head in FLAGS):
        group = sglang_options.spellings_of(resolved if resolved in FLAGS else head)
        return (list(group), value if (eq and resolved not in FLAGS) else None)
    if not token.startswith("-") or len(token) == 1 or sglang_options._NEGATIVE_NUMBER.match(token) or " " in token:
        return ("value",)
    return ("unknown",)


tokens = st.one_of(
    st.sampled_from(FLAGS).flatmap(lambda f: st.integers(1, len(f)).map(lambda n: f[:n])),  # prefixes
    st.tuples(st.sampled_from(FLAGS).flatmap(lambda f: st.integers(2, len(f)).map(lambda n: f[:n])),
              st.text("ab1=-", max_size=4)).map(lambda t: f"{t[0]}={t[1]}"),  # --prefix=value
    st.sampled_from(["-1", "-0.5", "--", "-", "2", "--nope", "-x", "--tp foo", "--tp-size=", "--=x"]),
)


@settings(max_examples=600, deadline=None)
@given(tokens)
def test_a_token_reads_as_argparse_reads_it(token):
    """resolve() against argparse's own `_parse_optional` on a parser with SGLang's flags."""
    assert _ours(token) == _argparse_reading(token), token


@pytest.mark.parametrize("given_flags, full", [
    (["--tp", "2"], ["--tp-size", "2"]),
    (["--tensor-parallel", "2"], ["--tensor-parallel-size", "2"]),
    (["--tp=2"], ["--tp-size=2"]),
    (["--dp", "2"], ["--dp-size", "2"]),
    (["--attention-back", "torch_native"], ["--attention-backend", "torch_native"]),
    (["--chunked-prefill-size", "-1"], ["--chunked-prefill-size", "-1"]),  # a negative number is a value
    (["--json-model-override-args", "{}", "--", "--tp"], ["--json-model-override-args", "{}", "--", "--tp"]),  # canonical() alone; the launcher refuses `--`
])
def test_abbreviations_are_written_out(given_flags, full):
    assert sglang_options.canonical(given_flags) == full


def test_an_ambiguous_abbreviation_is_refused_as_sglang_refuses_it():
    with pytest.raises(SystemExit, match="^sglang_mepic.launch_server: error: ambiguous option: --enable-hi could match --enable-hierarchical-cache, --enable-hicache"):
        known_flags(["--enable-hi"])


def test_every_spelling_of_a_flag_the_launcher_reads_is_read():
    """`--enable-hicache` is SGLang's other name of `--enable-hierarchical-cache`; the launcher's reader knew
    only the first."""
    assert known_flags(["--enable-hicache"]).enable_hierarchical_cache
    assert known_flags(["--tensor-parallel-size", "3"]).tp_size == 3
    assert known_flags(["--model", "m"]).model_path == "m"


@pytest.mark.parametrize("user, flag, value", [
    (["--attention-back", "torch_native", "--radix-cache-back", "sglang"], "--attention-backend", "torch_native"),
    (["--dev", "cuda"], "--device", "cuda"),
    (["--max-total", "123"], "--max-total-tokens", "123"),
    (["--page-s", "32"], "--page-size", "32"),
])
def test_a_default_never_overrides_the_users_flag_in_another_spelling(user, flag, value):
    """The launcher appended its defaults after the user's abbreviated flags, and the last one won:
    `--attention-back torch_native` served mepic attention (the battery at 1410689)."""
    argv, _ = with_defaults(["--model-path", "m", *user], cuda=False)
    assert [argv[i + 1] for i, a in enumerate(argv) if a == flag] == [value], argv
    assert "--radix-cache-backend" not in argv or flag != "--attention-backend"


def test_shortest_abbreviations_are_unique_prefixes():
    assert shortest_abbreviation("--tp-size") == "--tp"
    assert shortest_abbreviation("--log-level") == "--log-level"  # every prefix is also --log-level-http's
    assert sglang_options.resolve(shortest_abbreviation("--disable-radix-cache")) == "--disable-radix-cache"
