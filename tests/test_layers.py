"""The package's layers run one way, and no two modules import each other.

Every import in src/speclens is read with ``ast`` (nothing is imported): module-level, inside
functions and under ``if TYPE_CHECKING:``, ``import x`` and ``from x import y``, relative imports
resolved. Two checks: (a) no import runs against the layer order below (DESIGN.md, "Layout");
(b) no cycle between modules, however long.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import speclens

PACKAGE = "speclens"
SRC = Path(speclens.__file__).resolve().parent

#: Each layer and the layers it imports directly; a layer may import anything below those too.
#: ``speclens`` itself (the package's ``__init__``: its version) sits under every layer, and
#: ``speclens.__main__`` belongs to the CLI.
#:
#:   acceptance <- cost <- engine <- server
#:   acceptance <- sampling <- engine
#:   acceptance <- runs <- bench
#:   engine, runs <- sim
#:   server, bench, sim <- cli
LAYERS: dict[str, set[str]] = {
    "acceptance": set(),
    "cost": {"acceptance"},
    "sampling": {"acceptance"},
    "engine": {"sampling", "cost"},
    "server": {"engine"},
    "runs": {"acceptance"},
    "bench": {"runs"},
    "sim": {"engine", "runs"},
    "cli": {"server", "bench", "sim"},
}


def below(layer: str) -> set[str]:
    """Every layer ``layer`` may import: those it names, and theirs, all the way down."""
    seen: set[str] = set()
    todo = [layer]
    while todo:
        for lower in LAYERS[todo.pop()]:
            if lower not in seen:
                seen.add(lower)
                todo.append(lower)
    return seen


@functools.cache
def modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the package by dotted name: its file, and whether it is a package."""
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = [PACKAGE, *path.relative_to(SRC).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def statements(tree: ast.Module) -> Iterator[ast.stmt]:
    """Every statement, however deeply nested (functions, classes, ``if TYPE_CHECKING:``, ``try``,
    ``with``, ``match``), without walking into expressions: an import is always a statement."""
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.stmt):
            yield node
        for attr in ("body", "orelse", "finalbody", "handlers", "cases"):
            todo.extend(getattr(node, attr, ()))


def imports(name: str, path: Path, is_package: bool, known: set[str]) -> Iterator[tuple[str, int]]:
    """The package's modules that module ``name`` imports, each with the line that does."""

    def nearest(dotted: str) -> str:
        while dotted and dotted not in known:  # a name from a module, or a namespace package
            dotted = dotted.rpartition(".")[0]
        return dotted

    here = name if is_package else name.rpartition(".")[0]
    for node in statements(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    yield nearest(alias.name), node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[: len(here.split(".")) - node.level + 1]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            if source.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:  # ``from pkg import module`` imports the module
                full = f"{source}.{alias.name}"
                yield (full if full in known else nearest(source)), node.lineno


@functools.cache
def graph() -> dict[str, dict[str, int]]:
    """Module -> the modules it imports -> the first line that imports each (read once)."""
    found = modules()
    edges: dict[str, dict[str, int]] = {}
    for name, (path, is_package) in found.items():
        out = edges.setdefault(name, {})
        for target, line in imports(name, path, is_package, set(found)):
            if target and target != name:
                out[target] = min(line, out.get(target, line))
    return edges


def layer_of(module: str) -> str | None:
    """The module's layer; None for the package's own ``__init__``."""
    parts = module.split(".")
    if len(parts) == 1:
        return None
    return "cli" if parts[1] == "__main__" else parts[1]


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (first module repeated last) from each strongly connected group (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, {})):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(edges):
        if node not in index:
            visit(node)

    found = []
    for group in groups:  # the shortest way back to the group's first module, breadth first
        start = min(group)
        came_from: dict[str, str] = {}
        frontier = [start]
        while frontier and start not in came_from:
            following = []
            for node in frontier:
                for nxt in sorted(edges[node]):
                    if nxt in group and nxt not in came_from:
                        came_from[nxt] = node
                        following.append(nxt)
            frontier = following
        path = [start]
        while path[-1] != start or len(path) == 1:
            path.append(came_from[path[-1]])
        found.append(path[::-1])
    return found


def test_the_layer_table_names_every_layer() -> None:
    layers = {layer_of(m) for m in modules()} - {None}
    assert layers <= set(LAYERS), f"layers missing from LAYERS: {sorted(layers - set(LAYERS))}"
    for layer, lower in LAYERS.items():
        assert lower <= set(LAYERS), f"{layer}: unknown layers {sorted(lower - set(LAYERS))}"
        assert layer not in below(layer), f"{layer}: the layer table has a cycle"


def test_imports_follow_the_layer_order() -> None:
    edges = graph()
    wrong = []
    for module, targets in sorted(edges.items()):
        layer = layer_of(module)
        allowed = below(layer) if layer is not None else set()
        for target, line in sorted(targets.items()):
            other = layer_of(target)
            if other is None or other == layer:
                continue
            if other not in allowed:
                where = f"{modules()[module][0].relative_to(SRC.parent.parent)}:{line}"
                wrong.append(f"{where}: {module} ({layer}) imports {target} ({other})")
    assert not wrong, "imports against the layer order:\n" + "\n".join(wrong)


def test_no_module_cycles() -> None:
    found = cycles(graph())
    assert not found, "modules that import each other:\n" + "\n".join(
        " -> ".join(cycle) for cycle in found
    )
