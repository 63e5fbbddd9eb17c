"""``gym-obs explain`` on crafted run folders, run as a real process: the chain from outermost to root,
the hops with attempts, lookup by trace id, the unknown-id error, and no control character on the terminal.
(On a real harness run: tests/e2e/test_report_browser.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gym_obs.harness.explain import explain, printable, render_text
from tests.unit.test_report_build import failure_row, make_run

ESCAPES = "\x1b[31mred\x1b[0m\x07\x9b2J\u202e"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gym_obs.cli", "explain", *args], capture_output=True, text=True, timeout=60
    )


def test_failure_chain_outermost_to_root_and_hops_with_attempts(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", 4)
    result = _cli("run-000003", str(run))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "outcome   failed" in out
    chain = out.split("failure chain (outermost -> root cause):")[1].split("hops")[0]
    assert chain.index("1. provider_unavailable") < chain.index("2. ConnectionResetError (foreign cause)")
    assert "boundary=model stage=agent server=agent_0 http_status=503" in chain
    hops = out.split("hops (")[1]
    assert "harness -> agent_0  POST /run" in hops
    assert "agent_0 -> model_0  POST /v1/responses" in hops and "2 attempts" in hops
    assert "retried: server_disconnected" in hops
    assert f"open      {run / 'report.html'}#trace-{3:032x}" in out


def test_json_output_and_lookup_by_trace_id(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", 4)
    result = _cli(f"{3:032X}", str(run), "--json")  # a trace id, any case
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["rollout_id"] == "run-000003" and doc["outcome"] == "failed"
    assert [link["kind"] for link in doc["failure_chain"]] == ["provider_unavailable", None]
    assert doc["failure_chain"][1]["exception_type"] == "ConnectionResetError"
    assert [(h["caller"], h["destination"], h["attempts"]) for h in doc["hops"]] == [
        ("harness", "agent_0", 1),
        ("agent_0", "model_0", 2),
    ]
    assert doc["grafana_explore_url"] is None  # no OTLP endpoint was used


def test_unknown_id_is_one_line_with_the_rollout_count(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", 7)
    result = _cli("nope\x1b[2J", str(run))
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert "it has 7 rollouts" in result.stderr
    assert "\x1b" not in result.stderr


def test_control_characters_never_reach_the_terminal(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", 3)
    row = {**failure_row(50, "boom"), "rollout_id": f"evil{ESCAPES}", "error": f"err {ESCAPES}"}
    with (run / "rollouts.jsonl").open("a") as rows:
        rows.write(json.dumps(row) + "\n")
    result = subprocess.run(
        [sys.executable, "-m", "gym_obs.cli", "explain", f"evil{ESCAPES}", str(run)],
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert b"\x1b" not in result.stdout and b"\x07" not in result.stdout
    text = result.stdout.decode()
    assert "\x9b" not in text and "\u202e" not in text
    assert "evil\\x1b[31mred" in text  # visible, not interpreted


def test_printable_bounds_and_escapes() -> None:
    assert printable("a\nb\tc", 10) == "a\\x0ab\\x09c"
    assert printable("x" * 50, 10) == "x" * 10 + "…"


def test_grafana_link_when_the_run_used_an_otlp_endpoint(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", 2)
    (run / "summary.json").write_text(json.dumps({"telemetry": {"otlp_endpoint": "http://127.0.0.1:4318"}}))
    text = render_text(explain("run-000000", run, grafana_url="http://grafana.local:3000"))
    line = next(line for line in text.splitlines() if line.startswith("grafana"))
    assert line.split()[1].startswith("http://grafana.local:3000/explore?left=")
    assert "gym-tempo" in line and f"{0:032x}" in line


def test_a_folder_without_rows_is_explained_from_its_spans(tmp_path: Path) -> None:
    run = make_run(tmp_path / "sink", 5, rows=False)
    doc = json.loads(_cli("run-000003", str(run), "--json").stdout)
    assert doc["outcome"] == "failed" and doc["trace_id"] == f"{3:032x}"
    assert [h["destination"] for h in doc["hops"]] == ["agent_0", "model_0"]
    missing = _cli("run-999999", str(run))
    assert missing.returncode == 2 and "it has 5 rollouts" in missing.stderr


def test_json_output_escapes_control_characters(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", 2)
    row = {**failure_row(60, "boom"), "rollout_id": "ctl", "error": f"err {ESCAPES}"}
    with (run / "rollouts.jsonl").open("a") as rows:
        rows.write(json.dumps(row) + "\n")
    result = subprocess.run(
        [sys.executable, "-m", "gym_obs.cli", "explain", "ctl", str(run), "--json"],
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 0
    assert not any(byte < 0x20 and byte not in (0x0A, 0x20) for byte in result.stdout)
    assert json.loads(result.stdout)["error"] == f"err {ESCAPES}"  # intact for scripts, escaped on the wire
