"""The package's shape, read from its source: no import cycles between starpo's modules,
and no module too long to read in one sitting (ARCHITECTURE.md states both rules).

Every import counts, wherever it sits (module top, inside a function, under
TYPE_CHECKING): a lazy import still says "this module needs that one", and a cycle of such
needs is what makes a change in one place break another. `from package import name`
counts as an import of the submodule when `name` is one, else of the package itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "src"
MAX_MODULE_LINES = 400


def module_files(root: Path = SOURCE) -> dict[str, Path]:
    """Dotted module name -> file, for every module under `root`."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that module `name` (file `path`) imports anywhere."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                found.add(submodule if submodule in known else source)
    return (found & known) - {name}


def import_graph(root: Path = SOURCE) -> dict[str, set[str]]:
    modules = module_files(root)
    known = set(modules)
    return {name: imported_modules(name, path, known) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm,
    iterative), each sorted; a self-import is not counted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            following = next(edges, None)
            if following is not None:
                if following not in index:
                    index[following] = low[following] = len(index)
                    stack.append(following)
                    on_stack.add(following)
                    work.append((following, iter(sorted(graph[following]))))
                elif following in on_stack:
                    low[node] = min(low[node], index[following])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def describe(component: list[str], graph: dict[str, set[str]]) -> str:
    inside = set(component)
    edges = [f"{a} -> {b}" for a in component for b in sorted(graph[a] & inside)]
    return "; ".join(edges)


def test_cycle_finder_sees_a_cycle_and_a_clean_chain():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_import_reader_resolves_submodules_packages_and_relative_imports(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("VALUE = 1\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "leaf.py").write_text("from pkg import VALUE\n")
    (package / "sub" / "other.py").write_text(
        "from . import leaf\n"
        "def later():\n    import pkg.sub\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ..sub.leaf import thing\n"
    )
    graph = import_graph(tmp_path)
    assert graph["pkg.sub.leaf"] == {"pkg"}
    assert graph["pkg.sub.other"] == {"pkg.sub.leaf", "pkg.sub"}


def test_no_import_cycles_between_starpo_modules():
    graph = import_graph()
    assert "starpo.trainer.loop" in graph  # the reader found the package
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(describe(c, graph) for c in found)


@pytest.mark.parametrize("name", sorted(module_files()))
def test_module_is_at_most_400_lines(name):
    lines = len(module_files()[name].read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{name} has {lines} lines; split it by role"


#: What the config layer (config.py, config_*.py) may import: it sits below envs,
#: rollout and trainer (README, "Project layout"), so `starpo train --help` and config
#: checks never load them.
CONFIG_LAYER_MAY_IMPORT = ("starpo.config", "starpo.errors", "starpo.defaults")
CONFIG_LAYER_MAY_IMPORT_EXACTLY = ("starpo.registry", "starpo.diagnostics.settings")


def test_config_layer_imports_nothing_above_it():
    graph = import_graph()
    config_modules = [m for m in graph if m.startswith("starpo.config")]
    assert {"starpo.config", "starpo.config_episode"} <= set(config_modules)
    above = {
        module: sorted(
            target
            for target in graph[module]
            if not target.startswith(CONFIG_LAYER_MAY_IMPORT)
            and target not in CONFIG_LAYER_MAY_IMPORT_EXACTLY
        )
        for module in config_modules
    }
    assert not any(above.values()), f"config modules import layers above them: {above}"


#: What the layers under the training loops must not import: compute/ (what a model computes
#: on a batch) sits below both SFT and the trainer, and SFT trains on it without the
#: trainer's internals (README, "Project layout").
LAYERS_BELOW = {
    "starpo.compute": ("starpo.trainer", "starpo.sft", "starpo.distributed", "starpo.rollout"),
    "starpo.sft": ("starpo.trainer",),
}


@pytest.mark.parametrize("layer", sorted(LAYERS_BELOW))
def test_layer_imports_nothing_above_it(layer):
    graph = import_graph()
    modules = [m for m in graph if m == layer or m.startswith(layer + ".")]
    assert modules, f"no modules found under {layer}"
    above = {
        module: sorted(t for t in graph[module] if t.startswith(LAYERS_BELOW[layer]))
        for module in modules
    }
    assert not any(above.values()), f"{layer} imports layers above it: {above}"
