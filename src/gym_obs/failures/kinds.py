"""The failure vocabulary: kinds, stages and boundaries (standard library only).

Kinds, stages and boundaries become metric attributes, so each is a small fixed set. Kinds are named
``<domain>_<condition>``; an environment may add its own as ``<server>:<kind>``. An unknown kind is never
an error (a failure must not be lost because of its label): it is kept, warned about once, and counted
under the ``_OTHER`` metric label so it cannot blow up metric cardinality.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Final, Literal, get_args

__all__ = [
    "BOUNDARIES",
    "FAILURE_KINDS",
    "MAX_KIND_CHARS",
    "OTHER_KIND_LABEL",
    "STAGES",
    "UNKNOWN_REMOTE_KIND",
    "Boundary",
    "FailureKind",
    "Stage",
    "failure_kind_label",
    "is_known_failure_kind",
    "validate_failure_kind",
]

FailureKind = Literal[
    "transport_unreachable",
    "transport_peer_drop",
    "transport_timeout",
    "transport_local_resource",
    "agent_run_error",
    "agent_request_failed",
    "agent_timeout",
    "agent_command_not_allowed",
    "environment_server_failed",
    "protocol_violation",
    "judge_failed",
    "judge_unparseable",
    "verifier_error",
    "provider_unavailable",
    "provider_quota_exhausted",
    "provider_oom_killed",
    "session_lost",
    "session_expired",
    "session_release_failed",
    "cancelled",
    "kill_shaped",
    "shutdown",
    "persistence_failed",
    "cohort_incomplete",
    "internal_error",
]
"""The shared kind vocabulary (a ``Literal`` so mypy catches typos at the call site)."""

Stage = Literal["admission", "seed", "agent", "verification", "cleanup"]
"""Where in a rollout's life the failure happened."""

Boundary = Literal["model", "harness", "agent", "resources_server", "environment", "collection"]
"""Which boundary observed (and raised) the failure."""

FAILURE_KINDS: Final[frozenset[str]] = frozenset(get_args(FailureKind))
STAGES: Final[frozenset[str]] = frozenset(get_args(Stage))
BOUNDARIES: Final[frozenset[str]] = frozenset(get_args(Boundary))

MAX_KIND_CHARS: Final = 128
"""Longer kind names are cut: a kind is a label, not a message."""

OTHER_KIND_LABEL: Final = "_OTHER"
"""Metric label for kinds outside the vocabulary (mirrors the semconv ``error.type`` fallback)."""

UNKNOWN_REMOTE_KIND: Final = "unknown"
"""What a peer's failure kind becomes when it is neither in the vocabulary nor a well-formed namespaced kind:
a peer's free text never passes as a label (it could hold a secret or terminal escapes)."""

_NAMESPACED_KIND = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}:[a-z][a-z0-9_]{0,62}")
_MAX_WARNED = 256

_log = logging.getLogger("gym_obs.failures")
_warned: set[str] = set()
_warned_lock = threading.Lock()


def is_known_failure_kind(name: str) -> bool:
    """True for a vocabulary kind or a well-formed namespaced ``<server>:<kind>`` name."""
    return name in FAILURE_KINDS or _NAMESPACED_KIND.fullmatch(name) is not None


def validate_failure_kind(name: object) -> str:
    """Return ``name`` as a usable kind; never raises.

    Non-strings are converted, over-long names cut to ``MAX_KIND_CHARS``, and an unknown name is kept
    and logged once per process (a bounded number of distinct names are remembered).
    """
    kind = name if isinstance(name, str) else repr(name)
    if len(kind) > MAX_KIND_CHARS:
        kind = kind[:MAX_KIND_CHARS]
    try:
        kind.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate would make the record unserializable
        kind = kind.encode("utf-8", "replace").decode("utf-8")
    if not kind:
        kind = "internal_error"
    if kind in FAILURE_KINDS or is_known_failure_kind(kind):
        return kind
    _warn_unknown(kind)
    return kind


def failure_kind_label(kind: str) -> str:
    """The metric label for ``kind``: the kind itself when known, ``_OTHER`` otherwise."""
    return kind if is_known_failure_kind(kind) else OTHER_KIND_LABEL


def _warn_unknown(kind: str) -> None:
    with _warned_lock:
        if kind in _warned or len(_warned) > _MAX_WARNED:
            return
        _warned.add(kind)
        overflow = len(_warned) > _MAX_WARNED
    if overflow:
        _log.warning("too many unknown failure kinds; no longer warning about new ones")
    else:
        _log.warning("unknown failure kind %r (kept; counted as %s)", kind, OTHER_KIND_LABEL)
