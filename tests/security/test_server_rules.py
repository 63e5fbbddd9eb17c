"""The server's security rules as pure functions: what is served, which status answers, which token is
refused, what a 422 logs, what the access log keeps. (The launched-server tests prove them end to end.)"""

from __future__ import annotations

import logging

import pytest

from gym_obs.config import ConfigError, is_secret_key, parse_global_config
from gym_obs.failures import NgFailureEvent
from gym_obs.server._access_log import QueryFreeAccessLog
from gym_obs.server._failure_reply import reply_status
from gym_obs.server._served_config import served_config
from gym_obs.server._validation_log import summarize_validation_errors
from gym_obs.server.sessions import SessionSigner
from tests.security.canary_apps import CANARY


def test_served_config_redacts_every_secret_and_keeps_settings() -> None:
    config = parse_global_config(
        {
            "telemetry": {"otlp_endpoint": f"http://user:{CANARY}@collector:4318"},
            "servers": {
                "m": {
                    "entrypoint": "a.b:C",
                    "server_type": "responses_api_models",
                    "port": 31499,
                    "session_secret": CANARY,
                    "OPENAI_API_KEY": CANARY,
                    "max_tokens": 512,
                    "auth": {"kind": "bearer", "value": CANARY},
                    "headers": [{"Authorization": f"Bearer {CANARY}"}],
                    "base_url": f"https://api.example/v1?key={CANARY}",
                }
            },
        }
    )
    served = served_config(config)
    assert CANARY not in repr(served)
    server = served["servers"]["m"]
    assert server["max_tokens"] == 512 and server["port"] == 31499  # numbers under secret-ish keys stay
    assert server["session_secret"] == server["OPENAI_API_KEY"] == server["auth"] == "[REDACTED]"
    assert server["base_url"] == "https://api.example/v1"
    assert parse_global_config(served).servers["m"].session_secret is None


@pytest.mark.parametrize("key", ["api_key", "apiKey", "SECRET", "x_token", "password", "credentials"])
def test_secret_keys(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize(
    ("status", "remote", "expected"),
    [(422, False, 422), (503, False, 503), (200, False, 500), (204, False, 500), (302, False, 500),
     (None, False, 500), (503, True, 500), (200, True, 500), (401, True, 500)],
)
def test_reply_status_is_an_error_chosen_here(status: int | None, remote: bool, expected: int) -> None:
    event = NgFailureEvent("provider_unavailable", "x", boundary="model", http_status=status)
    if remote:
        event.http_error = RuntimeError("this hop's reply")
    assert reply_status(event) == expected


@pytest.mark.parametrize(
    "token", ["é.1.abc", "caf\xe9.1.\xff", "\x00.1.a", "a" * 600, "", "..", "x.y", 3, None, b"bytes.1.a"]
)
def test_malformed_tokens_are_refused_never_raised(token: object) -> None:
    assert SessionSigner(b"k" * 32).verify(token) is None  # type: ignore[arg-type]


def test_validation_summary_never_echoes_values() -> None:
    errors = [
        {"type": "int_parsing", "loc": ("body", "count"), "msg": "Input should be a valid integer",
         "input": CANARY},
        {"type": "value_error", "loc": ("body", "note"), "msg": f"Value error, {CANARY}", "input": CANARY},
        {"type": "extra_forbidden", "loc": ("body", CANARY), "msg": "Extra inputs are not permitted"},
        {"type": "missing", "loc": ("body", "items", 3, f"{CANARY}!"), "msg": "Field required"},
    ] + [{"type": "missing", "loc": ("query", "q"), "msg": "Field required"}] * 4
    summary = summarize_validation_errors(errors)
    assert summary == [
        "body.count: int_parsing: Input should be a valid integer",
        "body.note: value_error",
        "body.<key>: extra_forbidden: Extra inputs are not permitted",
        "body.items.3.<key>: missing: Field required",
        "query.q: missing: Field required",
        "... and 3 more",
    ]


def test_access_log_lines_lose_query_fragment_and_control_characters() -> None:
    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "GET", f"/v1/x\x1b[2J?x&q={CANARY}#{CANARY}", "1.1", 200), None,
    )
    assert QueryFreeAccessLog().filter(record)
    assert record.getMessage() == '127.0.0.1:5000 - "GET /v1/x\\x1b[2J HTTP/1.1" 200'


def test_a_malformed_secret_is_not_echoed_in_the_config_error() -> None:
    short = "kanarie-short"  # too short for a session secret
    entry = {"entrypoint": "a.b:C", "server_type": "t", "port": 31498, "session_secret": short}
    with pytest.raises(ConfigError, match=r"servers\.m\.session_secret") as caught:
        parse_global_config({"servers": {"m": entry}})
    assert short not in str(caught.value)
    with pytest.raises(ConfigError, match=r"got 'x'"):  # other keys still show what was given
        parse_global_config({"servers": {"m": {**entry, "session_secret": None, "port": "x"}}})
