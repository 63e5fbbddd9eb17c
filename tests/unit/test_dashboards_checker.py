"""The pure parts of the PromQL checker (tests/e2e/promql_check.py): substitution and metric extraction."""

from __future__ import annotations

import pytest

from gym_obs import dashboards
from tests.e2e.promql_check import QueryWindow, metric_names, panel_queries, substitute, variable_values


def test_grafana_interval_variables() -> None:
    window = QueryWindow(start=1000.0, end=1600.0, scrape_interval_s=15.0)
    assert window.step == 15  # 600 s / 100 points = 6 s, but never below the scrape interval
    expr = "rate(x[$__rate_interval]) + y[$__interval] + increase(z[$__range]) + $__range_s + $__interval_ms"
    assert substitute(expr, {}, window) == "rate(x[60s]) + y[15s] + increase(z[600s]) + 600 + 15000"


def test_rate_interval_is_at_least_four_scrapes() -> None:
    window = QueryWindow(start=0.0, end=10.0, scrape_interval_s=1.0)
    assert window.step == 1 and window.rate_interval == 4
    assert substitute("$__rate_interval", {}, window) == "4s"
    fractional = QueryWindow(start=0.0, end=10.0, scrape_interval_s=0.5, step_s=0.5)
    assert substitute("$__rate_interval", {}, fractional) == "2s"
    assert substitute("$__interval", {}, fractional) == "500ms"


def test_template_variables_in_every_grafana_syntax() -> None:
    window = QueryWindow(0.0, 60.0, 15.0)
    values = {"job": ".*", "server": "model"}
    assert (
        substitute(
            'x{job=~"$job",a="${server}",b="${server:regex}",c="[[server]]",d="$jobless"}', values, window
        )
        == 'x{job=~".*",a="model",b="model",c="model",d="$jobless"}'
    )


def test_variable_values_default_to_all() -> None:
    board = {
        "templating": {
            "list": [
                {"name": "job", "includeAll": True, "allValue": ".*"},
                {"name": "pool", "includeAll": True},
                {"name": "fixed", "current": {"value": ["a"]}},
            ]
        }
    }
    assert variable_values(board) == {"job": ".*", "pool": ".*", "fixed": "a"}
    assert variable_values(board, {"job": "gym/agent"})["job"] == "gym/agent"


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ('sum by (le, job) (rate(a_bucket{job=~".*", le!="x"}[5m]))', {"a_bucket"}),
        ("histogram_quantile(0.99, sum(rate(a_bucket[1m])) by (le))", {"a_bucket"}),
        ("(sum(rate(a_total{k=\"v\"}[1m])) or sum(rate(b_total[1m])) * 0) / sum(rate(b_total[1m]))",
         {"a_total", "b_total"}),
        ('label_replace(up, "dst", "$1", "src", "(.*)") offset 5m', {"up"}),
        ('{__name__=~"a_count|b_total"}', {"a_count", "b_total"}),
        ('{__name__="exact"} + on (job) group_left (x) other', {"exact", "other"}),
        ("count(x) > bool 1e3 and y unless z", {"x", "y", "z"}),
        ("vector(1) + Inf - NaN", set()),
        ('rate(x[5m:30s]) @ end()', {"x"}),
    ],
)  # fmt: skip
def test_metric_names(expr: str, expected: set[str]) -> None:
    assert metric_names(expr) == expected


def test_panel_queries_walk_rows_and_skip_hidden_and_non_prometheus_targets() -> None:
    board = {
        "title": "b",
        "panels": [
            {"title": "p", "datasource": {"type": "prometheus"}, "targets": [{"refId": "A", "expr": "a"}]},
            {
                "type": "row",
                "title": "r",
                "panels": [
                    {"title": "q", "targets": [{"refId": "B", "expr": "b", "instant": True}]},
                    {"title": "h", "targets": [{"refId": "C", "expr": "c", "hide": True}]},
                    {
                        "title": "t",
                        "datasource": {"type": "tempo"},
                        "targets": [{"refId": "D", "query": "{}"}],
                    },
                ],
            },
        ],
    }
    queries = list(panel_queries(board))
    assert [(q.where, q.expr, q.instant) for q in queries] == [
        ("b / p / A", "a", False),
        ("b / q / B", "b", True),
    ]


def test_every_built_panel_query_names_a_metric() -> None:
    for board in dashboards.build_dashboards().values():
        for query in panel_queries(board):
            assert metric_names(query.expr), query.where
