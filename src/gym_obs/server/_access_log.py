"""uvicorn's access log without query strings: a logging filter on the ``uvicorn.access`` logger.

uvicorn writes ``'%s - "%s %s HTTP/%s" %d'`` with the path *and* query string as the third argument, and a
query is where callers put API keys (``?key=…``) and anything else (``?x&q=…``): the free-text scrubber can
only guess at what is secret in one. The filter keeps the path and drops everything from the first ``?`` or
``#`` before the line is formatted, whatever handler or format the process uses; control characters in the
(percent-decoded) path are escaped, so a request for ``/%1b[2J`` cannot clear the terminal reading the log.
Installed once per process by every gym server (a logger-level filter runs for every record the logger
itself emits).
"""

from __future__ import annotations

import logging
import re
from typing import Final

__all__ = ["ACCESS_LOGGER", "QueryFreeAccessLog", "install_query_free_access_log", "path_only"]

ACCESS_LOGGER: Final = "uvicorn.access"
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")


def path_only(target: str) -> str:
    """``target`` up to its query or fragment, control characters escaped (``\\x1b``)."""
    for mark in ("?", "#"):
        target = target.partition(mark)[0]
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", target)


def _clean(arg: object) -> object:
    return path_only(arg) if isinstance(arg, str) else arg


class QueryFreeAccessLog(logging.Filter):
    """Removes the query (and any fragment) from the arguments of an access-log record.

    Every string argument is cut, not only the path's position: the client address, method and HTTP
    version never hold a ``?``, so this holds whatever order a uvicorn version logs them in.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple):
            record.args = tuple(_clean(arg) for arg in args)
        elif isinstance(args, dict):
            record.args = {key: _clean(value) for key, value in args.items()}
        return True


def install_query_free_access_log() -> None:
    """Add the filter to the ``uvicorn.access`` logger (idempotent)."""
    logger = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(existing, QueryFreeAccessLog) for existing in logger.filters):
        logger.addFilter(QueryFreeAccessLog())
