"""The fault plan: which server, which route, how often, and what goes wrong.

A plan is YAML validated by pydantic so that a typo (``actoin:``) is an error that names the key instead of
a run that silently injects nothing. The same model is the body of the control route, so a running system
can be switched from one plan to another without a restart.
"""

from __future__ import annotations

import builtins
import fnmatch
import random
import threading
from collections import Counter
from pathlib import Path
from typing import Any, Final, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

__all__ = [
    "CANARY_SECRET",
    "FAULT_ACTIONS",
    "ROLES",
    "FaultAction",
    "FaultPlan",
    "FaultPlanError",
    "FaultRule",
    "FaultSelector",
    "format_validation_error",
    "load_fault_plan",
    "parse_fault_plan",
]

FaultAction = Literal[
    "raise",
    "status",
    "delay",
    "hang",
    "disconnect",
    "disconnect_mid_body",
    "bad_failure_report",
    "huge_body",
    "secret_in_error",
    "malformed_body",
]
FAULT_ACTIONS: Final[tuple[str, ...]] = get_args(FaultAction)
ROLES: Final = ("agent", "model", "resources")

#: The known secret ``secret_in_error`` plants; tests prove it never reaches telemetry, logs or rows.
#: Shaped like an OpenAI key so that it is exactly what a scrubber must recognise.
CANARY_SECRET: Final = "sk-gymobsCANARY7f3d9a1b5c2e8f4a6d0b"

_FIELDS_FOR: Final[dict[str, frozenset[str]]] = {
    "raise": frozenset({"exception"}),
    "status": frozenset({"status"}),
    "delay": frozenset({"seconds"}),
    "hang": frozenset({"seconds"}),
}
_OPTIONAL_FIELDS: Final = ("exception", "status", "seconds")


class FaultPlanError(ValueError):
    """A fault plan that cannot be used; the message names the file and the bad key."""


class FaultRule(BaseModel):
    """One fault: where it applies, how often, and what it does."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    server: str = Field(min_length=1, description="a role (agent | model | resources) or a server name")
    route: str = Field(min_length=1, description="request path, e.g. /verify; shell wildcards allowed")
    rate: float = Field(default=1.0, ge=0.0, le=1.0, description="fraction of matching requests")
    action: FaultAction
    exception: str | None = Field(default=None, description="builtin exception class name, for raise")
    status: int | None = Field(default=None, ge=400, le=599, description="reply status, for status")
    seconds: float | None = Field(default=None, gt=0, le=3600, description="for delay and hang")

    @model_validator(mode="after")
    def _check_action_fields(self) -> FaultRule:
        allowed = _FIELDS_FOR.get(self.action, frozenset())
        for name in _OPTIONAL_FIELDS:
            if getattr(self, name) is not None and name not in allowed:
                raise ValueError(f"{name!r} does not apply to action {self.action!r}")
        if self.action == "status" and self.status is None:
            raise ValueError("action 'status' needs 'status' (an HTTP status 400-599)")
        if self.action == "delay" and self.seconds is None:
            raise ValueError("action 'delay' needs 'seconds'")
        if self.action == "raise":
            if self.exception is None:
                raise ValueError(
                    "action 'raise' needs 'exception' (a builtin Exception class, e.g. ZeroDivisionError)"
                )
            _exception_class(self.exception)
        return self

    @field_validator("route")
    @classmethod
    def _check_route(cls, route: str) -> str:
        if not route.startswith(("/", "*")):
            raise ValueError(f"must be a request path starting with '/' (e.g. /verify), got {route!r}")
        return route

    def exception_class(self) -> type[Exception]:
        """The builtin exception type ``raise`` raises (``RuntimeError`` for a rule built without one)."""
        return _exception_class(self.exception or "RuntimeError")

    def applies_to(self, role: str, server_name: str) -> bool:
        return self.server in (role, server_name)

    def matches_path(self, path: str) -> bool:
        return self.route == path or fnmatch.fnmatchcase(path, self.route)


def _exception_class(name: str) -> type[Exception]:
    candidate = getattr(builtins, name, None)
    if not (isinstance(candidate, type) and issubclass(candidate, Exception)):
        raise ValueError(f"exception {name!r} is not a builtin Exception class (e.g. ZeroDivisionError)")
    try:
        candidate("injected fault")
    except Exception:  # e.g. UnicodeDecodeError needs five arguments
        raise ValueError(
            f"exception {name!r} cannot be raised with a message; pick another (e.g. ZeroDivisionError)"
        ) from None
    return candidate


class FaultPlan(BaseModel):
    """A list of fault rules; the first rule that matches a request and wins its coin flip applies."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    faults: list[FaultRule] = Field(default_factory=list)
    _source: str = PrivateAttr(default="fault plan")  # the file it came from, for error messages

    @property
    def source(self) -> str:
        return self._source

    def for_server(self, role: str, server_name: str) -> FaultPlan:
        """The rules that concern one server, so a server keeps only what it applies."""
        return FaultPlan(faults=[rule for rule in self.faults if rule.applies_to(role, server_name)])


def format_validation_error(error: ValidationError) -> str:
    """One line per problem, each naming the key path (``faults[0].action``)."""
    lines = []
    for item in error.errors():
        path = ""
        for part in item["loc"]:
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        lines.append(f"{path or '<plan>'}: {item['msg']}")
    return "; ".join(lines)


def parse_fault_plan(data: Any, *, source: str = "fault plan") -> FaultPlan:
    """Validate a decoded plan (from YAML or a control request)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise FaultPlanError(f"{source}: expected a mapping with a 'faults' list, got {type(data).__name__}")
    try:
        return FaultPlan.model_validate(data)
    except ValidationError as exc:
        raise FaultPlanError(f"{source}: {format_validation_error(exc)}") from None


def load_fault_plan(path: str | Path) -> FaultPlan:
    """Read and validate a YAML plan file; every problem is a ``FaultPlanError`` naming the file."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise FaultPlanError(f"{source}: cannot read fault plan: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise FaultPlanError(f"{source}: not a UTF-8 text file (expected a YAML fault plan)") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise FaultPlanError(f"{source}: not valid YAML{_yaml_where(exc)}") from None
    if data is None:
        raise FaultPlanError(f"{source}: the plan is empty; expected a mapping with a 'faults' list")
    plan = parse_fault_plan(data, source=source)
    plan._source = source
    return plan


def _yaml_where(exc: yaml.YAMLError) -> str:
    """Where and what, on one line (PyYAML's own message spans several, with a source excerpt)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{where}: {problem}" if problem else where


class FaultSelector:
    """Picks the fault (if any) for a request and counts what it injected. Thread-safe, swappable."""

    def __init__(
        self, role: str, server_name: str, plan: FaultPlan | None = None, *, seed: int | None = None
    ):
        self.role = role
        self.server_name = server_name
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._plan = FaultPlan()
        self._injected: Counter[str] = Counter()
        if plan is not None:
            self.set_plan(plan)

    @property
    def plan(self) -> FaultPlan:
        return self._plan

    def set_plan(self, plan: FaultPlan) -> FaultPlan:
        """Replace the active plan with the rules of ``plan`` that concern this server."""
        mine = plan.for_server(self.role, self.server_name)
        with self._lock:
            self._plan = mine
        return mine

    def pick(self, path: str) -> FaultRule | None:
        rules = self._plan.faults
        if not rules:
            return None
        for rule in rules:
            if rule.matches_path(path) and (rule.rate >= 1.0 or self._random.random() < rule.rate):
                with self._lock:
                    self._injected[rule.action] += 1
                return rule
        return None

    def injected(self) -> dict[str, int]:
        """Faults injected so far, by action."""
        with self._lock:
            return dict(self._injected)
