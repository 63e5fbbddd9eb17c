"""The model-call layer's metric points: bound once per label combination, recorded at once per call.

A model call records four to six points to label combinations from fixed sets (outcome, token type, finish
reason, unparsable reason). :class:`CallPoints` makes every point of one combination once: a pre-aggregated
instrument's bound series, so a call builds no attribute dict, finds no series and records its points with
one ``PreAggregation.add_all`` (one lock, one exemplar decision); or, for an instrument that is the SDK's (a
configured view selects it, or the meter is not the SDK's), a function recording to it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from gym_obs.telemetry import names
from gym_obs.telemetry.metrics import Instruments
from gym_obs.telemetry.preaggregated import bound_series

__all__ = ["TOKEN_SPAN_KEYS", "CallPoints"]


#: The SERVER span's token-count attributes, in the order of ``CallPoints.tokens``.
TOKEN_SPAN_KEYS: Final = (
    names.ATTR_GEN_AI_USAGE_INPUT_TOKENS,
    names.ATTR_GEN_AI_USAGE_OUTPUT_TOKENS,
    names.ATTR_GEN_AI_USAGE_REASONING_TOKENS,
    names.ATTR_GEN_AI_USAGE_CACHED_INPUT_TOKENS,
)


def _handle(instrument: Any, attributes: dict[str, Any]) -> Any:
    """``instrument``'s point for ``attributes``: a pre-aggregated instrument's bound series (for
    ``PreAggregation.add_all``), else a function recording to the SDK instrument (which decides its own
    exemplar)."""
    series = bound_series(instrument, attributes)
    if series is not None:
        return series
    measure = getattr(instrument, "record", None) or instrument.add
    return lambda value: measure(value, attributes)


def _each(instrument: Any, base: dict[str, Any], key: str) -> dict[str, Any]:
    """A point per value of ``key`` (a fixed set)."""
    return {value: _handle(instrument, {**base, key: value}) for value in _VALUES[key]}


class CallPoints:
    """The metric points of one label combination on one set of instruments, made once: one per outcome,
    token type, finish reason and unparsable reason (each a fixed set), so a call builds no attribute dict
    and finds no series; ``emit`` records a call's measurements (``(point, value, exemplar)``) at once."""

    __slots__ = ("duration", "emit", "finishes", "instruments", "tokens", "ttft", "unparsable")

    def __init__(self, instruments: Instruments, base: dict[str, Any]) -> None:
        self.instruments = instruments
        self.duration = _each(instruments.gen_ai_server_duration, base, names.ATTR_GEN_AI_OUTCOME)
        self.ttft = _handle(instruments.gen_ai_server_ttft, base)
        tokens = _each(instruments.gen_ai_server_tokens, base, names.ATTR_GEN_AI_TOKEN_TYPE)
        self.tokens = tuple(tokens[token_type] for token_type in _TOKEN_ORDER)
        finish, reason = names.ATTR_GEN_AI_RESPONSE_FINISH_REASONS, names.ATTR_GEN_AI_UNPARSABLE_REASON
        self.finishes = _each(instruments.gen_ai_server_finishes, base, finish)
        self.unparsable = _each(instruments.gen_ai_server_unparsable, base, reason)
        every = [self.ttft, *self.duration.values(), *tokens.values()]
        every += [*self.finishes.values(), *self.unparsable.values()]
        pre = instruments.pre
        self.emit: Callable[[list[tuple[Any, float, Any]]], None] = (
            pre.add_all if pre is not None and not any(map(callable, every)) else self._each_alone
        )

    def _each_alone(self, measurements: list[tuple[Any, float, Any]]) -> None:
        """Where some point is an SDK instrument's (a configured view selects it, or no SDK meter)."""
        pre = self.instruments.pre
        for point, value, exemplar in measurements:
            if callable(point):
                point(value)
            elif pre is not None:
                pre.add_all(((point, value, exemplar),))


#: The token types in the order ``_record`` gives their counts.
_TOKEN_ORDER: Final = (
    names.GEN_AI_TOKEN_INPUT,
    names.GEN_AI_TOKEN_OUTPUT,
    names.GEN_AI_TOKEN_REASONING,
    names.GEN_AI_TOKEN_CACHED_INPUT,
)
_VALUES: Final = {
    names.ATTR_GEN_AI_OUTCOME: names.GEN_AI_OUTCOMES,
    names.ATTR_GEN_AI_TOKEN_TYPE: names.GEN_AI_TOKEN_TYPES,
    names.ATTR_GEN_AI_RESPONSE_FINISH_REASONS: names.GEN_AI_FINISH_REASONS,
    names.ATTR_GEN_AI_UNPARSABLE_REASON: names.GEN_AI_UNPARSABLE_REASONS,
}
