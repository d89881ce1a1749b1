"""What a harness writes about how it ran, portable: paths relative to the repository.

A command recorded in a committed result is one a reader can run from their own checkout, so
every argument that names a path inside the repository is written relative to its root
(`models/tiny-4l`, not `/home/me/sglang-mepic/models/tiny-4l`). Paths outside it (a scratch
`--out /tmp/x`) are kept as given: `eval.reports.headline` refuses to write any absolute path into the
README, so such a run's command has to be fixed before it is cited.
"""

import os
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# An absolute path of two parts or more (/work/main, /tmp/x.json), not a URL (http://...), a ratio
# written with spaces (mepic / epic-16) or a relative path (eval/results/x).
ABSOLUTE = re.compile(r"(?<![\w:/.~-])/(?:[\w.@+-]+/)+[\w.@+-]*")
# The commands as results recorded before eval/ was put in folders (issue 72) name them, and where each is now:
# a cited command is one a reader can run, so a recorded one is cited under its module's current name.
MOVED = {**{f"eval.{m}": f"eval.experiments.{m}" for m in (
             "run", "capacity", "agent", "load", "fidelity", "known_reuse", "overload", "scheduler_profile")},
         **{f"eval.{m}": f"eval.reports.{m}" for m in ("headline", "compare", "ttft_split", "build_calibration")},
         **{f"eval.bench_{m}": f"eval.bench.{m}" for m in ("attention", "cache", "pool", "prefetch")},
         **{f"eval.{m}": f"eval.bench.{m}" for m in ("kernel_model", "forward_cost", "known_lookup")},
         "eval.checkpoint": "eval.lib.checkpoint"}


def portable(value) -> str:
    """`value` (a path or one argument) relative to the repository when it is an absolute path inside it;
    `--out=/repo/x` is rewritten after its `=`. Anything else unchanged."""
    text = str(value)
    flag, eq, rest = text.partition("=")
    if eq and flag.startswith("-"):
        return f"{flag}={portable(rest)}"
    if not text.startswith("/"):
        return text
    # The path as written first: a folder of the repository that links elsewhere (models/ on another disk) is
    # still inside it; then resolved, for a repository reached through a link.
    for path in (Path(os.path.normpath(text)), Path(text).resolve()):
        if path.is_relative_to(ROOT):
            inside = path.relative_to(ROOT)
            return str(inside) if str(inside) != "." else "."
    return text


def command(module: str, argv) -> str:
    """`python -m <module> <argv>`, each argument quoted and made portable."""
    return " ".join(["python", "-m", module, *(shlex.quote(portable(a)) for a in argv)])


def module_now(module: str) -> str:
    """A recorded command's module under its current name (MOVED); a current name unchanged."""
    return MOVED.get(module, module)


def current(command: str) -> str:
    """A recorded `python -m <module> ...` with its module under its current name; anything else unchanged."""
    parts = command.split(" ", 3)
    if parts[:2] == ["python", "-m"] and len(parts) > 2:
        parts[2] = module_now(parts[2])
    return " ".join(parts)


def absolute_paths(text: str) -> list[str]:
    """The absolute paths written in `text`, in order (a check before committing it)."""
    return ABSOLUTE.findall(text)


def commit() -> str:
    """The checkout's commit, short, with "+edits" when tracked files differ from it (what a figure was measured
    on); "unknown" outside a git checkout."""
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "sglang_mepic", "eval"], cwd=ROOT,
                               timeout=10).returncode != 0
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+edits" if dirty else "")
