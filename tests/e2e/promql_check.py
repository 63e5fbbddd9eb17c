"""Run every PromQL expression of every dashboard panel against a real Prometheus.

A dashboard that renders "No data" looks exactly like a quiet system, so this checker evaluates each panel
query the way Grafana would send it (``$__rate_interval``, ``$__interval``, ``$__range`` and template
variables substituted) through Prometheus's HTTP API and reports every query that fails, returns nothing,
returns only NaN/Inf, or names a metric Prometheus has never seen (``/api/v1/label/__name__/values``).
Template-variable queries (``label_values(...)``) are checked the same way.

Reusable: ``check_dashboards(base_url, dashboards, window)`` takes dashboard JSON dicts; ``run_prometheus``
starts Debian's ``prometheus`` scraping given targets with ``job`` = service.name. Also a command:
``python -m tests.e2e.promql_check --prometheus http://127.0.0.1:9090 --lookback 600``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# --- template substitution --------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueryWindow:
    """The time range the dashboards are "looking at", and the scrape interval Grafana knows about."""

    start: float
    end: float
    scrape_interval_s: float = 15.0
    step_s: float | None = None  # default: like Grafana, about 100 points but never below the scrape interval

    @property
    def step(self) -> float:
        if self.step_s is not None:
            return self.step_s
        return max(self.scrape_interval_s, math.ceil((self.end - self.start) / 100))

    @property
    def rate_interval(self) -> float:
        # Grafana: max($__interval + scrape interval, 4 * scrape interval).
        return max(self.step + self.scrape_interval_s, 4 * self.scrape_interval_s)

    @property
    def range_s(self) -> float:
        return max(self.end - self.start, 1.0)


def _duration(seconds: float) -> str:
    millis = round(seconds * 1000)
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


def variable_values(
    dashboard: Mapping[str, Any], overrides: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Each template variable's value: an override, else "All" (allValue or ``.*``), else current."""
    values: dict[str, str] = {}
    for variable in dashboard.get("templating", {}).get("list", []):
        name = variable.get("name")
        if not name:
            continue
        if overrides and name in overrides:
            values[name] = overrides[name]
        elif variable.get("includeAll"):
            values[name] = variable.get("allValue") or ".*"
        else:
            current = (variable.get("current") or {}).get("value", "")
            values[name] = current[0] if isinstance(current, list) and current else str(current)
    return values


def substitute(expr: str, variables: Mapping[str, str], window: QueryWindow) -> str:
    """Expand Grafana's built-in interval variables and the template variables, as Grafana does."""
    builtins = {
        "__rate_interval_ms": str(round(window.rate_interval * 1000)),
        "__rate_interval": _duration(window.rate_interval),
        "__interval_ms": str(round(window.step * 1000)),
        "__interval": _duration(window.step),
        "__range_ms": str(round(window.range_s * 1000)),
        "__range_s": str(round(window.range_s)),
        "__range": _duration(window.range_s),
    }
    values = {**builtins, **variables}

    def lookup(match: re.Match[str]) -> str:
        name = match.group("braced") or match.group("bracket") or match.group("plain")
        if name not in values:
            return match.group(0)
        return values[name]

    pattern = re.compile(
        r"\$\{(?P<braced>\w+)(?::\w+)?\}|\[\[(?P<bracket>\w+)(?::\w+)?\]\]|\$(?P<plain>\w+)",
    )
    return pattern.sub(lookup, expr)


# --- metric names in PromQL -------------------------------------------------------------------------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_NAME_MATCHER = re.compile(r'__name__\s*(=~|=)\s*("(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\')')
_BRACES = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE)
_IDENT = re.compile(r"(?<![\w:.])([A-Za-z_:][\w:]*)(\s*\()?")
_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
     "offset", "atan2", "inf", "nan"}
)  # fmt: skip
_PLAIN_ALTERNATION = re.compile(r"^[A-Za-z_:][\w:]*(?:\|[A-Za-z_:][\w:]*)*$")


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (bare selectors and literal ``__name__`` matchers)."""
    found: set[str] = set()
    for op, quoted in _NAME_MATCHER.findall(expr):
        value = quoted[1:-1]
        if op == "=":
            found.add(value)
        elif _PLAIN_ALTERNATION.match(value):
            found.update(value.split("|"))
    text = _STRING.sub('""', expr)
    previous = None
    while previous != text:  # nested braces cannot occur, but label matchers may follow each other
        previous, text = text, _BRACES.sub(" ", _BRACKETS.sub(" ", text))
    text = _GROUPING.sub(" ", text)
    for name, call in _IDENT.findall(text):
        if call or name.lower() in _KEYWORDS:
            continue
        found.add(name)
    return found


# --- Prometheus HTTP API ----------------------------------------------------------------------------------


class PrometheusError(RuntimeError):
    """The API answered with an error (bad query, timeout) or not at all."""


@dataclass
class PrometheusAPI:
    base_url: str
    timeout_s: float = 10.0

    def call(self, path: str, params: Sequence[tuple[str, str]] = (), *, post: bool = True) -> Any:
        """POST (queries can be long) or GET (the label endpoints accept only GET); return ``data``."""
        encoded = urllib.parse.urlencode(list(params))
        url = self.base_url.rstrip("/") + path
        if post and params:
            request = urllib.request.Request(url, data=encoded.encode())
            request.add_header("Content-Type", "application/x-www-form-urlencoded")
        else:
            request = urllib.request.Request(f"{url}?{encoded}" if params else url)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            try:
                body = json.loads(exc.read())
            except ValueError:
                raise PrometheusError(f"HTTP {exc.code} from {path}") from exc
        except (OSError, ValueError) as exc:
            raise PrometheusError(f"{path}: {exc}") from exc
        if body.get("status") != "success":
            raise PrometheusError(f"{body.get('errorType', 'error')}: {body.get('error', body)}")
        return body["data"]

    def metric_names(self) -> set[str]:
        return set(self.call("/api/v1/label/__name__/values", post=False))

    def label_values(self, label: str, match: str | None, window: QueryWindow) -> list[str]:
        params = [("start", f"{window.start:.3f}"), ("end", f"{window.end:.3f}")]
        if match:
            params.append(("match[]", match))
        return list(self.call(f"/api/v1/label/{urllib.parse.quote(label)}/values", params, post=False))

    def query(self, expr: str, *, at: float) -> Any:
        return self.call("/api/v1/query", [("query", expr), ("time", f"{at:.3f}")])

    def query_range(self, expr: str, window: QueryWindow) -> Any:
        params = [
            ("query", expr),
            ("start", f"{window.start:.3f}"),
            ("end", f"{window.end:.3f}"),
            ("step", _duration(window.step)),
        ]
        return self.call("/api/v1/query_range", params)


# --- walking dashboards -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str
    panel: str
    ref_id: str
    expr: str
    instant: bool

    @property
    def where(self) -> str:
        return f"{self.dashboard} / {self.panel} / {self.ref_id}"


def _panels(panels: Sequence[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))  # rows carry their panels when collapsed


def panel_queries(dashboard: Mapping[str, Any]) -> Iterator[PanelQuery]:
    """Every visible Prometheus query of every panel (rows included)."""
    title = dashboard.get("title") or dashboard.get("uid") or "?"
    for panel in _panels(dashboard.get("panels", [])):
        panel_ds = panel.get("datasource") or {}
        for target in panel.get("targets", []):
            datasource = target.get("datasource") or panel_ds
            if datasource.get("type", "prometheus") != "prometheus" or target.get("hide"):
                continue
            expr = target.get("expr")
            if not expr:
                continue
            yield PanelQuery(
                dashboard=title,
                panel=str(panel.get("title", panel.get("id"))),
                ref_id=str(target.get("refId", "?")),
                expr=expr,
                instant=bool(target.get("instant")) and not target.get("range"),
            )


# --- checking ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    where: str
    expr: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}\n    {self.expr}"


@dataclass
class CheckReport:
    checked: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.checked) and not self.problems

    def summary(self) -> str:
        lines = [f"{len(self.checked)} queries checked, {len(self.problems)} problems"]
        lines += [str(problem) for problem in self.problems]
        return "\n".join(lines)


def _finite_values(data: Mapping[str, Any]) -> tuple[int, int]:
    """(series count, finite sample count) of a query result."""
    result_type = data.get("resultType")
    result: Any = data.get("result") or []
    if result_type == "matrix":
        samples = [value for series in result for _, value in series.get("values", [])]
        return len(result), sum(math.isfinite(float(value)) for value in samples)
    if result_type == "vector":
        return len(result), sum(math.isfinite(float(series["value"][1])) for series in result)
    if result_type == "scalar":
        return 1, int(math.isfinite(float(result[1])))
    return 0, 0


def _check_names(where: str, expr: str, known: set[str]) -> list[Problem]:
    names = metric_names(expr)
    if not names:
        return [Problem(where, expr, "names no metric")]
    unknown = sorted(names - known)
    if unknown:
        return [Problem(where, expr, f"unknown metric(s) {', '.join(unknown)} (not in Prometheus)")]
    return []


def _check_query(api: PrometheusAPI, query: PanelQuery, expr: str, window: QueryWindow) -> list[Problem]:
    try:
        data = api.query(expr, at=window.end) if query.instant else api.query_range(expr, window)
    except PrometheusError as exc:
        return [Problem(query.where, expr, f"query failed: {exc}")]
    series, finite = _finite_values(data)
    if series == 0:
        return [Problem(query.where, expr, "empty result")]
    if finite == 0:
        return [Problem(query.where, expr, f"no finite value in {series} series (all NaN/Inf)")]
    return []


_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(?P<match>.+?)\s*,\s*)?(?P<label>[A-Za-z_]\w*)\s*\)\s*$")


def _check_variable(
    api: PrometheusAPI, where: str, query: str, window: QueryWindow, known: set[str]
) -> list[Problem]:
    parsed = _LABEL_VALUES.match(query)
    if parsed is None:
        return [Problem(where, query, "unsupported variable query (expected label_values(...))")]
    match, label_name = parsed.group("match"), parsed.group("label")
    problems = _check_names(where, match, known) if match else []
    try:
        values = api.label_values(label_name, match, window)
    except PrometheusError as exc:
        return [*problems, Problem(where, query, f"query failed: {exc}")]
    if not values:
        problems.append(Problem(where, query, f"no values for label {label_name}"))
    return problems


def check_dashboards(
    base_url: str,
    dashboards: Mapping[str, Mapping[str, Any]] | Sequence[Mapping[str, Any]],
    window: QueryWindow,
    *,
    variables: Mapping[str, str] | None = None,
) -> CheckReport:
    """Check every panel query and variable query of ``dashboards`` against the Prometheus at ``base_url``."""
    api = PrometheusAPI(base_url)
    boards = list(dashboards.values()) if isinstance(dashboards, Mapping) else list(dashboards)
    report = CheckReport()
    try:
        known = api.metric_names()
    except PrometheusError as exc:
        report.problems.append(Problem(base_url, "/api/v1/label/__name__/values", f"failed: {exc}"))
        return report
    for dashboard in boards:
        values = variable_values(dashboard, variables)
        for variable in dashboard.get("templating", {}).get("list", []):
            raw = variable.get("query")
            text = raw.get("query") if isinstance(raw, Mapping) else raw
            if variable.get("type") != "query" or not text:
                continue
            where = f"{dashboard.get('title')} / variable {variable.get('name')}"
            expanded = substitute(text, values, window)
            report.checked.append(where)
            report.problems += _check_variable(api, where, expanded, window, known)
        for query in panel_queries(dashboard):
            expr = substitute(query.expr, values, window)
            report.checked.append(query.where)
            problems = _check_names(query.where, expr, known)
            report.problems += problems + _check_query(api, query, expr, window)
    return report


def load_dashboards(directory: Path) -> dict[str, dict[str, Any]]:
    """Every ``*.json`` dashboard directly in ``directory``, keyed by file name."""
    return {path.name: json.loads(path.read_text()) for path in sorted(directory.glob("*.json"))}


# --- a real Prometheus for tests --------------------------------------------------------------------------


def prometheus_config(
    targets: Mapping[str, Sequence[str]],
    scrape_interval_s: float,
    file_sd: Sequence[Path] = (),
) -> dict[str, Any]:
    """Scrape config giving each target ``job`` = its service.name (target labels beat job_name).

    ``targets`` are static ({service.name: [host:port]}); ``file_sd`` files (such as the harness's
    ``prometheus_targets.json``) are watched, so they may be written after Prometheus started.
    """
    interval = _duration(scrape_interval_s)
    scrape: dict[str, Any] = {"job_name": "gym"}
    if targets:
        scrape["static_configs"] = [
            {"targets": list(addresses), "labels": {"job": service_name}}
            for service_name, addresses in sorted(targets.items())
        ]
    if file_sd:
        scrape["file_sd_configs"] = [{"files": [str(path) for path in file_sd], "refresh_interval": "5s"}]
    return {
        "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
        "rule_files": [str(Path(__file__).resolve().parents[2] / "collector" / "alerts.yml")],
        "scrape_configs": [scrape],
    }


@contextmanager
def run_prometheus(
    targets: Mapping[str, Sequence[str]],
    work_dir: Path,
    *,
    listen: str = "127.0.0.1:23090",
    scrape_interval_s: float = 1.0,
    ready_timeout_s: float = 30.0,
    file_sd: Sequence[Path] = (),
) -> Iterator[str]:
    """Start Debian's ``prometheus`` scraping ``targets`` ({service.name: [host:port]}) and the targets of
    the ``file_sd`` files; yield its URL."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise RuntimeError("prometheus is not installed (scripts/test.sh installs Debian's package)")
    config = work_dir / "prometheus.yml"
    config_data = prometheus_config(targets, scrape_interval_s, file_sd)
    config.write_text(json.dumps(config_data, indent=2))  # JSON is YAML
    log = (work_dir / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={work_dir / 'data'}",
            f"--web.listen-address={listen}",
            "--enable-feature=exemplar-storage",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base_url = f"http://{listen}"
    try:
        _wait_ready(base_url, process, ready_timeout_s, work_dir / "prometheus.log")
        yield base_url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log.close()


def _wait_ready(base_url: str, process: subprocess.Popen[bytes], timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"prometheus exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(base_url + "/-/ready", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"prometheus at {base_url} not ready after {timeout_s}s")


def wait_for_samples(
    base_url: str, selector: str, *, min_samples: int, timeout_s: float = 60.0, window_s: float = 600.0
) -> None:
    """Poll until every series matching ``selector`` has at least ``min_samples`` scraped samples."""
    api = PrometheusAPI(base_url)
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = api.query(f"count_over_time({selector}[{_duration(window_s)}])", at=time.time())
            counts = [float(series["value"][1]) for series in last.get("result", [])]
            if counts and min(counts) >= min_samples:
                return
        except PrometheusError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"no {min_samples} samples of {selector} after {timeout_s}s (last answer {last})")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus", required=True, help="base URL, e.g. http://127.0.0.1:9090")
    parser.add_argument("--dashboards", type=Path, default=Path("dashboards"))
    parser.add_argument("--lookback", type=float, default=600.0, help="seconds before now to look at")
    parser.add_argument("--scrape-interval", type=float, default=15.0)
    parser.add_argument("--var", action="append", default=[], help="NAME=VALUE template variable override")
    args = parser.parse_args(argv)
    now = time.time()
    window = QueryWindow(now - args.lookback, now, args.scrape_interval)
    overrides = dict(item.split("=", 1) for item in args.var)
    report = check_dashboards(args.prometheus, load_dashboards(args.dashboards), window, variables=overrides)
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
