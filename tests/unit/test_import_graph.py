"""The import graph of the code, read from the source: layers point one way.

Every module of ``schemas``, ``orchestrator`` and ``workers`` has a layer
(:data:`LAYERS`, the map at the top of ``docs/architecture.md``). An import
anywhere in a module (at the top, inside a function, under
``TYPE_CHECKING``) is an edge; no edge may point to a higher layer and no
chain of edges may lead back to where it started. A package's
``__init__`` runs whenever one of its modules is imported, so what it
imports at import time must sit no higher than its lowest module.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("schemas", "orchestrator", "workers")

#: The layers, lowest first: a module may import its own layer and those below.
ORDER = ("foundation", "store", "tools", "llm", "runtime", "policies", "engine", "api", "entry")

#: Each module's layer, by its name or the package holding it (the longest
#: match wins); the root package ``orchestrator`` (its lazy ``__init__``)
#: matches only itself, so a new top-level module needs a line here.
LAYERS = {
    # leaves: no I/O of their own
    "schemas": "foundation",
    "orchestrator.errors": "foundation",
    "orchestrator.settings": "foundation",
    "orchestrator.keys": "foundation",
    "orchestrator.logs": "foundation",
    "orchestrator.patterns": "foundation",
    "orchestrator.lazy": "foundation",
    "orchestrator.periodic": "foundation",
    "orchestrator.tracing": "foundation",
    "orchestrator.trace_context": "foundation",
    "orchestrator.trace_export": "foundation",
    # Postgres, the event outbox, the broker's configuration
    "orchestrator.store": "store",
    "orchestrator.events": "store",
    "orchestrator.celery_conf": "store",
    "orchestrator.redis_transport": "store",
    # declarations the engine reads: tools, MCP servers, agents' checks, context transformers
    "orchestrator.tools": "tools",
    "orchestrator.registry": "tools",
    "orchestrator.spec_checks": "tools",
    "orchestrator.context": "tools",
    "orchestrator.schematools": "tools",
    "orchestrator.toolsets": "tools",
    "orchestrator.toolnames": "tools",
    # model clients
    "orchestrator.llm": "llm",
    # what a process shares (connections, the model client); which queues workers read
    "orchestrator.runtime": "runtime",
    "orchestrator.readers": "runtime",
    "orchestrator.published": "runtime",
    # around model and tool calls
    "orchestrator.policies": "policies",
    "orchestrator.ratelimit": "policies",
    # what runs next, and its actions as Celery canvas
    "orchestrator.engine": "engine",
    "orchestrator.dispatch": "engine",
    # the public API
    "orchestrator": "api",
    "orchestrator.client": "api",
    "orchestrator.client_args": "api",
    "orchestrator.client_ops": "api",
    "orchestrator.sending": "api",
    "orchestrator.job_reads": "api",
    "orchestrator.async_client": "api",
    "orchestrator.async_waits": "api",
    "orchestrator.agents": "api",
    "orchestrator.streams": "api",
    "orchestrator.turn_ends": "api",
    # entry points: processes, commands, the test harness
    "orchestrator.cli": "entry",
    "orchestrator.server": "entry",
    "orchestrator.local": "entry",
    "orchestrator.supervisor": "entry",
    "orchestrator.liveness": "entry",
    "orchestrator.metrics": "entry",
    "orchestrator.testing": "entry",
    "workers": "entry",
}


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    where: str  # path:line of the import
    eager: bool  # runs when the module is imported (not in a function, not TYPE_CHECKING)


def module_files() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def layer_of(module: str) -> str:
    if module == "orchestrator":
        return LAYERS[module]
    name = module
    while name and name != "orchestrator":
        if name in LAYERS:
            return LAYERS[name]
        name = name.rpartition(".")[0]
    raise AssertionError(f"module {module} has no layer: add it to LAYERS in {__file__}")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(node: ast.AST, eager: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import under ``node``, and whether it runs at import time."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, eager
        elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            yield from _imports(child, False)
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.body:
                yield from _imports(ast.Module(body=[stmt], type_ignores=[]), False)
            for stmt in child.orelse:
                yield from _imports(ast.Module(body=[stmt], type_ignores=[]), eager)
        else:
            yield from _imports(child, eager)


def _targets(
    node: ast.Import | ast.ImportFrom, module: str, is_package: bool, files: dict[str, Path]
) -> list[str]:
    """The names an import loads: ``from pkg import sub`` loads ``pkg.sub``
    when that is a module, else (a name defined in ``pkg``) ``pkg``."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parts = module.split(".") if is_package else module.split(".")[:-1]
        parts = parts[: len(parts) - node.level + 1]
        base = ".".join([*parts, *([node.module] if node.module else [])])
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]


def build_graph() -> tuple[dict[str, Path], list[Edge]]:
    files = module_files()

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    edges = []
    for module, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        for node, eager in _imports(tree, True):
            names = _targets(node, module, path.name == "__init__.py", files)
            for target in {t for n in names if (t := resolve(n)) and t != module}:
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                edges.append(Edge(module, target, where, eager))
    return files, edges


FILES, EDGES = build_graph()


def rank(module: str) -> int:
    return ORDER.index(layer_of(module))


def test_every_module_has_a_layer() -> None:
    missing = []
    for module in FILES:
        try:
            layer_of(module)
        except AssertionError as exc:
            missing.append(str(exc))
    assert not missing, "\n".join(missing)


def test_no_module_imports_a_higher_layer() -> None:
    upward = [
        f"{e.where}: {e.source} ({layer_of(e.source)}) imports {e.target} ({layer_of(e.target)})"
        for e in EDGES
        if rank(e.target) > rank(e.source)
    ]
    assert not upward, "imports pointing up the layers:\n" + "\n".join(sorted(upward))


def test_package_inits_import_nothing_above_their_modules() -> None:
    """``import orchestrator.errors`` runs ``orchestrator/__init__.py`` first:
    a package's ``__init__`` importing its client at import time would make
    every module of the package load the client."""
    wrong = []
    for package, path in FILES.items():
        if path.name != "__init__.py":
            continue
        lowest = min(rank(m) for m in FILES if m.startswith(f"{package}."))
        wrong += [
            f"{e.where}: {package}/__init__ imports {e.target} ({layer_of(e.target)}) at import "
            f"time, run by every module of the package (the lowest is {ORDER[lowest]})"
            for e in EDGES
            if e.source == package and e.eager and rank(e.target) > lowest
        ]
    assert not wrong, "\n".join(sorted(wrong))


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph``, as a path that ends where it started."""
    done: set[str] = set()
    for start in sorted(graph):
        path: list[str] = []
        on_path: set[str] = set()
        stack = [(start, iter(sorted(graph[start])))]
        if start in done:
            continue
        path.append(start)
        on_path.add(start)
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                on_path.discard(node)
                done.add(node)
            elif child in on_path:
                return [*path[path.index(child) :], child]
            elif child not in done:
                stack.append((child, iter(sorted(graph.get(child, ())))))
                path.append(child)
                on_path.add(child)
    return None


def test_no_import_cycle() -> None:
    graph: dict[str, set[str]] = {m: set() for m in FILES}
    where = {}
    for e in EDGES:
        graph[e.source].add(e.target)
        where[(e.source, e.target)] = e.where
    cycle = _cycle(graph)
    assert cycle is None, "import cycle:\n" + "\n".join(
        f"{a} -> {b}  ({where[(a, b)]})" for a, b in itertools.pairwise(cycle)
    )


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import orchestrator.store.tables", ["orchestrator.store.tables"]),
        ("from orchestrator import registry", ["orchestrator.registry"]),
        ("from orchestrator import Client, registry", ["orchestrator", "orchestrator.registry"]),
        ("from orchestrator.tools.calls import Tool", ["orchestrator.tools.calls"]),
        ("from . import threads", ["orchestrator.tools.threads"]),
        ("from ..engine.step import run_step", ["orchestrator.engine.step"]),
    ],
)
def test_the_graph_reads_imports_as_python_does(source: str, expected: list[str]) -> None:
    """The reader itself: each import form names the module Python would load."""
    node = ast.parse(source).body[0]
    assert isinstance(node, ast.Import | ast.ImportFrom)
    assert _targets(node, "orchestrator.tools.calls", False, FILES) == expected


#: What an engine module may take from SQLAlchemy and SQLModel: the
#: session and row types it is handed, errors it tells apart, and
#: ``set_committed_value`` (an entity's attribute set as stored, not as a write).
ENGINE_MAY_IMPORT = {
    "sqlmodel": {"Session"},
    "sqlalchemy": {"Row"},
    "sqlalchemy.orm.attributes": {"set_committed_value"},
    "sqlalchemy.exc": {"*"},
}


def test_the_engine_builds_no_sql() -> None:
    """Every statement lives in ``orchestrator.store``, behind a named
    operation: an engine module imports no statement builder (``select``,
    ``update``, ``col``, ``bindparam`` ...) and executes nothing itself."""
    wrong = []
    for module, path in FILES.items():
        if not module.startswith("orchestrator.engine"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        where = path.relative_to(ROOT)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                wrong += [
                    f"{where}:{node.lineno}: import {a.name}"
                    for a in node.names
                    if a.name.split(".")[0] in ("sqlalchemy", "sqlmodel")
                ]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in (
                "sqlalchemy",
                "sqlmodel",
            ):
                allowed = ENGINE_MAY_IMPORT.get(node.module or "", set())
                wrong += [
                    f"{where}:{node.lineno}: from {node.module} import {a.name}"
                    for a in node.names
                    if "*" not in allowed and a.name not in allowed
                ]
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("execute", "exec", "scalar", "scalars")
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in ("session", "connection", "db", "conn")
            ):
                wrong.append(f"{where}:{node.lineno}: {node.func.value.id}.{node.func.attr}(...)")
    assert not wrong, "SQL written in the engine (move it to orchestrator/store):\n" + "\n".join(
        wrong
    )
