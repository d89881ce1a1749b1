"""The shortest spelling of a flag SGLang's parser still reads as that flag: what a user may type instead."""

from sglang_mepic.launch import sglang_options


def shortest_abbreviation(flag: str) -> str:
    """The shortest prefix of `flag` no other SGLang flag starts with (`flag` itself where every shorter
    prefix is shared, as `--log-level` with `--log-level-http`)."""
    others = [s for s in sglang_options._spellings() if s != flag]
    for end in range(3, len(flag)):
        if not any(s.startswith(flag[:end]) for s in others):
            return flag[:end]
    return flag


def abbreviated(argv: list[str]) -> list[str]:
    """argv with each SGLang flag (`--flag` or `--flag=value`) at its shortest abbreviation; values as they are."""
    spellings = set(sglang_options._spellings())
    out = []
    for token in argv:
        head, eq, value = token.partition("=")
        out.append(shortest_abbreviation(head) + eq + value if head in spellings else token)
    return out
