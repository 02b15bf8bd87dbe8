"""The import graph of ``federator/``: no cycles, and no layer imports one above it.

The graph is read from the source with ``ast``, so it holds every import: at module level,
inside functions (lazy imports still make the importer depend on what it imports) and under
``if TYPE_CHECKING:``. Importing ``a.b.c`` also runs the packages ``a.b`` and ``a``, so an
import counts as one of each package on the way that is not the importer's own.

- Cycles and layers are checked on every import, type-only ones included: a cycle through
  ``if TYPE_CHECKING:`` cannot break an import order, but it still ties two modules so that
  neither can be read, or changed, without the other; and a lower layer must not even name a
  higher one.
"""

from __future__ import annotations

import ast
import configparser
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Lowest first. A module may import its own layer and the layers before it. The order follows
# the data (README, "The code follows the data"): SQL plans what to read, dispatch sends it
# where routing says, the node's stores answer. A layer that another consumes sits below it:
# planning (key predicates to IQv2 sub-queries, no I/O) is below dispatch and the plugins'
# SQL rules, which take its SubQuery; the cluster view is below both routing and the node,
# which read it without importing each other. An entry names a module or a package; the
# longest entry that matches a module decides its layer, and every module must match one.
LAYERS: list[tuple[str, list[str]]] = [
    ("foundation", ["federator", "federator.settings", "federator.partitioner", "federator.kafka", "federator.kafka_properties", "federator.broker",
                    "federator.formats", "federator.errors", "federator.metrics", "federator.auth", "federator.tls",
                    "federator.cancel", "federator.extras", "federator.memo"]),
    ("query model (IQv2)", ["federator.query"]),
    ("catalog", ["federator.catalog"]),
    ("stores", ["federator.store"]),
    # what owners run over their partitions' rows (pushed-down SQL in DuckDB, key joins)
    ("owners' work", ["federator.owner"]),
    ("planning", ["federator.plan"]),
    ("plugins and the registry", ["federator.plugin"]),
    ("cluster view", ["federator.cluster"]),
    ("node", ["federator.node"]),
    ("routing", ["federator.route"]),
    ("dispatch", ["federator.dispatch"]),
    ("sql", ["federator.sql"]),
    # `federator node` (federator/node_command.py) wires a node to its HTTP, Flight SQL and Postgres servers
    ("front doors", ["federator.http", "federator.flight", "federator.pgwire", "federator.dbapi", "federator.sqla",
                     "federator.client"]),
    ("commands", ["federator.cli", "federator.demo", "federator.node_command"]),
]


@dataclass(frozen=True)
class Allowed:
    importer: str  # a module or package
    imported: str  # a module or package
    lazy_only: bool  # only imports inside functions are allowed
    why: str


# Each entry is a known wrong-way import, to be removed; nothing else goes here.
ALLOWED: list[Allowed] = []


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    line: int
    lazy: bool  # inside a function
    type_only: bool  # under `if TYPE_CHECKING:`
    implicit: bool = False  # a package that importing a module below it runs


def modules(package_dir: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package at ``package_dir``."""
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


class _Imports(ast.NodeVisitor):
    def __init__(self, name: str, is_package: bool, known: dict[str, Path]) -> None:
        self.name, self.known = name, known
        self.package = name if is_package else name.rpartition(".")[0]
        self.edges: list[Edge] = []
        self._functions = 0
        self._type_checking = 0

    def _module_of(self, dotted: str) -> str | None:
        while dotted and dotted not in self.known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    def _add(self, target: str | None, node: ast.AST) -> None:
        if target is not None and target != self.name:
            self.edges.append(Edge(self.name, target, node.lineno, self._functions > 0, self._type_checking > 0))  # type: ignore[attr-defined]

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._functions += 1
        self.generic_visit(node)
        self._functions -= 1

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"):
            self._type_checking += 1
            for child in node.body:
                self.visit(child)
            self._type_checking -= 1
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(self._module_of(alias.name), node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            up = self.package.split(".")
            up = up[: len(up) - (node.level - 1)]
            base = ".".join(up + ([base] if base else []))
        for alias in node.names:
            full = f"{base}.{alias.name}"
            self._add(full if full in self.known else self._module_of(base), node)


def import_graph(package_dir: Path) -> tuple[dict[str, Path], list[Edge]]:
    """Every module of the package and every import among them (imports of anything else are left out)."""
    known = modules(package_dir)
    edges: list[Edge] = []
    for name, path in known.items():
        visitor = _Imports(name, path.name == "__init__.py", known)
        visitor.visit(ast.parse(path.read_text(), str(path)))
        for e in visitor.edges:
            edges.append(e)
            # the packages on the way run first, unless the importer is inside them already
            parts = e.imported.split(".")
            for i in range(1, len(parts)):
                pkg = ".".join(parts[:i])
                if pkg in known and not (name == pkg or name.startswith(pkg + ".")):
                    edges.append(Edge(name, pkg, e.line, e.lazy, e.type_only, implicit=True))
    return known, edges


def cycles(edges: list[Edge]) -> list[list[str]]:
    """The import cycles among ``edges`` (Tarjan's strongly connected components)."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.importer, set()).add(e.imported)
        graph.setdefault(e.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _within(name: str, entry: str) -> bool:
    # the root package names only itself: every module is inside it
    return name == entry or ("." in entry and name.startswith(entry + "."))


def layer_of(name: str, layers: list[tuple[str, list[str]]] = LAYERS) -> int | None:
    matches = [(len(entry), i) for i, (_, entries) in enumerate(layers) for entry in entries if _within(name, entry)]
    return max(matches)[1] if matches else None


def wrong_way(edges: list[Edge], layers: list[tuple[str, list[str]]] = LAYERS,
              allowed: list[Allowed] = ALLOWED) -> list[str]:
    """Every import of a higher layer that no entry of ``allowed`` covers, as a readable line."""
    out = []
    for e in edges:
        low, high = layer_of(e.importer, layers), layer_of(e.imported, layers)
        if low is None or high is None or high <= low:
            continue
        if any(_within(e.importer, a.importer) and _within(e.imported, a.imported) and (e.lazy or not a.lazy_only)
               for a in allowed):
            continue
        how = ", ".join(w for w, on in (("inside a function", e.lazy), ("type-only", e.type_only),
                                        ("by running its package", e.implicit)) if on)
        out.append(f"{e.importer} (line {e.line}, {layers[low][0]}) imports {e.imported} ({layers[high][0]})"
                   + (f" [{how}]" if how else ""))
    return sorted(set(out))


# ---- the checks on federator/ --------------------------------------------------------------
@pytest.fixture(scope="module")
def federator() -> tuple[dict[str, Path], list[Edge]]:
    return import_graph(ROOT / "federator")


def test_every_module_has_a_layer(federator) -> None:
    known, _ = federator
    assert [m for m in known if layer_of(m) is None] == [], "add the new module's package to LAYERS"


def test_no_import_cycles(federator) -> None:
    _, edges = federator
    assert cycles(edges) == []


def test_no_layer_imports_a_higher_one(federator) -> None:
    _, edges = federator
    assert wrong_way(edges) == []


def test_the_named_rules_hold(federator) -> None:
    """The rules as the issue states them, apart from the layer order that implies them."""
    _, edges = federator
    core = ("federator.store", "federator.query", "federator.catalog", "federator.formats")
    above_core = ("federator.sql", "federator.plan", "federator.route", "federator.dispatch", "federator.http",
                  "federator.node")
    rules = [(core, above_core), (("federator.route",), ("federator.node",)),
             (("federator.dispatch",), ("federator.sql", "federator.http"))]
    broken = [f"{e.importer} imports {e.imported} (line {e.line})" for e in edges for lower, higher in rules
              if any(_within(e.importer, m) for m in lower) and any(_within(e.imported, m) for m in higher)]
    assert broken == []


def test_each_allowed_exception_is_still_needed(federator) -> None:
    """An entry that nothing needs any more goes: the list only shrinks."""
    _, edges = federator
    for a in ALLOWED:
        assert any(_within(e.importer, a.importer) and _within(e.imported, a.imported) for e in edges), a


# The client alone (`pip install federator`, no extras): what these modules run, lazily too, may
# import only the standard library, the base requirements of setup.cfg, SQLAlchemy (the dialect's
# extra) and Superset (the engine spec's base class, imported only where Superset is installed).
CLIENT = ("federator.dbapi", "federator.sqla", "federator.client")
CLIENT_EXTRAS = ("sqlalchemy",)
ONLY_WHERE_PRESENT = {"superset"}


def _requirement_names(text: str) -> set[str]:
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return {re.match(r"[A-Za-z0-9_.-]+", line).group().lower().replace("-", "_") for line in lines if line}


def _external_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out - set(sys.stdlib_module_names) - {"federator", "__future__"}


def test_the_client_imports_only_what_its_install_brings(federator) -> None:
    known, edges = federator
    runs = {m for m in known if any(_within(m, root) for root in CLIENT)}
    todo = list(runs)
    while todo:
        importer = todo.pop()
        for e in edges:
            if e.importer == importer and not e.type_only and e.imported not in runs:
                runs.add(e.imported)
                todo.append(e.imported)
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    allowed = _requirement_names(cfg["options"]["install_requires"]) | ONLY_WHERE_PRESENT
    allowed |= {n for extra in CLIENT_EXTRAS for n in _requirement_names(cfg["options.extras_require"][extra])}
    imported = {name: sorted(m for m in runs if name in _external_imports(known[m]))
                for m in runs for name in _external_imports(known[m])}
    assert {name: by for name, by in imported.items() if name.lower() not in allowed} == {}
    assert "federator.dbapi.connection" in runs and "federator.query.position" in runs  # the walk follows imports


# ---- the checker itself, on a small made-up package ---------------------------------------
def test_the_checker_finds_cycles_and_wrong_way_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "app"
    (pkg / "low").mkdir(parents=True)
    (pkg / "high").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("from app.low.a import A\n")
    (pkg / "low" / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from app.low import b\nA = 1\n")
    (pkg / "low" / "b.py").write_text("from . import a\n\ndef f():\n    from app.high import h\n")
    (pkg / "high" / "__init__.py").write_text("")
    (pkg / "high" / "h.py").write_text("import app.low.b\nfrom ..low import c\n")
    (pkg / "low" / "c.py").write_text("import app.high.h\n")
    known, edges = import_graph(pkg)
    assert set(known) == {"app", "app.low", "app.low.a", "app.low.b", "app.low.c", "app.high", "app.high.h"}
    # a -> b only under TYPE_CHECKING (through the package app.low, which runs a), b -> a,
    # b -> h (inside a function) -> b, and c -> h -> c: one cycle of them all
    assert cycles(edges) == [["app.high.h", "app.low", "app.low.a", "app.low.b", "app.low.c"]]
    layers = [("base", ["app"]), ("low", ["app.low"]), ("high", ["app.high"])]
    found = wrong_way(edges, layers, [])
    assert any(line.startswith("app.low.b (line 4, low) imports app.high.h (high) [inside a function]") for line in found)
    assert any(line.startswith("app.low.c (line 1, low) imports app.high (high) [by running its package]")
               for line in found)
    allowed = [Allowed("app.low", "app.high", lazy_only=True, why="test")]
    assert [line for line in wrong_way(edges, layers, allowed) if "app.low.c" not in line] == []
    assert any("app.low.c" in line for line in wrong_way(edges, layers, allowed))  # not lazy: still wrong
