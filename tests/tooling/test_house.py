"""The house rules on the package's shape: within each subpackage no two modules import each other, even
through others or for typing only, and no module outside the kernels is over 400 lines. Static: the source is
parsed, nothing is imported. (tests/tooling/test_layers.py checks the imports between the parts; this, within
each.)"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sglang_mepic"
MAX_LINES = 400
EXEMPT = {"kernels"}  # the Triton kernels and their torch twins: one kernel's variants read best together


def import_graph(folder: Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports anywhere: at the top, in a function, or under
    `if TYPE_CHECKING:` (a typing-only import still makes a circle that a reader must untangle)."""
    modules = {p.stem for p in folder.glob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module == package:  # from sglang_mepic.attention import x
                    graph[path.stem] |= {a.name for a in node.names if a.name in modules}
                elif node.module.startswith(package + "."):
                    graph[path.stem].add(node.module[len(package) + 1:].split(".")[0])
            elif isinstance(node, ast.Import):
                graph[path.stem] |= {a.name[len(package) + 1:].split(".")[0] for a in node.names
                                     if a.name.startswith(package + ".")}
    return {m: targets & modules - {m} for m, targets in graph.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle found by a depth-first walk, each as the path that closes it."""
    found, done = [], set()

    def walk(module: str, path: list[str]) -> None:
        if module in path:
            found.append(path[path.index(module):] + [module])
            return
        if module in done:
            return
        for target in sorted(graph.get(module, ())):
            walk(target, path + [module])
        done.add(module)

    for module in sorted(graph):
        walk(module, [])
    return found


def subpackages() -> list[Path]:
    return sorted(p.parent for p in PACKAGE.rglob("__init__.py"))


def test_no_module_imports_another_of_its_package_that_imports_it_back():
    found = {}
    for folder in subpackages():
        name = ".".join(folder.relative_to(ROOT).parts)
        if cycle := circles(import_graph(folder, name)):
            found[name] = cycle
    assert found == {}
    # the graph reads what it should: the backend imports the sync probe, the linker the shape it makes
    assert "sync_probe" in import_graph(PACKAGE / "attention", "sglang_mepic.attention")["backend"]
    assert "shape" in import_graph(PACKAGE / "cache", "sglang_mepic.cache")["link"]


def test_a_planted_circle_is_found(tmp_path):
    (tmp_path / "a.py").write_text("from sglang_mepic.attention.b import x\n")
    (tmp_path / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                   "    from sglang_mepic.attention import c\n")
    (tmp_path / "c.py").write_text("def f():\n    import sglang_mepic.attention.a\n")
    assert circles(import_graph(tmp_path, "sglang_mepic.attention")) == [["a", "b", "c", "a"]]


def test_no_module_outside_the_kernels_is_over_the_house_limit():
    lines = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")
             if p.relative_to(PACKAGE).parts[0] not in EXEMPT}
    assert len(lines) > 100  # it read the package
    assert {name: n for name, n in lines.items() if n > MAX_LINES} == {}
