"""Panel, query and variable building blocks for :mod:`gym_obs.dashboards._boards`.

Wraps grafana-foundation-sdk so each dashboard reads as a list of questions: a fixed two-column grid and a
panel id counter make the generated JSON identical on every build, and every histogram panel is forced to
seconds with exemplars on (the click from a slow bucket to its trace).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dash_b
from grafana_foundation_sdk.builders import piechart, prometheus, table, timeseries
from grafana_foundation_sdk.cog import builder as cog_builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as common_m
from grafana_foundation_sdk.models import dashboard as dash_m
from grafana_foundation_sdk.models import piechart as piechart_m
from grafana_foundation_sdk.models import prometheus as prom_m

from gym_obs.dashboards.metrics import MetricSpec
from gym_obs.dashboards.naming import JOB_LABEL, PROMETHEUS_DATASOURCE_UID, prometheus_label
from gym_obs.telemetry import names

PROMETHEUS_DS = dash_m.DataSourceRef(type_val="prometheus", uid=PROMETHEUS_DATASOURCE_UID)
DASHBOARD_TAG = "gym-obs"
JOB_VAR = "job"
_GRID_WIDTH = 24
#: Every panel and query has this minimum step: Grafana's ``$__rate_interval`` is then at least four of
#: them (``max($__interval + step, 4 * step)``), i.e. four metric export intervals of a gym process, so a
#: rate never spans fewer than four exported points whatever the datasource's scrape interval says.
MIN_INTERVAL = f"{names.DEFAULT_EXPORT_INTERVAL_S}s"
_PANEL_HEIGHT = 8

# --- PromQL text ------------------------------------------------------------------------------------------


def label(attribute: str) -> str:
    """Prometheus label of a gym attribute name (always go through the exporter's rule)."""
    return prometheus_label(attribute)


def selector(series: str, *matchers: str, job: bool = True) -> str:
    """``series{job=~"$job",...}``: every panel honours the dashboard's service filter."""
    parts = ([f'{JOB_LABEL}=~"${JOB_VAR}"'] if job else []) + list(matchers)
    return f"{series}{{{','.join(parts)}}}"


def by(*labels: str) -> str:
    return ", ".join(labels)


def rate(series_selector: str) -> str:
    return f"rate({series_selector}[$__rate_interval])"


def sum_rate(series_selector: str, *group: str) -> str:
    grouping = f" by ({by(*group)})" if group else ""
    return f"sum{grouping} ({rate(series_selector)})"


def quantile(q: float, spec: MetricSpec, *group: str, matchers: Sequence[str] = ()) -> str:
    """``histogram_quantile`` over a gym histogram's buckets, grouped by ``le`` plus ``group``."""
    buckets = selector(spec.series("_bucket"), *matchers)
    return f"histogram_quantile({q}, {sum_rate(buckets, 'le', *group)})"


def ratio_or_zero(numerator: str, denominator: str) -> str:
    """``numerator / denominator`` that reads 0 (not "no data") while the numerator has no series yet."""
    return f"({numerator} or {denominator} * 0) / {denominator}"


def job_variable_query(*specs: MetricSpec) -> str:
    """``label_values`` over the series the dashboard draws, so the list shows only gym services."""
    series = "|".join(spec.series("_count") if spec.kind == "histogram" else spec.series() for spec in specs)
    return f'label_values({{__name__=~"{series}"}}, {JOB_LABEL})'


# --- panels -----------------------------------------------------------------------------------------------


@dataclass
class Target:
    """One PromQL query of a panel."""

    expr: str
    legend: str = "__auto"
    instant: bool = False
    table: bool = False


@dataclass
class Board:
    """Collects panels on a two-column grid with stable ids, then renders the dashboard JSON."""

    uid: str
    title: str
    description: str
    _panels: list[cog_builder.Builder[dash_m.Panel]] = field(default_factory=list)
    _variables: list[cog_builder.Builder[dash_m.VariableModel]] = field(default_factory=list)
    _next_id: int = 1
    _x: int = 0
    _y: int = 0

    def _place(self, panel: Any, width: int) -> None:
        panel.interval(MIN_INTERVAL)
        if self._x + width > _GRID_WIDTH:
            self._x, self._y = 0, self._y + _PANEL_HEIGHT
        panel.id(self._next_id).grid_pos(dash_m.GridPos(h=_PANEL_HEIGHT, w=width, x=self._x, y=self._y))
        self._next_id += 1
        self._x += width
        self._panels.append(panel)

    def query_variable(self, name: str, query: str, title: str) -> None:
        """A multi-select variable with "All" meaning ``.*`` (panels match it with ``=~``)."""
        variable = (
            dash_b.QueryVariable(name)
            .label(title)
            .datasource(PROMETHEUS_DS)
            .query({"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery", "qryType": 1})
            .refresh(dash_m.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dash_m.VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
            .current(dash_m.VariableOption(selected=True, text="All", value="$__all"))
        )
        self._variables.append(variable)

    def timeseries(
        self,
        title: str,
        description: str,
        targets: Sequence[Target],
        *,
        unit: str,
        width: int = 12,
        histogram: bool = False,
    ) -> None:
        """A time series panel; ``histogram=True`` marks a quantile panel: seconds, exemplars on."""
        panel = (
            timeseries.Panel()
            .title(title)
            .description(description)
            .datasource(PROMETHEUS_DS)
            .unit("s" if histogram else unit)
            .min(0)
            .line_width(1)
            .fill_opacity(10)
            .show_points(common_m.VisibilityMode.NEVER)
            .legend(
                common_b.VizLegendOptions()
                .display_mode(common_m.LegendDisplayMode.TABLE)
                .placement(common_m.LegendPlacement.BOTTOM)
                .show_legend(True)
                .calcs(["mean", "max", "lastNotNull"])
            )
            .tooltip(
                common_b.VizTooltipOptions()
                .mode(common_m.TooltipDisplayMode.MULTI)
                .sort(common_m.SortOrder.DESCENDING)
            )
        )
        for ref, target in zip(_REF_IDS, targets, strict=False):
            panel.with_target(_query(ref, target, exemplar=histogram))
        self._place(panel, width)

    def piechart(self, title: str, description: str, target: Target, *, width: int = 12) -> None:
        """Shares of a total over the dashboard's time range (an instant ``increase(...[$__range])``)."""
        panel = (
            piechart.Panel()
            .title(title)
            .description(description)
            .datasource(PROMETHEUS_DS)
            .unit("short")
            .reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
            .legend(
                piechart.PieChartLegendOptions()
                .display_mode(common_m.LegendDisplayMode.TABLE)
                .placement(common_m.LegendPlacement.RIGHT)
                .show_legend(True)
                .values([piechart_m.PieChartLegendValues.VALUE, piechart_m.PieChartLegendValues.PERCENT])
            )
            .with_target(_query("A", target, exemplar=False))
        )
        self._place(panel, width)

    def table(self, title: str, description: str, target: Target, *, width: int = 24) -> None:
        """An instant table (one row per label combination), sorted by value."""
        panel = (
            table.Panel()
            .title(title)
            .description(description)
            .datasource(PROMETHEUS_DS)
            .unit("short")
            .sort_by([common_b.TableSortByFieldState().display_name("Value").desc(True)])
            .with_transformation(
                dash_m.DataTransformerConfig(id_val="organize", options={"excludeByName": {"Time": True}})
            )
            .with_target(_query("A", target, exemplar=False))
        )
        self._place(panel, width)

    def build(self) -> dict[str, Any]:
        board = (
            dash_b.Dashboard(self.title)
            .uid(self.uid)
            .description(self.description)
            .tags([DASHBOARD_TAG])
            .readonly()
            .timezone("browser")
            .tooltip(dash_m.DashboardCursorSync.CROSSHAIR)
            .time("now-30m", "now")
            .refresh("10s")
            .link(
                dash_b.DashboardLink("gym dashboards")
                .type(dash_m.DashboardLinkType.DASHBOARDS)
                .tags([DASHBOARD_TAG])
                .as_dropdown(True)
                .include_vars(True)
                .keep_time(True)
            )
        )
        for variable in self._variables:
            board.with_variable(variable)
        for panel in self._panels:
            board.with_panel(panel)
        # Round-trip through the SDK's encoder so nested model objects become plain dicts and lists.
        result: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
        return result


_REF_IDS = "ABCDEFGH"


def _query(ref: str, target: Target, *, exemplar: bool) -> prometheus.Dataquery:
    query = (
        prometheus.Dataquery()
        .ref_id(ref)
        .datasource(PROMETHEUS_DS)
        .expr(target.expr)
        .legend_format(target.legend)
        .editor_mode(prom_m.QueryEditorMode.CODE)
        .exemplar(exemplar)
        .interval(MIN_INTERVAL)
    )
    if target.table:
        query.format(prom_m.PromQueryFormat.TABLE)
    if target.instant:
        query.instant()
    else:
        query.range()
    return query
