"""structlog configuration: one pipeline for structlog and stdlib loggers, ids on every line, no secrets.

Every line, whether it came from ``structlog`` or a library's ``logging`` call, goes through the same
processors: it gets ``trace_id``/``span_id`` of the current span, ``rollout_id`` of the current rollout and
the server name when present; then secrets are scrubbed from the event and every string value (tracebacks
included) before anything is rendered. Tracebacks are rendered without local variables: locals are where
API keys and request bodies live.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any, Final

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from gym_obs.telemetry import names
from gym_obs.telemetry._state import STATE
from gym_obs.telemetry.propagation import current_rollout_id
from gym_obs.telemetry.redaction import escape_controls, scrub_text
from gym_obs.telemetry.spans import current_ids

__all__ = ["configure_logging", "get_logger"]

_HANDLER_MARK: Final = "_gym_obs_handler"
_LOCK: Final = threading.Lock()
_MAX_DEPTH: Final = 6
_TRUE: Final = frozenset({"1", "true", "yes", "on"})


#: uvicorn passes a copy of each message with ANSI colour codes as ``extra``; a log file wants neither.
_UVICORN_COLOR_KEY: Final = "color_message"
#: The server this process runs, as the launcher told it (``GYM_OBS_SERVER_NAME``), read when logging is
#: configured: lines logged before telemetry is set up (or with telemetry off, or in a uvicorn worker)
#: still name their server.
_process_server_name: str | None = None


def drop_color_message(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """Drop uvicorn's coloured duplicate of the message (``color_message='...\x1b[36m...'``)."""
    event_dict.pop(_UVICORN_COLOR_KEY, None)
    return event_dict


def add_telemetry_ids(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """Add ``trace_id``, ``span_id``, ``rollout_id`` and ``server_name`` when they are known."""
    trace_id, span_id = current_ids()
    if trace_id is not None:
        event_dict.setdefault("trace_id", trace_id)
        event_dict.setdefault("span_id", span_id)
    rollout_id = current_rollout_id()
    if rollout_id is not None:
        event_dict.setdefault("rollout_id", rollout_id)
    server_name = STATE.server_name or _process_server_name
    if server_name:
        event_dict.setdefault("server_name", server_name)
    return event_dict


def _scrub(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        return escape_controls(scrub_text(value))
    if depth >= _MAX_DEPTH:
        return value
    if isinstance(value, dict):
        return {k: _scrub(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_scrub(v, depth + 1) for v in value]
    return value


def scrub_event(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """Scrub secrets from the event and every string value (nested ones too); control characters (a peer's
    ``\x1b[2J``) are shown as control pictures, never sent to a terminal."""
    for key, value in list(event_dict.items()):
        if isinstance(value, str | dict | list | tuple):
            event_dict[key] = _scrub(value)
        elif key == "event" and value is not None:
            event_dict[key] = escape_controls(scrub_text(str(value)))
    return event_dict


def _json_default() -> bool:
    return os.environ.get(names.ENV_LOG_JSON, "").strip().lower() in _TRUE


def shared_processors() -> list[Processor]:
    """The processors every line goes through before it is rendered (also used by the OTLP log export)."""
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.ExtraAdder(),
        drop_color_message,
        add_telemetry_ids,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]


def _render_processors(json: bool) -> list[Processor]:
    remove_meta = structlog.stdlib.ProcessorFormatter.remove_processors_meta
    if json:
        tracebacks = structlog.processors.ExceptionRenderer(
            structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
        )
        return [remove_meta, tracebacks, scrub_event, structlog.processors.JSONRenderer()]
    console = structlog.dev.ConsoleRenderer(
        colors=_isatty(), exception_formatter=structlog.dev.plain_traceback
    )
    return [remove_meta, structlog.processors.format_exc_info, scrub_event, console]


def _isatty() -> bool:
    try:
        return sys.stderr.isatty()
    except Exception:
        return False


def configure_logging(json: bool | None = None, level: int | str = logging.INFO) -> None:
    """Route structlog and stdlib logging through one scrubbing pipeline to stderr.

    ``json`` defaults to ``GYM_OBS_LOG_JSON``. Idempotent: calling again replaces only the handler this
    function installed (other handlers on the root logger, e.g. pytest's, are left alone).
    """
    global _process_server_name
    use_json = _json_default() if json is None else json
    shared = shared_processors()
    with _LOCK:
        _process_server_name = os.environ.get(names.ENV_SERVER_NAME, "").strip() or None
        structlog.configure(
            processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
            logger_factory=structlog.stdlib.LoggerFactory(),
            wrapper_class=structlog.stdlib.BoundLogger,
            cache_logger_on_first_use=False,
        )
        formatter = structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared, processors=_render_processors(use_json)
        )
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(formatter)
        setattr(handler, _HANDLER_MARK, True)
        root = logging.getLogger()
        for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
            root.removeHandler(old)
        root.addHandler(handler)
        root.setLevel(level)


def get_logger(name: str | None = None, **initial_values: Any) -> structlog.stdlib.BoundLogger:
    """A structlog logger named ``name`` (the stdlib logger name), optionally with bound values."""
    logger = structlog.stdlib.get_logger(name)
    if initial_values:
        logger = logger.bind(**initial_values)
    return logger
