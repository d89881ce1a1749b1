"""Helpers and fixtures shared by test modules (which never import one another), moved out of
tests/tooling/test_commands.py."""

import runpy
import sys
import time
import warnings
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------
# Running a command

def command(capsys, module: str, *args) -> str:
    """`python -m module args` in this process; it must end with status 0. Its stdout (stderr is shown on failure)."""
    argv = sys.argv
    sys.argv = [module, *map(str, args)]
    started = time.monotonic()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # runpy: "found in sys.modules after import of package"
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code not in (None, 0):
            out, err = capsys.readouterr()
            pytest.fail(f"{module} exited with {e.code!r}\n{out[-3000:]}\n{err[-3000:]}")
    finally:
        sys.argv = argv
    out, err = capsys.readouterr()
    print(f"[smoke] python -m {module}: {time.monotonic() - started:.1f} s")  # shown with -rP
    return out


def table_rows(text: str, first: str) -> list[list[str]]:
    """The cells of the Markdown table rows of `text` whose first cell is `first`."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines() if line.startswith("|")]
    return [r for r in rows if r[0] == first]
