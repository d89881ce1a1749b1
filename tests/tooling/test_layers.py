"""The package's import rule (sglang_mepic/README.md): each part imports only the parts below it.
Static: the source is parsed, nothing is imported."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIB = ("config", "env", "side_table", "modes", "__init__")  # importable from everywhere (the package's own names)
MAY_IMPORT = {
    "config": {"modes"}, "env": {"config", "modes"}, "side_table": set(), "__init__": set(), "modes": set(),
    "kernels": set(),
    "wire": {"config"},
    "frontend": {"config", "env", "side_table", "wire"},
    "pages": {"config", "side_table", "wire"},
    "tiers": {"config", "env", "side_table", "modes", "wire", "pages"},
    "cache": {"config", "env", "side_table", "modes", "wire", "pages", "tiers"},
    "attention": {"config", "env", "side_table", "modes", "wire", "pages", "kernels"},
    "process": {"config"},
    "hardening": set(),  # guards against SGLang's own mishandling: nothing of MEPIC in them
    "lang": {"config", "wire", "frontend"},
    "gate": {"config", "env", "side_table", "modes", "wire", "frontend", "lang", "process", "tiers"},
    "scale_out": {"config", "wire"},  # the DP controller's routing: keys requests as the cache keys chunks
}
MAY_IMPORT["launch"] = MAY_IMPORT["gate"] | {"gate", "plugin"}  # the launcher checks the plugin registered
SCHEDULER_SIDE = {"pages", "tiers", "cache", "attention"}
ANYTHING = {"plugin", "launch_server", "launch_cluster", "models", "check_model", "patches"}  # a hook glues any part


def imported_parts(path: Path) -> set[str]:
    """The parts of sglang_mepic a module imports at run time (not under `if TYPE_CHECKING:`)."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree)
                   if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                   for n in ast.walk(node)}
    parts = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}: relative import; write it absolute (from sglang_mepic.<part> ...)")
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "sglang_mepic":
            names = node.module.split(".")
            parts |= {a.name for a in node.names} if len(names) == 1 else {names[1]}
        elif isinstance(node, ast.Import):
            parts |= {a.name.split(".")[1] for a in node.names if a.name.startswith("sglang_mepic.")}
    return {p if p in MAY_IMPORT or p in ANYTHING or p in ("kernels", "patches") else "__init__" for p in parts}


def violations(package: Path) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        part = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        if part in ANYTHING:
            continue
        if part not in MAY_IMPORT:
            found.append(f"{rel}: '{part}' is in no layer (add it to sglang_mepic/README.md and MAY_IMPORT)")
            continue
        for target in sorted(imported_parts(path) - {part} - MAY_IMPORT[part] - {"__init__"}):
            found.append(f"{rel} ({part}) imports {target}")
    return found


def test_the_package_keeps_its_import_rule():
    assert violations(ROOT / "sglang_mepic") == []


# What a hook may import, by the folder of the process it runs in (sglang_mepic/patches/__init__.py): a tokenizer
# hook nothing of the scheduler side, a scheduler hook nothing of the frontend, a launcher hook neither.
HOOK_GROUPS = {"tokenizer": SCHEDULER_SIDE, "scheduler": {"frontend", "lang"},
               "launcher": SCHEDULER_SIDE | {"frontend", "lang"},
               "dp_controller": SCHEDULER_SIDE | {"frontend", "lang"},  # the DP controller routes: scale_out only
               "hardening": set()}


def hooks_out_of_place(patches: Path) -> list[str]:
    found = []
    for path in sorted(patches.rglob("*.py")):
        if path.name == "__init__.py" and path.parent != patches:
            continue
        rel = path.relative_to(patches)
        parts = imported_parts(path)
        if len(rel.parts) != 2 or rel.parts[0] not in HOOK_GROUPS:
            if path.parent != patches or path.name != "__init__.py":
                found.append(f"{rel}: not in a process's folder ({', '.join(HOOK_GROUPS)})")
            continue
        if "frontend" in parts and parts & SCHEDULER_SIDE:
            found.append(f"{rel}: imports both sides {sorted(parts)}")
        elif parts & HOOK_GROUPS[rel.parts[0]]:
            found.append(f"{rel}: a {rel.parts[0]} hook imports {sorted(parts & HOOK_GROUPS[rel.parts[0]])}")
    return found


def test_a_hook_imports_from_one_side_only_and_sits_in_its_process_folder():
    assert hooks_out_of_place(ROOT / "sglang_mepic" / "patches") == []


@pytest.mark.parametrize("path, source, named", [
    ("scheduler/x.py", "from sglang_mepic.frontend import markup\n", "scheduler/x.py: a scheduler hook imports"),
    ("tokenizer/x.py", "from sglang_mepic.cache import extend\n", "tokenizer/x.py: a tokenizer hook imports"),
    ("x.py", "", "x.py: not in a process's folder"),
])
def test_the_hook_rule_fails_on_a_planted_violation(tmp_path, path, source, named):
    (tmp_path / Path(path).parent).mkdir(parents=True, exist_ok=True)
    (tmp_path / path).write_text(source)
    assert [f for f in hooks_out_of_place(tmp_path) if f.startswith(path)][0].startswith(named)


def test_every_hook_module_is_registered():
    """A hook file that no group's MODULES lists would never be registered."""
    from sglang_mepic import patches

    on_disk = {f"{p.parent.name}.{p.stem}" for p in (ROOT / "sglang_mepic" / "patches").glob("*/*.py")
               if p.name != "__init__.py"}
    assert sorted(patches.modules()) == sorted(on_disk)


@pytest.mark.parametrize("importer, source, named", [
    ("cache/admission.py", "from sglang_mepic.frontend import markup\n", "cache/admission.py (cache) imports frontend"),
    ("pages/refs.py", "from sglang_mepic import cache\n", "pages/refs.py (pages) imports cache"),
    ("frontend/echo.py", "def f():\n    from sglang_mepic.cache.link import link_of\n",
     "frontend/echo.py (frontend) imports cache"),
    ("config.py", "import sglang_mepic.wire.hint\n", "config.py (config) imports wire"),
])
def test_the_rule_fails_on_a_planted_violation(tmp_path, importer, source, named):
    """A scheduler-side module that imports the frontend (or any part above it) is named."""
    package = tmp_path / "sglang_mepic"
    (package / Path(importer).parent).mkdir(parents=True, exist_ok=True)
    (package / importer).write_text(source)
    assert violations(package) == [named]


def test_imports_for_type_checking_only_are_exempt(tmp_path):
    package = tmp_path / "sglang_mepic"
    (package / "pages").mkdir(parents=True)
    (package / "pages" / "context.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from sglang_mepic.attention.positions import P\n")
    assert violations(package) == []
