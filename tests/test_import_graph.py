"""The module dependency graph of llmc is acyclic and follows the folder rules (README.md: layout).

Every `import llmc...` / `from llmc... import ...` counts, module-level or inside a function (a lazy
import still ties the two modules together). Folders map to packages as pyproject says."""

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"llmc": "llmc", "compiler": "llmc.compiler", "runtime": "llmc.runtime", "models": "llmc.models", "passes": "llmc.passes"}


def _modules() -> dict[str, Path]:
    out = {}
    for folder, pkg in PACKAGES.items():
        for f in (ROOT / folder).rglob("*.py"):
            parts = list(f.relative_to(ROOT / folder).with_suffix("").parts)
            out[".".join([pkg, *parts[:-1]] if parts[-1] == "__init__" else [pkg, *parts])] = f
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {m: set() for m in modules}
    for mod, f in modules.items():
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for n in names:
                target = owner(n) if n.startswith("llmc") else None
                if target and target != mod:
                    graph[mod].add(target)
    return graph


def test_no_import_cycles():
    graph = _graph()
    # A package's __init__ importing its own submodules (passes/ registering its pass files) is not a
    # cycle of concern; everything else must be ordered.
    pruned = {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in graph.items()}
    try:
        list(graphlib.TopologicalSorter(pruned).static_order())
    except graphlib.CycleError as e:
        pytest.fail(f"import cycle: {' -> '.join(e.args[1])}")


def test_folder_rules():
    graph = _graph()
    for mod, deps in graph.items():
        if mod.startswith("llmc.runtime"):
            bad = [d for d in deps if d.startswith(("llmc.compiler", "llmc.passes", "llmc.models"))]
            assert not bad, f"{mod} (runtime) imports {bad}: the runtime must not need the compiler"
        if mod.startswith("llmc.passes.") and mod != "llmc.passes._base":
            bad = [d for d in deps if not d.startswith("llmc.passes")]
            assert not bad, f"{mod} (a pass) imports {bad}: passes import nothing of ours but their base"
