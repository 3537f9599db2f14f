"""The package's shape, read from its source (docs/architecture.md states the rules): every
module sits in a layer and imports only from its own layer and the ones below; no import
cycles between modules, nor between packages; no module too long to read (a warning past
SIZE_WARNING lines, a failure past SIZE_LIMIT: modules are split where their role changes,
not at a line count).

Every import counts, wherever it sits (module top, inside a function, under
TYPE_CHECKING): a lazy import still says "this module needs that one", and a cycle of such
needs is what makes a change in one place break another. `from package import name`
counts as an import of the submodule when `name` is one, else of the package itself.
"""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "src"
SIZE_WARNING = 600
SIZE_LIMIT = 1000


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


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between starpo's top-level packages (a flat module is one of its
    own): `starpo.trainer.loop -> starpo.distributed.cluster` is trainer -> distributed."""

    def top(module: str) -> str:
        return ".".join(module.split(".")[:2])

    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        edges = packages.setdefault(top(module), set())
        edges.update(top(t) for t in targets if top(t) != top(module))
    return packages


def test_no_import_cycles_between_packages():
    # Two packages that import each other are one package in two folders (the trainer's
    # data-parallel update lived in distributed/ until it moved into trainer/).
    graph = package_graph(import_graph())
    assert {"starpo.trainer", "starpo.rollout"} <= set(graph)
    found = cycles(graph)
    assert not found, "package cycles:\n" + "\n".join(describe(c, graph) for c in found)


def test_no_module_is_too_long_to_read():
    sizes = {name: len(path.read_text().splitlines()) for name, path in module_files().items()}
    long = sorted(f"{name} ({lines})" for name, lines in sizes.items() if lines > SIZE_WARNING)
    if long:
        warnings.warn(f"modules past {SIZE_WARNING} lines: {', '.join(long)}", stacklevel=1)
    too_long = {name: lines for name, lines in sizes.items() if lines > SIZE_LIMIT}
    assert not too_long, f"split these where their role changes: {too_long}"


#: docs/architecture.md's layer table, from the bottom: a module may import from its own layer
#: and the ones below. Every module must be placed (the longest matching name wins), so a
#: new package or flat module says where it sits.
LAYERS = {
    "foundations": ("errors", "defaults", "types", "stats", "timing", "logs", "runs"),
    "names and settings": ("registry", "config"),
    "environments": ("envs", "evaluation.scripted", "evaluation.summary",
                     "evaluation.world_model"),
    "models and math": ("models", "algorithms", "compute"),
    "rollout": ("rollout",),
    "evaluation": ("evaluation",),
    "runs": ("sft", "trainer", "distributed", "diagnostics", "memory"),
    "front ends": ("__main__", "cli", "recipe", "viewer", "serve"),
}  # fmt: skip


def layer_of(module: str) -> int | None:
    """The index in LAYERS of `module` (dotted, under starpo), or None if unplaced."""
    name = module.removeprefix("starpo.")
    placed = [
        (len(prefix), index)
        for index, prefixes in enumerate(LAYERS.values())
        for prefix in prefixes
        if name == prefix or name.startswith(prefix + ".")
    ]
    return max(placed)[1] if placed else None


def test_every_module_has_a_layer():
    unplaced = [m for m in import_graph() if m != "starpo" and layer_of(m) is None]
    assert not unplaced, f"place these in LAYERS (and docs/architecture.md's table): {unplaced}"


def test_no_module_imports_a_layer_above_its_own():
    names = list(LAYERS)
    above = [
        f"{module} ({names[layer_of(module)]}) -> {target} ({names[layer_of(target)]})"
        for module, targets in import_graph().items()
        if module != "starpo"
        for target in sorted(targets)
        if target != "starpo" and layer_of(target) > layer_of(module)
    ]
    assert not above, "imports of a layer above:\n" + "\n".join(above)


def test_the_layer_table_reads_as_designed():
    # The rules above are only as good as the table: the config layer is torch-free, so
    # it must sit under models; compute sits under rollout and the training loops.
    assert layer_of("starpo.config.rollout") < layer_of("starpo.models.precision")
    assert layer_of("starpo.compute.forward") < layer_of("starpo.rollout.engine")
    assert layer_of("starpo.compute.forward") < layer_of("starpo.trainer.loop")
    assert layer_of("starpo.cli.sft") > layer_of("starpo.sft.run")
    assert layer_of("starpo.config.diagnostics") < layer_of("starpo.diagnostics.detector")


def test_sft_never_imports_the_trainer():
    # Same layer, kept apart: SFT and the trainer share the forward through compute/.
    graph = import_graph()
    sft = [m for m in graph if m.startswith("starpo.sft")]
    crossing = {m: sorted(t for t in graph[m] if t.startswith("starpo.trainer")) for m in sft}
    assert sft and not any(crossing.values()), f"sft imports the trainer: {crossing}"


def test_renamed_public_names_still_import():
    """User code written against an older name keeps working (one alias per rename)."""
    from starpo.config.episode import EpisodeSettings
    from starpo.rollout import RolloutSettings

    assert RolloutSettings is EpisodeSettings
