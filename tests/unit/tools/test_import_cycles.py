"""tools/ stands on its own, in layers: every module of tools/localcluster imports, and no module
of tools/ imports itself back through others (read with `ast`: the imports inside functions
count too, as they run as soon as the function does)."""

import ast
import importlib
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[3] / "tools"


def modules(root: Path) -> dict[str, Path]:
    """Dotted name -> file of every module under root that Python imports as such: the scripts
    beside the packages (role_docs...) and each package's own .py files (a folder without
    __init__.py, such as localcluster/train, holds scripts of another kind)."""
    found = {path.stem: path for path in root.glob("*.py")}
    for init in root.glob("*/__init__.py"):
        package = init.parent.name
        found[package] = init
        for path in init.parent.glob("*.py"):
            if path.name != "__init__.py":
                found[f"{package}.{path.stem}"] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that the module `name` (file `path`) imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            bases = [alias.name for alias in node.names]
            names = []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            bases = [base]
            names = [f"{base}.{alias.name}" if base else alias.name for alias in node.names]
        else:
            continue
        for candidate in [*bases, *names]:
            while candidate and candidate not in known:  # a name inside a module: the module
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                found.add(candidate)
    # A module's own package (its __init__) runs first whatever it imports: not an edge.
    return found - {package}


def graph(root: Path) -> dict[str, set[str]]:
    found = modules(root)
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def cycle(edges: dict[str, set[str]]) -> list[str]:
    """One import cycle (its modules, the first repeated at the end), or []."""
    state: dict[str, str] = {}  # name -> "open" while on the path, "done" after

    def visit(name, path):
        state[name] = "open"
        for other in sorted(edges.get(name, ())):
            if state.get(other) == "open":
                return [*path[path.index(other) :], other]
            if other not in state:
                found = visit(other, [*path, other])
                if found:
                    return found
        state[name] = "done"
        return []

    for start in sorted(edges):
        if start not in state:
            found = visit(start, [start])
            if found:
                return found
    return []


@pytest.mark.parametrize("name", sorted(n for n in modules(TOOLS) if n.startswith("localcluster")))
def test_every_localcluster_module_imports(name):
    importlib.import_module(name)


def test_no_import_cycle_in_tools():
    edges = graph(TOOLS)
    assert "localcluster.compute_api" in edges and "bench.runs" in edges  # the packages are read
    assert "localcluster.compute_service" in edges["localcluster.cluster"]
    assert "localcluster.cluster" in edges["localcluster.gce_control"]
    assert cycle(edges) == [], " -> ".join(cycle(edges))


def test_a_cycle_is_found_however_it_is_written(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from . import b\n")
    (package / "b.py").write_text("def f():\n    from .c import g\n")
    (package / "c.py").write_text("import pkg.a\n")
    (package / "d.py").write_text("from pkg import a\nfrom pkg.b import f\n")
    edges = graph(tmp_path)
    assert edges["pkg.d"] == {"pkg.a", "pkg.b"}
    assert cycle(edges) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]
    (package / "c.py").write_text("import json\n")
    assert cycle(graph(tmp_path)) == []
