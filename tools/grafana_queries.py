"""Run a Grafana dashboard's queries against Prometheus as Grafana would, without Grafana.

Template variables are resolved in order from their own ``label_values`` queries (a later
variable's query sees the earlier choices, as in Grafana); ``$__range``,
``$__rate_interval`` and ``$__interval`` are replaced by durations; instant targets are
evaluated at the end of the time range, the others as range queries. Used by the dashboard
tests (every query parses and returns series) and the preview renderer.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tools.demo_prometheus import Prometheus

_LABEL_VALUES = re.compile(r"^label_values\((?:(?P<match>.+),\s*)?(?P<label>[a-zA-Z_][a-zA-Z0-9_]*)\)$", re.S)
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
ALL = ".*"


@dataclass(frozen=True)
class TimeRange:
    start: float
    end: float
    step: float  # the query step (Grafana's $__interval for the panel)
    rate_interval: str  # $__rate_interval: at least four sample intervals

    @property
    def range_s(self) -> float:
        return self.end - self.start


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel that is not a row (rows nest panels when collapsed)."""
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def variables(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return dashboard["templating"]["list"]


def variable_query(variable: dict[str, Any]) -> str:
    query = variable.get("query")
    return query["query"] if isinstance(query, dict) else str(query)


def regex_escape(value: str) -> str:
    """As Grafana's Prometheus data source escapes a value for =~ (regex, inside a PromQL string)."""
    return re.sub(r"[$^*{}\[\]'+?.()|\\]", lambda m: "\\\\" + m.group(0), value)


def substitute(text: str, values: dict[str, str], time_range: TimeRange | None = None) -> str:
    """Grafana's variable interpolation for PromQL: values are regexes (".*" for All)."""
    if time_range is not None:
        text = (text.replace("$__rate_interval", time_range.rate_interval)
                .replace("$__range", f"{int(round(time_range.range_s))}s")
                .replace("$__interval", f"{int(round(time_range.step))}s"))

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name == "datasource":
            return match.group(0)
        if name not in values:
            raise KeyError(f"variable ${name} is not defined")
        return values[name]

    return _VARIABLE.sub(value, text)


def resolve_variables(api: Prometheus, dashboard: dict[str, Any], time_range: TimeRange,
                      prefer: dict[str, str] | None = None, use_all: bool = False) -> dict[str, str]:
    """A value per variable, from the data: ``prefer`` where it is among the values, else the first.

    With ``use_all``, variables that offer "All" get it (".*"). Raises ValueError when a
    variable's query finds no values (a variable the data cannot fill).
    """
    prefer = prefer or {}
    chosen: dict[str, str] = {}
    for variable in variables(dashboard):
        if variable["type"] != "query":
            continue
        if use_all and variable.get("includeAll"):
            chosen[variable["name"]] = variable.get("allValue") or ALL
            continue
        match = _LABEL_VALUES.match(variable_query(variable).strip())
        if match is None:
            raise ValueError(f"variable {variable['name']}: only label_values(...) queries are supported")
        selector = substitute(match.group("match") or "{__name__=~\".+\"}", chosen)
        found = sorted(api.label_values(match.group("label"), selector, time_range.start, time_range.end))
        if not found:
            raise ValueError(f"variable {variable['name']}: {variable_query(variable)!r} found no values")
        wanted = prefer.get(variable["name"])
        chosen[variable["name"]] = regex_escape(wanted if wanted in found else found[0])
    return chosen


@dataclass
class QueryResult:
    panel: dict[str, Any]
    target: dict[str, Any]
    expr: str
    series: list[dict[str, Any]]


def run_panel(api: Prometheus, panel: dict[str, Any], values: dict[str, str],
              time_range: TimeRange) -> list[QueryResult]:
    out = []
    for target in panel.get("targets", []):
        expr = substitute(target["expr"], values, time_range)
        if target.get("instant"):
            series = api.query(expr, time_range.end)
        else:
            series = api.query_range(expr, time_range.start, time_range.end, time_range.step)
        out.append(QueryResult(panel, target, expr, series))
    return out


def run_annotations(api: Prometheus, dashboard: dict[str, Any], values: dict[str, str],
                    time_range: TimeRange) -> list[tuple[str, list[dict[str, Any]]]]:
    out = []
    for annotation in dashboard["annotations"]["list"]:
        if "expr" not in annotation:
            continue
        expr = substitute(annotation["expr"], values, time_range)
        out.append((annotation["name"], api.query_range(expr, time_range.start, time_range.end, time_range.step)))
    return out


def legend(target: dict[str, Any], labels: dict[str, str]) -> str:
    """Grafana's legendFormat: {{label}} replaced by the series' label values."""
    fmt = target.get("legendFormat") or "__auto"
    if fmt == "__auto":
        return ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__") or target["expr"][:40]
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)
