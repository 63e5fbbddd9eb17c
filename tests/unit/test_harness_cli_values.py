"""Every bad value a user can give ``gym-obs harness run``: exit 2, one line naming the flag, no traceback.

Runs the real command in-process (``gym_obs.cli.main``); each case fails before any server starts.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gym_obs.cli import main

PORT_BASE = "29600"
_RULE = "faults:\n  - {server: model, route: /v1/responses, "


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(["harness", "run", "--port-base", PORT_BASE, "--rollouts", "1", *argv])
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    return code, err


def _assert_one_clear_line(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "error" in lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["--rollouts", "0"], ["--rollouts", "at least 1"]),
        (["--rollouts", "-3"], ["--rollouts"]),
        (["--rollouts", "abc"], ["--rollouts", "whole number"]),
        (["--rollouts", "1.5"], ["--rollouts"]),
        (["--concurrency", "0"], ["--concurrency"]),
        (["--concurrency", "x"], ["--concurrency"]),
        (["--agents", "0"], ["--agents"]),
        (["--models", "-1"], ["--models"]),
        (["--resources", "z"], ["--resources"]),
        (["--agents", "1000"], ["--agents", "at most"]),
        (["--otlp-endpoint", "notaurl"], ["--otlp-endpoint", "http(s) URL"]),
        (["--otlp-endpoint", "ftp://collector:4318"], ["--otlp-endpoint"]),
        (["--otlp-endpoint", "http://collector:99999"], ["--otlp-endpoint"]),
        (["--prometheus-port-base", "0"], ["--prometheus-port-base"]),
        (["--prometheus-port-base", "70000"], ["--prometheus-port-base"]),
        (["--prometheus-port-base", "65534"], ["--prometheus-port-base", "65535"]),
        (["--prometheus-port-base", "29601"], ["--prometheus-port-base", "overlap"]),
        (["--port-base", "65534"], ["--port-base"]),
        (["--request-timeout", "0"], ["--request-timeout"]),
        (["--request-timeout", "nan"], ["--request-timeout"]),
        (["--model-latency-ms", "-5"], ["--model-latency-ms"]),
        (["--faults", "/nonexistent/plan.yaml"], ["/nonexistent/plan.yaml", "cannot read"]),
    ],
)
def test_bad_flag_values(argv: list[str], needles: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(argv, capsys)
    _assert_one_clear_line(code, err, *needles)


def test_out_that_is_a_file_or_not_creatable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for out in (a_file, a_file / "sub"):
        code, err = _run(["--out", str(out)], capsys)
        _assert_one_clear_line(code, err, "--out", str(out))


def test_busy_prometheus_port(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 29652))
        sock.listen()
        code, err = _run(["--out", str(tmp_path), "--prometheus-port-base", "29650"], capsys)
    _assert_one_clear_line(code, err, "29652", "in use")


@pytest.mark.parametrize(
    ("plan", "needles"),
    [
        ("faults:\n  - {server: model, route: /v1/responses, actoin: raise}\n", ["faults[0].actoin"]),
        ("faults:\n  - {server: model, route: /v1/responses, action: explode}\n", ["faults[0].action"]),
        (
            _RULE + "action: raise, exception: KeyError, rate: 1.5}\n",
            ["faults[0].rate"],
        ),
        (
            _RULE + "action: raise, exception: KeyError, rate: -1}\n",
            ["faults[0].rate"],
        ),
        ("faults:\n  - {server: model, route: /v1/responses, action: raise}\n", ["needs 'exception'"]),
        (
            "faults:\n  - {server: model, route: /v1/responses, action: raise, exception: NoSuchError}\n",
            ["NoSuchError"],
        ),
        (
            _RULE + "action: raise, exception: UnicodeDecodeError}\n",
            ["UnicodeDecodeError"],
        ),
        ("faults:\n  - {server: model, route: /v1/responses, action: status}\n", ["needs 'status'"]),
        (
            "faults:\n  - {server: model, route: /v1/responses, action: status, status: 200}\n",
            ["faults[0].status"],
        ),
        ("faults:\n  - {server: model, route: /v1/responses, action: delay}\n", ["needs 'seconds'"]),
        ("faults:\n  - {server: wizard, route: /v1/responses, action: disconnect}\n", ["'wizard'"]),
        ("faults:\n  - {server: model, action: disconnect}\n", ["faults[0].route"]),
        ("faults:\n  - {server: model, route: v1/responses, action: disconnect}\n", ["faults[0].route"]),
        ("faults:\n  - {server: model\n", ["not valid YAML", "line"]),
        ("", ["empty"]),
        ("- just\n- a list\n", ["mapping"]),
    ],
)
def test_bad_plans(plan: str, needles: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(plan)
    code, err = _run(["--out", str(tmp_path / "out"), "--faults", str(path)], capsys)
    _assert_one_clear_line(code, err, str(path), *needles)
    assert not (tmp_path / "out").exists()  # nothing was started or written
