"""What a model call's names make of it, worked out once per combination: its metric points (the model label
decided) and the SERVER span's name attributes (the provider, the scrubbed request and reply models).

A model server sees few combinations of (server, operation, request model, reply model); working each out
per call cost the model-call layer a few microseconds (the label decision, the points' lookup, two scrub-cache
lookups and the dict entries). :class:`CallShapes` keeps them, bounded: the models are text a peer chose.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from gym_obs.server._model_call_points import CallPoints
from gym_obs.telemetry import names
from gym_obs.telemetry.genai import span_text
from gym_obs.telemetry.metrics import Instruments

__all__ = ["CallShape", "CallShapes", "ShapeKey"]

#: (server name, operation, request model, reply model): the names a call's shape depends on.
ShapeKey = tuple[str, str, "str | None", "str | None"]

#: Combinations kept before the cache starts over (model names come from peers: bounded like every cache).
MAX_SHAPES: Final = 1024


class CallShape:
    """One combination's points and span names. ``names`` holds, in the span's order, the provider and the
    scrubbed models; ``models`` the models alone (a call with an unparsable reason puts it between them)."""

    __slots__ = ("instruments", "models", "names", "points")

    def __init__(self, points: CallPoints, provider: str | None, models: dict[str, Any]) -> None:
        self.points = points
        self.instruments = points.instruments  # read per call: the points are for these instruments only
        self.models = models
        self.names = models if provider is None else {names.ATTR_GEN_AI_PROVIDER_NAME: provider, **models}


class CallShapes(dict[ShapeKey, CallShape]):
    """The shapes of one layer's calls, by :data:`ShapeKey`; :meth:`make` adds the one a lookup missed (or
    whose instruments were replaced). Points are shared by the shapes with the same metric labels."""

    def __init__(self, provider: str | None, allowed_models: Iterable[str]) -> None:
        super().__init__()
        self.provider = provider
        self.allowed_models = frozenset(allowed_models)
        # (server name, operation, model label or None) -> its points; bounded by the label rule
        self._points: dict[tuple[str, str, str | None], CallPoints] = {}

    def make(self, key: ShapeKey, instruments: Instruments) -> CallShape:
        server, operation, asked, answered = key
        shown = span_text(asked)
        models: dict[str, Any] = {}
        if shown is not None:
            models[names.ATTR_GEN_AI_REQUEST_MODEL] = shown
        if answered is not None:  # usually the model asked for: scrubbed once
            models[names.ATTR_GEN_AI_RESPONSE_MODEL] = shown if answered == asked else span_text(answered)
        if len(self) >= MAX_SHAPES:
            self.clear()
        points = self._points_for(server, operation, asked or answered, instruments)
        shape = self[key] = CallShape(points, self.provider, models)
        return shape

    def _points_for(
        self, server: str, operation: str, model: str | None, instruments: Instruments
    ) -> CallPoints:
        label: str | None = None
        if self.allowed_models:
            label = model if model in self.allowed_models else names.GEN_AI_MODEL_OTHER
        key = (server, operation, label)
        points = self._points.get(key)
        if points is None or points.instruments is not instruments:
            base: dict[str, Any] = {
                names.ATTR_SERVER_NAME: server,
                names.ATTR_GEN_AI_OPERATION_NAME: operation,
            }
            if self.provider is not None:
                base[names.ATTR_GEN_AI_PROVIDER_NAME] = self.provider
            if label is not None:
                base[names.ATTR_GEN_AI_REQUEST_MODEL] = label
            if len(self._points) >= 1024:  # only a changing server name could get here
                self._points.clear()
            points = self._points[key] = CallPoints(instruments, base)
        return points
