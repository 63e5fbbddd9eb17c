"""The copy of the global config the head server serves: every secret replaced by ``[REDACTED]``.

Anyone who can reach the head server can read ``/global_config``; a served ``session_secret`` would let them
mint a token for any session, and a served ``api_key`` is a leaked key. Launched servers never need the
served copy for their secrets: the launcher hands each child the resolved config (secrets included) in its
environment (``GYM_OBS_GLOBAL_CONFIG``). Processes that fetch the served copy (a harness, a client script)
need addresses and settings, not secrets.

The rule, applied at every depth: a key that looks like a secret (the same words the failure details'
redaction uses: ``api_key``, ``secret``, ``token``, ``password``, ``auth``, ``credential``, ``cookie``,
``signature``, ``private_key``…) has its value replaced unless that value is a number, a boolean or null
(``max_tokens: 512`` is a limit, not a secret); every other string is scrubbed like a log line (a URL's
userinfo and query, ``Bearer …``, provider keys).
"""

from __future__ import annotations

from typing import Any, Final

from gym_obs.config import GlobalConfig
from gym_obs.telemetry.redaction import REDACTED, is_secret_key, scrub_text

__all__ = ["served_config"]

_MAX_DEPTH: Final = 32


def _is_plain_setting(value: object) -> bool:
    return value is None or isinstance(value, bool | int | float)


def _clean(value: Any, depth: int) -> Any:
    if isinstance(value, str):
        return scrub_text(value)
    if depth >= _MAX_DEPTH:
        return REDACTED  # deeper than any real config: not worth the risk of walking it
    if isinstance(value, dict):
        return {
            key: REDACTED if is_secret_key(key) and not _is_plain_setting(item) else _clean(item, depth + 1)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_clean(item, depth + 1) for item in value]
    return value


def served_config(config: GlobalConfig) -> dict[str, Any]:
    """The JSON-ready global config with every secret redacted (see the module doc)."""
    cleaned: dict[str, Any] = _clean(config.model_dump(mode="json"), 0)
    return cleaned
