"""Attribute value types spelled out here, so type checking does not depend on how an upstream release
spells its alias (``opentelemetry.util.types.AttributeValue`` changed shape between 1.45 patch releases and
mypy rejects some spellings as a type)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

__all__ = ["AttributeValue"]

AttributeValue: TypeAlias = (
    str | bool | int | float | Sequence[str] | Sequence[bool] | Sequence[int] | Sequence[float]
)
