"""set_ulimit (in a child process, so the test runner's own limit is untouched) and output prefixing."""

from __future__ import annotations

import io
import json
import os
import resource
import subprocess
import sys
import textwrap

import pytest

from gym_obs.server.ops import LinePrefixer, output_prefix, pump_output, set_ulimit

_SOFT, _HARD = resource.getrlimit(resource.RLIMIT_NOFILE)
_INF = resource.RLIM_INFINITY


def _run_set_ulimit(
    start_soft: int, target: int, hard: int | None = None, needed: int | None = None
) -> dict[str, object]:
    """Lower the child's limits to (start_soft, hard), call set_ulimit(target), report result + real limit."""
    code = textwrap.dedent(
        f"""
        import dataclasses, json, resource
        hard = {hard if hard is not None else "resource.getrlimit(resource.RLIMIT_NOFILE)[1]"}
        resource.setrlimit(resource.RLIMIT_NOFILE, ({start_soft}, hard))
        from gym_obs.server.ops import set_ulimit
        from gym_obs.telemetry.logging import configure_logging
        configure_logging()
        result = set_ulimit({target}, needed={needed})
        out = dataclasses.asdict(result)
        out["ok"] = result.ok
        out["real_soft"] = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        print(json.dumps(out))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    result["stderr"] = done.stderr
    return result


@pytest.mark.skipif(_HARD != _INF and _HARD < 2048, reason="hard open-file limit too low to test raising")
def test_set_ulimit_raises_the_soft_limit() -> None:
    target = 2048
    result = _run_set_ulimit(512, target)
    assert result["before"] == 512
    assert result["after"] == result["real_soft"] == target
    assert result["changed"] is True and result["ok"] is True
    assert "raised the soft limit from 512 to 2048" in str(result["reason"])


def test_set_ulimit_never_goes_above_the_hard_limit_and_says_why() -> None:
    hard = min(1500, _HARD if _HARD != _INF else 1500)
    result = _run_set_ulimit(256, 1_000_000, hard=hard)
    assert result["before"] == 256
    assert result["after"] == result["real_soft"] == hard
    assert result["hard"] == hard
    assert result["changed"] is True and result["ok"] is False
    assert f"the hard limit is {hard}" in str(result["reason"])
    assert "open-file limit below target" in str(result["stderr"])  # warned


def test_set_ulimit_when_the_hard_limit_is_already_reached() -> None:
    result = _run_set_ulimit(300, 5000, hard=300)
    assert (result["before"], result["after"], result["changed"], result["ok"]) == (300, 300, False, False)
    assert "does not allow more" in str(result["reason"])
    assert "cannot raise the open-file limit" in str(result["stderr"])


def test_set_ulimit_warns_only_when_the_limit_stays_below_what_the_config_needs() -> None:
    hard = min(1500, _HARD if _HARD != _INF else 1500)
    enough = _run_set_ulimit(256, 1_000_000, hard=hard, needed=hard - 100)
    assert enough["after"] == hard and enough["ok"] is False and enough["needed"] == hard - 100
    assert "open-file limit" not in str(enough["stderr"])  # below the target, but enough: no warning
    stuck = _run_set_ulimit(300, 5000, hard=300, needed=200)
    assert stuck["after"] == 300 and "cannot raise" not in str(stuck["stderr"])
    short = _run_set_ulimit(300, 5000, hard=300, needed=400)
    assert "cannot raise the open-file limit" in str(short["stderr"]) and "needed=400" in str(short["stderr"])


def test_nofile_needed_follows_the_config() -> None:
    from gym_obs.config import GlobalAIOHTTPAsyncClientConfig, ServerInstanceConfig
    from gym_obs.server.ops import nofile_needed

    server = ServerInstanceConfig(
        entrypoint="a.b:C", server_type="resources_servers", port=16790, backlog=100
    )
    client = GlobalAIOHTTPAsyncClientConfig(
        global_aiohttp_connector_limit_per_host=50, global_aiohttp_control_connector_limit=10
    )
    assert nofile_needed(server, client, servers=3) == 100 + 3 * 50 + 10 + 256
    intended = client.model_copy(update={"global_aiohttp_intended_concurrency": 40})
    assert nofile_needed(server, intended, servers=3) == 100 + 40 + 10 + 256


def test_set_ulimit_never_lowers() -> None:
    result = set_ulimit(16)  # in this process: a no-op by construction
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert result.changed is False and result.ok is True
    assert result.after == result.before == (-1 if soft == _INF else soft)
    assert "already meets 16" in result.reason


def test_line_prefixer_prefixes_whole_lines_only() -> None:
    prefixer = LinePrefixer(output_prefix("model"))
    assert prefixer.feed(b"hello\nwor") == b"(model) hello\n"
    assert prefixer.feed(b"ld\n\nlast") == b"(model) world\n(model) \n"
    assert prefixer.flush() == b"(model) last\n"
    assert prefixer.flush() == b""


def test_line_prefixer_cuts_unbounded_lines() -> None:
    prefixer = LinePrefixer(b"(x) ")
    out = prefixer.feed(b"a" * 200_000)
    assert out.count(b"(x) ") == 3 and all(len(line) <= 64 * 1024 + 4 for line in out.splitlines())
    assert prefixer.flush().startswith(b"(x) a")


def test_pump_output_tees_raw_and_prefixed_and_survives_a_broken_sink() -> None:
    read_fd, write_fd = os.pipe()
    log, terminal = io.BytesIO(), io.BytesIO()
    broken = io.BytesIO()
    broken.close()
    with os.fdopen(read_fd, "rb", buffering=0) as source:
        thread = pump_output(source, "resources", raw=[log, broken], prefixed=[terminal])
        os.write(write_fd, "first line\nsecond ünïcode line\npartial".encode())
        os.close(write_fd)
        thread.join(timeout=10)
    assert not thread.is_alive()
    assert log.getvalue() == "first line\nsecond ünïcode line\npartial".encode()
    assert terminal.getvalue().decode() == (
        "(resources) first line\n(resources) second ünïcode line\n(resources) partial\n"
    )
