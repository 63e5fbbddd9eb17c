"""The one error type of the failure model, in a module of its own so every failure module can raise it.

Remote input is hostile until validated: decoding a header, a body or a row raises only this (never a
``KeyError`` or a pydantic error from deep inside), so a caller needs one ``except`` to fall back.
"""

from __future__ import annotations

__all__ = ["InvalidFailureReport"]


class InvalidFailureReport(ValueError):
    """A failure report (or record) failed validation; the only error decoding may raise."""
