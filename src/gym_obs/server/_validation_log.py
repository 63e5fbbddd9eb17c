"""Log every request that fails validation (422) with a bounded summary of what was wrong.

FastAPI answers a request whose body, query or path does not validate with 422 and logs nothing, so a
caller sending the wrong shape fails silently on the server side. The summary says where (``body.count``)
and what (``int_parsing: Input should be a valid integer…``) for at most ``MAX_LOGGED_ERRORS`` errors, and
never what was submitted: no ``input``, no ``ctx``, no message a custom validator wrote (it may quote the
value), and location parts that are not field names (dict keys a caller chose) are masked.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence
from typing import Any, Final

from fastapi import FastAPI, Request
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from starlette.responses import Response

from gym_obs.telemetry.bodies import bounded_excerpt
from gym_obs.telemetry.logging import get_logger

__all__ = ["MAX_LOGGED_ERRORS", "log_validation_failures", "summarize_validation_errors"]

MAX_LOGGED_ERRORS: Final = 5
_FIELD_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]{0,63}")
_MASKED: Final = "<key>"
_MAX_MESSAGE_CHARS: Final = 120
_MAX_PATH_CHARS: Final = 200
# Messages a validator author wrote (they may quote the submitted value); every other message is pydantic's.
_AUTHORED_TYPES: Final = frozenset({"value_error", "assertion_error"})
# Errors whose location ends in a key the caller chose.
_CALLER_KEY_TYPES: Final = frozenset({"extra_forbidden"})

_log = get_logger("gym_obs.server")


def _location(loc: Sequence[object], error_type: str) -> str:
    parts: list[str] = []
    for index, part in enumerate(loc):
        caller_key = error_type in _CALLER_KEY_TYPES and index == len(loc) - 1
        if isinstance(part, int) and not isinstance(part, bool):
            parts.append(str(part))
        elif isinstance(part, str) and not caller_key and _FIELD_NAME.fullmatch(part):
            parts.append(part)
        else:
            parts.append(_MASKED)
    return ".".join(parts)


def summarize_validation_errors(errors: Sequence[Any]) -> list[str]:
    """``["body.count: int_parsing: Input should be a valid integer…", …]`` without submitted values."""
    summary: list[str] = []
    for error in errors[:MAX_LOGGED_ERRORS]:
        if not isinstance(error, dict):
            continue
        error_type = str(error.get("type", "invalid"))[:64]
        loc = error.get("loc", ())
        line = f"{_location(loc if isinstance(loc, list | tuple) else (), error_type)}: {error_type}"
        message = error.get("msg")
        if isinstance(message, str) and message and error_type not in _AUTHORED_TYPES:
            line += ": " + message[:_MAX_MESSAGE_CHARS]
        summary.append(line)
    if len(errors) > MAX_LOGGED_ERRORS:
        summary.append(f"... and {len(errors) - MAX_LOGGED_ERRORS} more")
    return summary


def log_validation_failures(app: FastAPI) -> None:
    """Log every ``RequestValidationError`` of ``app``, then answer as its own handler (or FastAPI's) does."""
    answer = app.exception_handlers.get(RequestValidationError, request_validation_exception_handler)

    async def logged(request: Request, error: Exception) -> Response:
        errors = error.errors() if isinstance(error, RequestValidationError) else []
        _log.warning(
            "request failed validation",
            method=request.method,
            path=bounded_excerpt(request.scope.get("path", ""), _MAX_PATH_CHARS),  # control chars escaped
            error_count=len(errors),
            errors=summarize_validation_errors(errors),
        )
        reply = answer(request, error)
        if inspect.isawaitable(reply):
            reply = await reply
        return reply

    app.add_exception_handler(RequestValidationError, logged)
