"""``caused_by(error, "ZeroDivisionError")``: ask a failure's cause chain about an exception type by name.

A root cause that crossed an HTTP hop arrives as a :class:`ForeignFailure` (its type name and message
only: the type itself may not even exist in this process), so ``isinstance`` cannot answer "was this
caused by ZeroDivisionError?". This walks the explicit ``__cause__`` chain (never the implicit
``__context__``: causes are explicit in gym_obs) and compares type names, for remote and local exceptions
alike.
"""

from __future__ import annotations

from typing import Final

from gym_obs.failures.event import ForeignFailure, exception_type_name

__all__ = ["cause_types", "caused_by", "matches_type"]

_MAX_CHAIN: Final = 1000


def _names(type_name: str) -> tuple[str, str]:
    """The full name and its last dotted part (``json.decoder.JSONDecodeError`` -> ``JSONDecodeError``)."""
    return type_name, type_name.rpartition(".")[2]


def matches_type(error: BaseException, type_name: str | type[BaseException]) -> bool:
    """Whether ``error`` is of the named type: the exact ``module.QualName`` or just ``QualName``.

    A local exception also matches the names of its base classes (``ArithmeticError`` for a
    ``ZeroDivisionError``); a :class:`ForeignFailure` knows its own type's name only.
    """
    wanted = type_name if isinstance(type_name, str) else _type_name(type_name)
    if isinstance(error, ForeignFailure):
        full, short = _names(error.exception_type)
        return wanted in (full, short)
    for cls in type(error).__mro__:
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            continue
        full, short = _names(_type_name(cls))
        if wanted in (full, short):
            return True
    return False


def _type_name(cls: type[BaseException]) -> str:
    module = getattr(cls, "__module__", None)
    name = getattr(cls, "__qualname__", None) or cls.__name__
    return name if module in (None, "builtins") else f"{module}.{name}"


def _chain(error: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    seen: set[int] = set()
    node: BaseException | None = error
    while node is not None and id(node) not in seen and len(chain) < _MAX_CHAIN:
        seen.add(id(node))
        chain.append(node)
        node = node.__cause__
    return chain


def caused_by(error: BaseException, type_name: str | type[BaseException]) -> bool:
    """Whether ``error`` or any exception in its ``__cause__`` chain is of the named type
    (``caused_by(err, "ZeroDivisionError")``; a type works too). Cycle-safe, never raises."""
    return any(matches_type(node, type_name) for node in _chain(error))


def cause_types(error: BaseException) -> list[str]:
    """The type names along ``error``'s cause chain, outermost first (a ``ForeignFailure`` by its type's)."""
    return [exception_type_name(node) for node in _chain(error)]
