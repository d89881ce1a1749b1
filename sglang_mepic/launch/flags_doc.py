"""The docs' table of the --mepic-* flags, written from config.SETTINGS (the one place a setting is defined).

    python -m sglang_mepic.launch.flags_doc          # rewrite the table in docs/flags.md
    python -m sglang_mepic.launch.flags_doc --check  # exit 1 if docs/flags.md is not what the table gives
"""

import argparse
import sys
from pathlib import Path

from sglang_mepic import config
from sglang_mepic.launch import mepic_flags

BEGIN = "<!-- mepic flags: written by python -m sglang_mepic.launch.flags_doc from config.SETTINGS -->"
END = "<!-- end of mepic flags -->"
DOC = Path(__file__).resolve().parents[2] / "docs" / "flags.md"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def table() -> str:
    fields = mepic_flags.help_fields()
    rows = ["| flag | environment | meaning |", "|---|---|---|"]
    for s in config.SETTINGS:
        value = "" if s.switch else " " + ("{" + ",".join(s.choices) + "}" if s.choices else s.metavar or "")
        meaning = s.help.format(**fields) + (f" See [{s.see.split('#')[0]}]({s.see})." if s.see else "")
        rows.append(f"| `{_cell(s.flag + value)}` | `{s.env}` | {_cell(meaning)} |")
    return "\n".join(rows) + "\n"


def rewritten(doc: str) -> str:
    """The doc with the table between its markers replaced (the markers must be there)."""
    if BEGIN + "\n" not in doc or END not in doc.partition(BEGIN)[2]:
        raise SystemExit(f"{DOC}: the markers {BEGIN!r} ... {END!r} are missing")
    head, _, rest = doc.partition(BEGIN + "\n")
    return head + BEGIN + "\n" + table() + END + rest.partition(END)[2]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    doc = DOC.read_text()
    new = rewritten(doc)
    if args.check:
        if new != doc:
            print(f"{DOC} is not what config.SETTINGS gives: run python -m sglang_mepic.launch.flags_doc",
                  file=sys.stderr)
            raise SystemExit(1)
        return
    DOC.write_text(new)
    print(f"wrote the flag table of {DOC}")


if __name__ == "__main__":
    main()
