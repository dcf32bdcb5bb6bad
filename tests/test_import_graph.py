"""surecl's modules import each other without a cycle: every ``import`` (at the top or inside a
function; ``if TYPE_CHECKING:`` blocks aside, they never run), every ``importlib.import_module``
of a literal name and every ``"surecl.x:Attr"`` string (the registries' lazy references) is an
edge; importing ``surecl.a.b`` also runs the package ``surecl.a``. One exception: a package may
name its own submodules lazily (``surecl/methods/olora/__init__.py``'s ``"...olora.method:OLoRA"``
spec and PEP 562 ``__getattr__``); that reference runs only after the package has loaded, so a
package -> own-descendant edge does not count toward a cycle. The package root is the lazy public
face (``surecl.run``, ...): modules do not import it. And the low layers import nothing above them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
STRING_REF = re.compile(r"^(surecl(?:\.\w+)*)(?::\w+)?$")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in SRC.rglob("*.py")}


def resolve(name: str) -> str | None:
    """The module a dotted reference lands in: itself, or the module holding the attribute."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def edges_of(name: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # a submodule imported by name
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            m = STRING_REF.match(node.value)
            call = getattr(node, "parent", None)
            func = getattr(call, "func", None) if isinstance(call, ast.Call) else None
            imported = getattr(func, "attr", getattr(func, "id", None)) == "import_module"
            named = m and m.group(1) in MODULES and m.group(1) != "surecl"  # a module named by a literal (the root's lazy table)
            if m and (":" in node.value or imported or named):
                found.add(m.group(1))
        for child in ast.iter_child_nodes(node):
            child.parent = node  # type: ignore[attr-defined]
            visit(child)

    visit(tree)
    out = set()
    for target in found:
        if not target.startswith("surecl"):
            continue
        resolved = resolve(target)
        if resolved and resolved != name:
            out.add(resolved)
    # importing surecl.a.b runs surecl.a first (the root package aside: see the module docstring)
    parents = {".".join(t.split(".")[:k]) for t in out for k in range(2, len(t.split(".")))}
    return (out | {p for p in parents if p in MODULES and p != name}) - {""}


GRAPH = {name: edges_of(name, path) for name, path in MODULES.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = dfs(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = dfs(node)
            if found:
                return found
    return None


def test_the_graph_is_read():
    assert "surecl.registry" in GRAPH["surecl.config"]
    assert "surecl.methods.olora.method" in GRAPH["surecl.methods.olora"]  # a "module:Class" string
    assert "surecl.replay.policies" in GRAPH["surecl.replay.builtin"]
    assert "surecl.trainer" in GRAPH["surecl"]  # the root's lazy imports, inside a function


def test_no_import_cycle():
    graph = {name: {e for e in edges if e != "surecl" and not e.startswith(name + ".")} for name, edges in GRAPH.items() if name != "surecl"}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_nothing_imports_the_package_root():
    importers = sorted(name for name, edges in GRAPH.items() if "surecl" in edges and name != "surecl")
    assert importers == []


def reachable(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in GRAPH.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


@pytest.mark.parametrize("low, forbidden", [
    ("surecl.sections", {"surecl.config", "surecl.registry", "surecl.trainer"}),
    ("surecl.options", {"surecl.config", "surecl.registry", "surecl.trainer"}),
    ("surecl.registry", {"surecl.config", "surecl.trainer", "surecl.cli"}),
    ("surecl.config", {"surecl.trainer", "surecl.adapters", "surecl.cli", "surecl.report"}),
    ("surecl.adapters", {"surecl.config", "surecl.trainer", "surecl.registry", "surecl.report"}),
    ("surecl.checkpoint", {"surecl.config", "surecl.trainer", "surecl.registry", "surecl.adapters"}),
    ("surecl.data.task", {"surecl.config", "surecl.trainer", "surecl.registry", "surecl.model"}),
    ("surecl.data.encode", {"surecl.config", "surecl.trainer", "surecl.registry", "surecl.model"}),
])
def test_low_layers_import_nothing_above_them(low, forbidden):
    assert not reachable(low) & forbidden, sorted(reachable(low) & forbidden)
