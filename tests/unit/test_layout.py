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
    "_reply_watch",
    "model_calls",
    "errors",
    "_retry",
    "_fair_connector",
    "pool",
    "_pool_metrics",
    "_sessions",
    "_observe",
    "_redirects",
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
    "gym_obs.client._sessions:configure": "process config installed unvalidated, to test the checks after it",
    "gym_obs.client._sessions:current_config": "which process config the pools were built from",
    "gym_obs.failures._base": "the hard limits remote input is checked against, and fresh event ids",
    "gym_obs.failures._codec": "the raw encoder plants hostile reports that skip validation; its byte cap",
    "gym_obs.failures._shrink:final_chain": "which events the stated drop rule kept on the final chain",
    "gym_obs.harness.servers._common:failure_for_call": "the demo servers' failure mapping, without servers",
    "gym_obs.telemetry._sdk_env": "the import-time repair of OTEL_* values, run again on a planted env",
    "gym_obs.telemetry._otlp_json": "the direct OTLP/JSON encoder, compared with the official one",
    "gym_obs.telemetry._otlp_proto": "the direct OTLP protobuf encoder, byte for byte against the official",
    "gym_obs.telemetry._fanout": "one reader feeding several exporters, with a hung and a failing one",
    "gym_obs.telemetry._exporters:SafeMetricExporter": "the never-raising wrapper around a fan-out",
    "gym_obs.telemetry._exporters:otlp_span_exporter": "the OTLP span exporters gym builds, on receivers",
    "gym_obs.telemetry._exemplars": "which spans make a point eligible for an exemplar",
    "gym_obs.server._session_routing:owner_slot": "which worker owns a session id (the routing hash)",
    "gym_obs.server._failure_reply:boundary_for_server_type": "the server type -> failure boundary table",
    "gym_obs.server._failure_reply:reply_status": "the status rule of failure replies, row by row",
    "gym_obs.server._request_limits:RequestLimits": "the request-head limits handed to uvicorn",
    "gym_obs.server._span:ServerSpanMiddleware": "the native SERVER span on a bare ASGI app",
    "gym_obs.server._model_call_read:read_json_reply": "the usual-reply reader against genai's reader",
    "gym_obs.server._span:_split_host": "Host header parsing (server.address / server.port) row by row",
    "gym_obs.server._native_telemetry:disable_native_telemetry": "FastAPI's own telemetry off, as servers do",
    "gym_obs.server._native_telemetry:drop_exception_observer": "FastAPI's dead exception frame, dropped",
    "gym_obs.server._server_errors": "the gym frame atop FastAPI's stack, against Starlette's error layer",
    "gym_obs.server._steps:RequestSteps": "the gym frame with the error step alone, as Starlette's layer",
    "gym_obs.server._exchange": "the request's exchange: the one send wrapper the handlers' side gets",
    "gym_obs.server._access_log:QueryFreeAccessLog": "security rule: access lines never carry a query",
    "gym_obs.server._served_config:served_config": "security rule: the head server never serves a secret",
    "gym_obs.server._validation_log:summarize_validation_errors": "security rule: no body in 422 logs",
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
    """One parsed source file and the arrows out of it."""

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
            yield from _walk_imports(ast.Module(body=child.body, type_ignores=[]), True)
            yield from _walk_imports(ast.Module(body=child.orelse, type_ignores=[]), type_checking)
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
            for target, line in dict.fromkeys(_targets(node, module, modules, package)):  # one per arrow
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


def _layer(name: str) -> str:
    """``gym_obs.client.pool`` -> ``client``; ``gym_obs`` itself (its ``__init__``) -> ``""``."""
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
            elif isinstance(stmt, ast.If | ast.Try):
                collect(stmt.body)
                collect(stmt.orelse)
                for handler in getattr(stmt, "handlers", []):
                    collect(handler.body)
                collect(getattr(stmt, "finalbody", []))

    collect(tree.body)
    return names


_NOT_LITERAL = "<__all__ is not a literal list of strings>"


def _all_names(tree: ast.Module) -> list[str] | None:
    """The names of a module's top-level ``__all__`` (``None`` without one); the rule reads only literals,
    so anything else is reported rather than skipped."""
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, ast.AnnAssign | ast.AugAssign):
            targets, value = [stmt.target], stmt.value
        else:
            continue
        if not any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            continue
        if isinstance(stmt, ast.AugAssign) or not isinstance(value, ast.List | ast.Tuple):
            return [_NOT_LITERAL]
        names = [e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        return names if len(names) == len(value.elts) else [_NOT_LITERAL]
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


def test_the_checker_sees_the_whole_tree(modules: dict[str, Module]) -> None:
    """Guard against a rule that passes because it parsed nothing: known arrows are found."""
    assert len(modules) > 80
    arrows = {(imp.source, imp.target) for m in modules.values() for imp in m.imports}
    assert ("gym_obs.config", "gym_obs.telemetry.settings") in arrows
    assert ("gym_obs.dashboards.files", "gym_obs.dashboards._boards") in arrows  # a lazy import counts
    type_only = {(imp.source, imp.target) for m in modules.values() for imp in m.imports if imp.type_checking}
    assert ("gym_obs", "gym_obs.server") in type_only


# --- the checker fails on planted mistakes ----------------------------------------------------------------


def _plant(root: Path, files: dict[str, str]) -> Path:
    """A small source tree: ``files`` maps a path under ``root`` to its text; packages get an ``__init__``."""
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    for directory in {p.parent for p in root.rglob("*.py")}:
        (directory / "__init__.py").touch()
    return root


_CLEAN = {
    "src/gym_obs/telemetry/names.py": "X = 1\n__all__ = ['X']\n",
    "src/gym_obs/telemetry/spans.py": "from gym_obs.telemetry import names\n",
    "src/gym_obs/failures/event.py": "from gym_obs.telemetry.names import X\n",
    "src/gym_obs/client/errors.py": "from gym_obs.failures import event\n",
    "src/gym_obs/client/_sessions.py": "from gym_obs.client.errors import *\n",
    "src/gym_obs/server/app.py": "from gym_obs.client import _sessions\nfrom . import sub\n",
    "src/gym_obs/server/sub.py": "from ..telemetry import names\n",
}


def _all_problems(src: Path) -> list[str]:
    modules = load_modules(src)
    cycles = [describe_cycle(cycle, modules) for cycle in import_cycles(modules)]
    return (
        layer_violations(modules) + client_order_violations(modules) + cycles + reexport_violations(modules)
    )


def test_a_clean_planted_tree_passes(tmp_path: Path) -> None:
    src = _plant(tmp_path, _CLEAN) / "src"
    modules = load_modules(src)
    arrows = {(imp.source, imp.target) for m in modules.values() for imp in m.imports}
    assert ("gym_obs.server.app", "gym_obs.server.sub") in arrows  # relative imports resolve
    assert ("gym_obs.server.sub", "gym_obs.telemetry.names") in arrows
    assert _all_problems(src) == []


def test_the_checker_fails_on_a_planted_cycle(tmp_path: Path) -> None:
    src = (
        _plant(
            tmp_path,
            {
                **_CLEAN,
                "src/gym_obs/telemetry/spans.py": "from gym_obs.telemetry import names\n",
                "src/gym_obs/telemetry/names.py": (
                    "from typing import TYPE_CHECKING\n"
                    "if TYPE_CHECKING:\n"
                    "    from gym_obs.telemetry.spans import S\n"
                ),
            },
        )
        / "src"
    )
    modules = load_modules(src)
    assert import_cycles(modules) == [["gym_obs.telemetry.names", "gym_obs.telemetry.spans"]]
    message = describe_cycle(import_cycles(modules)[0], modules)
    assert "gym_obs/telemetry/names.py:3: gym_obs.telemetry.names imports gym_obs.telemetry.spans" in message
    assert "(under TYPE_CHECKING)" in message
    assert "gym_obs/telemetry/spans.py:1: gym_obs.telemetry.spans imports gym_obs.telemetry.names" in message


def test_the_checker_fails_on_a_planted_upward_import(tmp_path: Path) -> None:
    src = (
        _plant(
            tmp_path,
            {
                **_CLEAN,
                "src/gym_obs/telemetry/spans.py": "def later():\n    from gym_obs.client.errors import E\n",
                "src/gym_obs/failures/event.py": "import gym_obs.server.app\n",
            },
        )
        / "src"
    )
    problems = layer_violations(load_modules(src))
    assert problems == [
        "gym_obs/failures/event.py:1: gym_obs.failures.event imports gym_obs.server.app: upward import,"
        " layer 'failures' (rank 1) must not import layer 'server' (rank 4)",
        "gym_obs/telemetry/spans.py:2: gym_obs.telemetry.spans imports gym_obs.client.errors: upward import,"
        " layer 'telemetry' (rank 0) must not import layer 'client' (rank 3)",
    ]


def test_the_checker_fails_on_a_client_module_importing_one_listed_below_it(tmp_path: Path) -> None:
    src = (
        _plant(
            tmp_path,
            {**_CLEAN, "src/gym_obs/client/errors.py": "from gym_obs.client._sessions import pools\n"},
        )
        / "src"
    )
    modules = load_modules(src)
    assert client_order_violations(modules) == [
        "gym_obs/client/errors.py:1: gym_obs.client.errors imports gym_obs.client._sessions: client module"
        " 'errors' may import only modules listed above it in CLIENT_ORDER, and '_sessions' is not"
    ]
    assert len(import_cycles(modules)) == 1  # errors <-> _sessions


def test_the_checker_fails_on_a_reexport_and_a_private_test_import(tmp_path: Path) -> None:
    root = _plant(
        tmp_path,
        {
            **_CLEAN,
            "src/gym_obs/failures/event.py": (
                "from gym_obs.telemetry.names import X\n__all__ = ['X', 'Y']\nY = 2\n"
            ),
            "tests/test_x.py": (
                "from gym_obs.telemetry._state import STATE\n"
                "from gym_obs.telemetry.names import _hidden\n"
                "import gym_obs.client._sessions\n"
                "from gym_obs.telemetry._sdk_env import repair_sdk_environment\n"  # allow-listed
                "from gym_obs.telemetry.names import X\n"
            ),
        },
    )
    assert reexport_violations(load_modules(root / "src")) == [
        "gym_obs/failures/event.py: __all__ of gym_obs.failures.event names 'X', which it does not define"
        " (export it from where it is defined, or a package __init__)"
    ]
    assert private_test_imports(root / "tests") == [
        "tests/test_x.py:1: `from gym_obs.telemetry._state import STATE` is private",
        "tests/test_x.py:2: `from gym_obs.telemetry.names import _hidden` is private",
        "tests/test_x.py:3: `import gym_obs.client._sessions` is private",
    ]
