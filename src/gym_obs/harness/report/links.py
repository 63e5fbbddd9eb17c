"""Where a trace can be opened: the report's own anchor, or Grafana Explore when spans went to OTLP."""

from __future__ import annotations

import json
from urllib.parse import quote

__all__ = ["DEFAULT_GRAFANA_URL", "TEMPO_DATASOURCE_UID", "grafana_explore_url", "trace_anchor"]

DEFAULT_GRAFANA_URL = "http://127.0.0.1:3000"
TEMPO_DATASOURCE_UID = "gym-tempo"  # dashboards/provisioning/datasources/gym-datasources.yaml


def trace_anchor(trace_id: str) -> str:
    """The element id of a trace's waterfall: ``report.html#trace-<id>`` opens it."""
    return f"trace-{trace_id}"


def grafana_explore_url(grafana: str, trace_id: str) -> str:
    """Grafana Explore on the gym Tempo datasource, querying this trace id."""
    pane = {
        "datasource": TEMPO_DATASOURCE_UID,
        "queries": [{"refId": "A", "queryType": "traceql", "query": trace_id}],
    }
    return f"{grafana.rstrip('/')}/explore?left={quote(json.dumps(pane, separators=(',', ':')), safe='')}"
