"""The layout rule, checked on the source text (``ast``), so the structure cannot drift one import at a time.

Layers, lowest first; a module imports only its own layer and those below it:

====  ==============================  ================================================================
rank  layer                           what it is
====  ==============================  ================================================================
0     ``gym_obs._version``,           the bottom: telemetry knows nothing of any other gym layer
      ``gym_obs.telemetry``
1     ``gym_obs.failures``            the failure model, on telemetry (names, redaction, spans)
1     ``gym_obs.dashboards``          dashboards as code, built from ``telemetry.names`` only
2     ``gym_obs.config``              the global config models; imports the telemetry model from
                                      ``telemetry.settings`` (the bottom layer owns what it reads)
3     ``gym_obs.client``              one downward pipeline, in :data:`CLIENT_ORDER`
4     ``gym_obs.server``              one pure-ASGI layer per concern
5     ``gym_obs`` (``__init__``)      the curated top-level API: it names client and server objects,
                                      so it sits above them and below what is built on it
6     ``gym_obs.harness``             built on the public API
7     ``gym_obs.cli``                 the ``gym-obs`` command: may import everything
====  ==============================  ================================================================

Every import counts: module level, inside functions (a lazy import is still an arrow) and under
``TYPE_CHECKING`` (a type-only cycle is still a cycle for the reader and for mypy). ``import a.b.c`` points
at ``a.b.c``; the parent packages it executes on the way are not arrows (otherwise every package
``__init__`` re-exporting its modules would be a cycle).

Also checked: no import cycle anywhere in ``src/``; outside a package ``__init__`` (and the compatibility
module ``client/http_client.py``) a module's ``__all__`` names only what it defines; tests import public
names only (no ``_private`` module or name), except the short :data:`PRIVATE_SEAMS` allow-list.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
TESTS = ROOT / "tests"
PACKAGE = "gym_obs"

#: Rank of each top-level part of ``gym_obs`` (see the module docstring); ``""`` is ``gym_obs/__init__``.
LAYERS: dict[str, int] = {
    "_version": 0,
    "telemetry": 0,
    "failures": 1,
    "dashboards": 1,
    "config": 2,
    "client": 3,
    "server": 4,
    "": 5,
    "harness": 6,
    "cli": 7,
}

#: Inside ``client/`` a module imports only modules listed before it (issue 17's target pipeline).
CLIENT_ORDER: list[str] = [
    "_options",
    "errors",
    "_retry",
    "pool",
    "_pool_metrics",
    "_sessions",
    "_observe",
    "_send",
    "boundary",
    "_request",
    "servers",
    "concurrency",
    "__init__",
    "http_client",
]

#: Modules whose ``__all__`` may name what they import: package ``__init__`` files are implied; this is the
#: one documented compatibility module users import (NeMo Gym code is ported against it).
REEXPORT_MODULES: frozenset[str] = frozenset({"gym_obs.client.http_client"})

#: Private seams tests really need: ``module`` (any name) or ``module:name``, each with why.
PRIVATE_SEAMS: dict[str, str] = {
    "gym_obs.client._retry": "the pure retry decision tables are tested directly, row by row",
    "gym_obs.failures._base": "the hard limits remote input is checked against (tests plant inputs at them)",
    "gym_obs.telemetry._sdk_env": "the import-time repair of OTEL_* values, run again on a planted env",
}


# --- the checker ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Import:
    """One import statement's arrow: ``source`` imports ``target`` (both dotted module names)."""

    source: str
    target: str
    file: str  # relative to the source root, for messages
    line: int
    type_checking: bool

    def where(self) -> str:
        kind = " (under TYPE_CHECKING)" if self.type_checking else ""
        return f"{self.file}:{self.line}: {self.source} imports {self.target}{kind}"


@dataclass
class Module:
    name: str
    file: str  # relative to the source root, for messages
    tree: ast.Module
    is_package: bool
    imports: list[Import] = field(default_factory=list)


def _module_name(path: Path, root: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk_imports(
    node: ast.AST, type_checking: bool = False
) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import in ``node`` (functions included), flagged when it sits under ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, type_checking
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.body:
                yield from _walk_imports(ast.Module(body=[stmt], type_ignores=[]), True)
            for stmt in child.orelse:
                yield from _walk_imports(ast.Module(body=[stmt], type_ignores=[]), type_checking)
        else:
            yield from _walk_imports(child, type_checking)


def load_modules(src: Path, package: str = PACKAGE) -> dict[str, Module]:
    """Parse every module under ``src/<package>`` and resolve its imports of ``package`` to modules."""
    modules: dict[str, Module] = {}
    for path in sorted((src / package).rglob("*.py")):
        name, is_package = _module_name(path, src)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        modules[name] = Module(name, str(path.relative_to(src)), tree, is_package)
    for module in modules.values():
        for node, type_checking in _walk_imports(module.tree):
            for target, line in _targets(node, module, modules, package):
                module.imports.append(Import(module.name, target, module.file, line, type_checking))
    return modules


def _targets(
    node: ast.Import | ast.ImportFrom, module: Module, modules: dict[str, Module], package: str
) -> Iterator[tuple[str, int]]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name == package or alias.name.startswith(package + "."):
                yield alias.name, node.lineno
        return
    base = node.module or ""
    if node.level:
        here = module.name.split(".")
        anchor = here if module.is_package else here[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([base] if base else []))
    if base != package and not base.startswith(package + "."):
        return
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        yield (submodule if submodule in modules else base), node.lineno


def _layer(name: str, package: str = PACKAGE) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_violations(modules: dict[str, Module], layers: dict[str, int] = LAYERS) -> list[str]:
    """Imports that go up a layer (or into a part of the package no layer names)."""
    problems: list[str] = []
    for module in modules.values():
        source_layer = _layer(module.name)
        if source_layer not in layers:
            problems.append(f"{module.file}: {module.name} is in no layer of LAYERS")
            continue
        for imp in module.imports:
            target_layer = _layer(imp.target)
            if target_layer not in layers:
                problems.append(f"{imp.where()}: target is in no layer of LAYERS")
            elif layers[target_layer] > layers[source_layer]:
                problems.append(
                    f"{imp.where()}: upward import, layer {source_layer or 'gym_obs'!r}"
                    f" (rank {layers[source_layer]}) must not import layer"
                    f" {target_layer or 'gym_obs'!r} (rank {layers[target_layer]})"
                )
    return problems


def client_order_violations(
    modules: dict[str, Module], order: list[str] = CLIENT_ORDER, package: str = PACKAGE
) -> list[str]:
    """Inside ``client/``: a module missing from the order, or an import of a module not listed above it."""
    prefix = f"{package}.client"

    def short(name: str) -> str:
        return "__init__" if name == prefix else name.removeprefix(prefix + ".")

    problems: list[str] = []
    for module in modules.values():
        if module.name != prefix and not module.name.startswith(prefix + "."):
            continue
        me = short(module.name)
        if me not in order:
            problems.append(f"{module.file}: client module {me!r} is not in CLIENT_ORDER")
            continue
        for imp in module.imports:
            if imp.target != prefix and not imp.target.startswith(prefix + "."):
                continue
            other = short(imp.target)
            if other not in order or order.index(other) >= order.index(me):
                problems.append(
                    f"{imp.where()}: client module {me!r} may import only modules"
                    f" listed above it in CLIENT_ORDER, and {other!r} is not"
                )
    return problems


def import_cycles(modules: dict[str, Module]) -> list[list[str]]:
    """Strongly connected components of more than one module (or a module importing itself), sorted."""
    graph = {
        name: sorted({imp.target for imp in m.imports if imp.target in modules})
        for name, m in modules.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(start: str) -> None:  # iterative Tarjan: deep import chains must not hit the recursion limit
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    cycles.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return sorted(cycles)


def describe_cycle(component: list[str], modules: dict[str, Module]) -> str:
    """The arrows inside one cycle, each with its file and line, so the fix is one edit away."""
    members = set(component)
    arrows = [imp.where() for name in component for imp in modules[name].imports if imp.target in members]
    return "import cycle between " + ", ".join(component) + ":\n    " + "\n    ".join(arrows)


def _defined_names(tree: ast.Module) -> set[str]:
    """Names a module binds itself at top level (classes, functions, assignments), not imports."""
    names: set[str] = set()

    def collect(body: list[ast.stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(stmt.name)
            elif isinstance(stmt, ast.Assign):
                for target in stmt.targets:
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            elif isinstance(stmt, ast.AnnAssign | ast.AugAssign) and isinstance(stmt.target, ast.Name):
                names.add(stmt.target.id)
            elif isinstance(stmt, ast.TypeAlias) and isinstance(stmt.name, ast.Name):
                names.add(stmt.name.id)
            elif isinstance(stmt, ast.If | ast.Try):
                collect(stmt.body)
                collect(stmt.orelse)
                for handler in getattr(stmt, "handlers", []):
                    collect(handler.body)
                collect(getattr(stmt, "finalbody", []))

    collect(tree.body)
    return names


def _all_names(tree: ast.Module) -> list[str] | None:
    for stmt in tree.body:
        targets = (
            stmt.targets
            if isinstance(stmt, ast.Assign)
            else [stmt.target]
            if isinstance(stmt, ast.AnnAssign)
            else []
        )
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            value = stmt.value
            if isinstance(value, ast.List | ast.Tuple):
                return [
                    e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
                ]
    return None


def reexport_violations(modules: dict[str, Module], allowed: frozenset[str] = REEXPORT_MODULES) -> list[str]:
    """Names in a non-``__init__`` module's ``__all__`` that the module does not define itself."""
    problems: list[str] = []
    for module in modules.values():
        if module.is_package or module.name in allowed:
            continue
        exported = _all_names(module.tree)
        if exported is None:
            continue
        defined = _defined_names(module.tree)
        for name in exported:
            if name not in defined:
                problems.append(
                    f"{module.file}: __all__ of {module.name} names"
                    f" {name!r}, which it does not define (export it from where it is defined, or a package"
                    " __init__)"
                )
    return problems


def private_test_imports(
    tests: Path, seams: dict[str, str] = PRIVATE_SEAMS, package: str = PACKAGE
) -> list[str]:
    """Imports in ``tests`` of a ``_private`` gym_obs module or name not in :data:`PRIVATE_SEAMS`."""
    problems: list[str] = []
    for path in sorted(tests.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            pairs: list[tuple[str, str | None]] = []
            if isinstance(node, ast.Import):
                pairs = [(alias.name, None) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                pairs = [(node.module, alias.name) for alias in node.names]
            for mod, name in pairs:
                if mod != package and not mod.startswith(package + "."):
                    continue
                private_module = any(part.startswith("_") for part in mod.split("."))
                private_name = name is not None and name.startswith("_")
                if not (private_module or private_name):
                    continue
                full = f"{mod}.{name}" if name else mod
                if mod in seams or f"{mod}:{name}" in seams or (name and full in seams):
                    continue
                shown = f"from {mod} import {name}" if name else f"import {mod}"
                problems.append(f"{path.relative_to(tests.parent)}:{node.lineno}: `{shown}` is private")
    return problems


# --- the rule on this repository --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def modules() -> dict[str, Module]:
    return load_modules(SRC)


def test_imports_only_go_down_the_layers(modules: dict[str, Module]) -> None:
    problems = layer_violations(modules)
    assert not problems, "\n".join(problems)


def test_client_modules_import_only_modules_listed_above_them(modules: dict[str, Module]) -> None:
    problems = client_order_violations(modules)
    assert not problems, "\n".join(problems)


def test_no_import_cycles(modules: dict[str, Module]) -> None:
    cycles = import_cycles(modules)
    assert not cycles, "\n".join(describe_cycle(cycle, modules) for cycle in cycles)


def test_all_names_only_what_the_module_defines(modules: dict[str, Module]) -> None:
    problems = reexport_violations(modules)
    assert not problems, "\n".join(problems)


def test_invalid_failure_report_is_exported_from_one_module(modules: dict[str, Module]) -> None:
    exporters = sorted(
        m.name
        for m in modules.values()
        if not m.is_package and "InvalidFailureReport" in (_all_names(m.tree) or [])
    )
    assert len(exporters) == 1, exporters


def test_tests_import_public_names_only() -> None:
    problems = private_test_imports(TESTS)
    assert not problems, "\n".join(problems)
