"""Where an evaluation writes, and which results a report may read: a run never overwrites committed results.

A run given no `--out` (every `--quick` run, a try, a smoke test) writes to its scratch folder,
`eval/results/local/<experiment>/`, which git ignores (.gitignore): it cannot replace the committed runs
of `eval/results/` (hours of seeds each) nor show up in `git status`. A run meant to be committed names its
folder, as every committed run's recorded command does: `--out eval/results/capacity`.

`eval.reports.headline` reads only the committed folders it names, never the scratch ones, and refuses a
`results.json` that a `--quick` run wrote (`quick_run`): a smoke run is not a figure.
"""

import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Relative to the repository root, where the commands run (as every `--out` of a committed run is written).
RESULTS = Path("eval") / "results"
LOCAL = RESULTS / "local"


def out_dir(out, experiment: str) -> Path:
    """The folder a run writes to: `--out` as given, else the experiment's scratch folder (git-ignored)."""
    return Path(out) if out is not None else LOCAL / experiment


def is_scratch(path) -> bool:
    """Whether `path` (relative to the repository root, or absolute) lies in the scratch folder eval/results/local."""
    path = Path(path)
    local = ROOT / LOCAL if path.is_absolute() else LOCAL
    return path == local or local in path.parents


def words(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:  # an unbalanced quote: the words as written
        return command.split()


def quick_run(results) -> str | None:
    """How a results.json says a `--quick` run wrote it (the flag or the command it records), or None:
    eval.experiments.capacity records its arguments (`args.quick`) and each invocation's argv, eval.experiments.run
    its kind and its command."""
    if not isinstance(results, dict):
        return None
    args = results.get("args")
    if isinstance(args, dict) and str(args.get("quick")) == "True":
        return "its arguments say quick"
    if results.get("kind") == "quick":
        return "its kind is quick"
    command = results.get("command")
    if isinstance(command, str) and "--quick" in words(command):
        return f"its command is `{command}`"
    invocations = results.get("invocations")
    for invocation in invocations if isinstance(invocations, list) else []:
        argv = invocation.get("argv") if isinstance(invocation, dict) else None
        if isinstance(argv, list) and "--quick" in argv:
            return f"an invocation ran `{' '.join(argv)}`"
    return None
