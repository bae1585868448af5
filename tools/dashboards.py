"""otel-ofu's Grafana dashboards, generated: deploy/grafana/*.json.

One place builds every panel, so each gets the ``${datasource}`` data source, a description,
a unit and a unique id, and every query uses the same label selectors as the template
variables. Names come from the ``prometheus`` exporter (gpu_ofu, job_finding, ...) and the
recording rules of deploy/prometheus/otel-ofu.rules.yml. Only Grafana's core panels.

    python -m tools.dashboards           # write deploy/grafana/*.json
    python -m tools.dashboards --check   # exit 1 if a committed dashboard differs (CI)
"""

from __future__ import annotations

import functools
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.generated import write_or_check

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "deploy" / "grafana"
SCHEMA_VERSION = 39  # Grafana 10.3+; newer Grafana migrates it on import
DS = {"type": "prometheus", "uid": "${datasource}"}
TAGS = ["otel-ofu", "gpu"]
NO_JOB = '"|none|unknown"'  # ofu_job_id values that are not a job

# Units (Grafana unit ids); "suffix:" units render the text after the number.
PERCENT = "percentunit"
GPU_HOURS = "suffix: GPU h"
GPUS = "suffix: GPUs"
FLOPS = "flops"
HERTZ = "hertz"
WATTS = "watt"
PER_SECOND = "suffix: /s"
COUNT = "none"
# Money has no fixed currency (the jobs processor's cost.currency, in the ofu_cost_currency label the legends show),
# so a suffix unit rather than Grafana's currencyUSD / currencyEUR.
MONEY_PER_HOUR = "suffix: /h"
JOULES_PER_PFLOP = "suffix: J/PFLOP"

# Recording rules (deploy/prometheus/otel-ofu.rules.yml).
FLEET_SUM = "cluster_namespace_model_precision:gpu_ofu:sum5m"
FLEET_COUNT = "cluster_namespace_model_precision:gpu_ofu:count5m"
FLEET_GPUS = "cluster_namespace_model_precision:gpus:avg5m"
FLEET_WASTED = "cluster_namespace_model_precision:gpus_wasted:avg5m"
FLEET_BUCKETS = "cluster_namespace_model_precision:gpu_ofu_avg5m_bucket:count"
WITHOUT_OFU = "cluster_namespace_model_reason:gpus_without_ofu:count"
JOB_OFU_5M = "cluster_namespace_job:gpu_ofu:avg5m"
JOB_WASTED = "cluster_namespace_job:gpus_wasted:avg5m"
JOB_GPUS = "cluster_namespace_job:gpus:avg5m"
FLEET_PARTS = "cluster_namespace_model_part:gpus:avg5m"
JOB_PARTS = "cluster_namespace_job_part:gpu_ofu_loss:avg5m"
COST_LOST = "cluster_namespace_part_currency:job_cost_lost_per_hour:rate5m"

# The loss account's parts (docs/method.md#where-the-flops-go-the-loss-account), coloured as in
# `otel-ofu report`'s breakdown plot (otel_ofu/report/plots.py), so a part looks alike everywhere.
PART_COLORS = {
    "engine_idle": "#d62728", "engine_idle+sm_idle": "#e377c2", "engine_idle+sm_idle+non_tensor": "#bc80bd",
    "sm_idle": "#ff7f0e", "sm_idle+non_tensor": "#ffbb78", "non_tensor": "#9467bd", "clock": "#1f77b4",
    "padding": "#8c564b", "unknown": "#c7c7c7", "useful": "#2ca02c", "useful (OFU)": "#2ca02c",
    "unallocated": "#7f7f7f", "clock boost (gained)": "#aec7e8",
}
PART_HELP = ("engine_idle: no kernel ran (input pipeline, host, waiting for other ranks); sm_idle: kernels on few "
             "SMs (launch gaps, small grids); non_tensor: SMs busy without tensor work (elementwise, softmax, "
             "communication, memory-bound kernels); clock: SMs below the reference clock (power cap, cooling); "
             "clock boost (gained): SMs above it, GPU time gained, not lost; "
             "padding: tensor work 2MNK does not count (GEMM shapes). A name with + is two steps a missing counter "
             "keeps together (sm_idle+non_tensor without SM_ACTIVE).")


# The clock part below 0 (the SM clock boosting above f_ref), shown as a series of its own named as the gain it is,
# never as a negative loss (docs/method.md#wasted-gpu-hours-and-the-clock-gain).
CLOCK_GAIN = "clock boost (gained)"
# The jobs processor's cumulative GPU-hours of a job: what each part lost, and apart what it gained (two counters,
# so neither falls: a window's negative clock part adds to the gain, never subtracts from the loss).
JOB_LOST_COUNTER = "job_ofu_loss_gpu_hours_total"
JOB_GAINED_COUNTER = "job_ofu_gain_gpu_hours_total"


def lost_and_gained(parts: str, *, gain_sign: str = "", sort: bool = False, **kwargs: Any) -> list[dict[str, Any]]:
    """Two targets from a query of loss-part shares by ofu_loss_part (gauges: a part's share, the clock's below 0
    where its gain outweighs its loss): each part where it is a loss (>= 0), and the clock part where it is below 0
    as CLOCK_GAIN (``gain_sign="-"``: as a positive amount gained)."""
    lost = f"{parts} >= 0"
    gained = f"{gain_sign}({parts}) {'>' if gain_sign else '<'} 0"
    return [target(f"sort_desc({lost})" if sort else lost, "{{ofu_loss_part}}", **kwargs),
            target(f'label_replace({gained}, "ofu_loss_part", "{CLOCK_GAIN}", "", "")', "{{ofu_loss_part}}",
                   **kwargs)]


def lost_and_gained_counters(selector: str, *, sort: bool = False, **kwargs: Any) -> list[dict[str, Any]]:
    """Two targets from the jobs processor's counters of a job's GPU-hours: what each part lost, by ofu_loss_part,
    and what its windows gained (a clock boost above f_ref) as CLOCK_GAIN, each never below 0."""
    lost = f"max by (ofu_loss_part) ({JOB_LOST_COUNTER}{{{selector}}})"
    gained = f"sum(max by (ofu_loss_part) ({JOB_GAINED_COUNTER}{{{selector}}}))"
    return [target(f"sort_desc({lost})" if sort else lost, "{{ofu_loss_part}}", **kwargs),
            target(f'label_replace({gained}, "ofu_loss_part", "{CLOCK_GAIN}", "", "")', "{{ofu_loss_part}}",
                   **kwargs)]


def part_colors(*, then_more: bool = False) -> list[dict[str, Any]]:
    """Overrides that give each part of the loss account its colour; ``then_more``: also where the series' name goes
    on after the part (a legend "{{ofu_loss_part}} {{ofu_cost_currency}}")."""
    return [{"matcher": {"id": "byRegexp", "options": f"^{re.escape(name)}( .*)?$"} if then_more
             else {"id": "byName", "options": name},
             "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": color}}]}
            for name, color in PART_COLORS.items()]

# OFU colours: below 20 % of peak is poor for training, 35 %+ is good (the paper's fleet: 25-55 %).
OFU_STEPS = [{"color": "red", "value": None}, {"color": "orange", "value": 0.2}, {"color": "green", "value": 0.35}]
ZERO_IS_GOOD = [{"color": "green", "value": None}, {"color": "red", "value": 1}]
NEUTRAL = [{"color": "blue", "value": None}]
DASHED = {"fill": "dash", "dash": [10, 10]}


def target(expr: str, legend: str = "__auto", *, instant: bool = False, fmt: str = "time_series",
           interval: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"datasource": DS, "editorMode": "code", "expr": expr.strip(), "legendFormat": legend,
                           "range": not instant, "instant": instant, "format": fmt}
    if interval:
        out["interval"] = interval
    return out


@dataclass
class Panel:
    """A panel before layout: kind, title, description, unit, targets, size and extra JSON."""

    kind: str
    title: str
    description: str
    unit: str
    targets: list[dict[str, Any]]
    width: int = 12
    height: int = 8
    thresholds: list[dict[str, Any]] = field(default_factory=lambda: NEUTRAL)
    options: dict[str, Any] = field(default_factory=dict)
    custom: dict[str, Any] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)  # extra fieldConfig.defaults (min, max, mappings)
    overrides: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # transformations, interval, ...


def _json(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    targets = [dict(t, refId=chr(ord("A") + i)) for i, t in enumerate(panel.targets)]
    defaults: dict[str, Any] = {"unit": panel.unit, "color": {"mode": "palette-classic"},
                                "thresholds": {"mode": "absolute", "steps": panel.thresholds}, **panel.defaults}
    if panel.custom:
        defaults["custom"] = panel.custom
    if panel.kind in ("stat", "bargauge"):
        defaults["color"] = {"mode": "thresholds"}
    return {"id": panel_id, "type": panel.kind, "title": panel.title, "description": panel.description,
            "datasource": DS, "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
            "targets": targets, "fieldConfig": {"defaults": defaults, "overrides": panel.overrides},
            "options": panel.options, **panel.extra}


def _layout(rows: list[tuple[str, list[Panel]]]) -> list[dict[str, Any]]:
    """Rows of panels, left to right, wrapping at Grafana's 24 columns; a row panel above each."""
    out: list[dict[str, Any]] = []
    y, next_id = 0, 1
    for title, panels in rows:
        out.append({"id": next_id, "type": "row", "title": title, "collapsed": False, "panels": [],
                    "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})
        next_id += 1
        y += 1
        x, line_height = 0, 0
        for panel in panels:
            if x + panel.width > 24:
                x, y, line_height = 0, y + line_height, 0
            out.append(_json(panel, next_id, x, y))
            next_id += 1
            x += panel.width
            line_height = max(line_height, panel.height)
        y += line_height
    return out


def datasource_variable() -> dict[str, Any]:
    return {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
            "description": "The Prometheus-compatible data source that holds otel-ofu's metrics.",
            "current": {}, "hide": 0, "includeAll": False, "multi": False, "options": [], "refresh": 1, "regex": ""}


def query_variable(name: str, label: str, query: str, description: str, *, multi: bool = True,
                   include_all: bool = True) -> dict[str, Any]:
    """A label_values variable; "All" is the regex .* so it also matches series without the label."""
    out: dict[str, Any] = {
        "name": name, "label": label, "type": "query", "datasource": DS, "description": description,
        "definition": query, "query": {"qryType": 1, "query": query, "refId": "PrometheusVariableQueryEditor"},
        "current": {}, "hide": 0, "includeAll": include_all, "multi": multi, "options": [], "refresh": 2,
        "regex": "", "sort": 1,
    }
    if include_all:
        out["allValue"] = ".*"
    return out


CLUSTER_VARIABLE_HELP = ("The cluster label your remote write, federation or scrape config adds (Prometheus "
                         "external_labels or a target label). Without one, \"All\" matches every series.")


def dashboard(uid: str, title: str, description: str, variables: list[dict[str, Any]],
              rows: list[tuple[str, list[Panel]]], *, annotations: list[dict[str, Any]] | None = None,
              time_from: str = "now-6h") -> dict[str, Any]:
    builtin = {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True,
               "hide": True, "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"}
    return {
        "uid": uid, "title": title, "description": description, "tags": TAGS, "editable": True,
        "graphTooltip": 1, "timezone": "browser", "time": {"from": time_from, "to": "now"}, "refresh": "1m",
        "schemaVersion": SCHEMA_VERSION, "version": 1, "fiscalYearStartMonth": 0, "liveNow": False,
        "links": [{"title": "otel-ofu dashboards", "type": "dashboards", "tags": ["otel-ofu"], "asDropdown": True,
                   "includeVars": False, "keepTime": True, "icon": "external link", "targetBlank": False,
                   "tooltip": "", "url": ""}],
        "annotations": {"list": [builtin, *(annotations or [])]},
        "templating": {"list": variables},
        "panels": _layout(rows),
    }


def timeseries(title: str, description: str, unit: str, targets: list[dict[str, Any]], *, width: int = 12,
               height: int = 8, bars: bool = False, fill: int = 10, stack: bool = False, minimum: float | None = 0,
               **kwargs: Any) -> Panel:
    custom = {"drawStyle": "bars" if bars else "line", "lineWidth": 1, "fillOpacity": fill, "showPoints": "never",
              "spanNulls": False, "axisSoftMin": minimum, "stacking": {"mode": "normal" if stack else "none",
                                                                      "group": "A"}}
    if minimum is None:
        del custom["axisSoftMin"]
    options = {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
               "tooltip": {"mode": "multi", "sort": "desc"}}
    return Panel("timeseries", title, description, unit, targets, width, height, custom=custom, options=options,
                 **kwargs)


def stat(title: str, description: str, unit: str, expr: str, *, steps: list[dict[str, Any]] | None = None,
         width: int = 4, height: int = 5, decimals: int | None = None, no_value: str = "") -> Panel:
    defaults: dict[str, Any] = {}
    if decimals is not None:
        defaults["decimals"] = decimals
    if no_value:
        defaults["noValue"] = no_value
    options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}, "colorMode": "background",
               "graphMode": "none", "justifyMode": "center", "orientation": "auto", "textMode": "value",
               "wideLayout": True, "showPercentChange": False}
    return Panel("stat", title, description, unit, [target(expr, instant=True)], width, height,
                 thresholds=steps or NEUTRAL, options=options, defaults=defaults)


# --- Fleet ----------------------------------------------------------------------------------------

FLEET_SEL = 'cluster=~"$cluster", k8s_namespace_name=~"$namespace", hw_model=~"$gpu_model", ofu_precision=~"$precision"'
FLEET_NO_PRECISION = 'cluster=~"$cluster", k8s_namespace_name=~"$namespace", hw_model=~"$gpu_model"'
JOBS_SEL = 'cluster=~"$cluster", k8s_namespace_name=~"$namespace"'


# The jobs processor's ledger (docs/jobs.md): a job's money by part, its energy and FLOPs, its stalled GPU time; each
# counter as the prometheus exporter names it. Several jobs-tier instances may report the same job, so a job's
# counter is read once (max by job) before jobs are added up.
JOB_COST_COUNTER = "job_cost_total"
JOB_ENERGY_COUNTER = "job_energy_joules_total"
JOB_FLOPS_COUNTER = "job_flops_total"
JOB_STALLED_COUNTER = "job_stalled_gpu_hours_total"
ONE_JOB = "cluster, ofu_job_id"  # the labels that tell a job apart across instances
STALLED = 'ofu_finding_kind="stalled"'
# The jobs processor sends a job's counters once a bin (a minute): a rate or increase at each step reads 5 minutes,
# as the recording rules do, so a window always holds several of its samples.
LEDGER_STEP_WINDOW = "5m"


def once_per_job(function: str, counter: str, selector: str, window: str, by: str = "") -> str:
    """``function(counter[window])`` read once per job (and ``by``) however many instances report it."""
    return f"max by ({ONE_JOB}{', ' + by if by else ''}) ({function}({counter}{{{selector}}}[{window}]))"


def or_zero_with_jobs(expr: str, selector: str) -> str:
    """``expr``, or 0 where it has no series but the jobs processor reports jobs: a series such as a job's stalled
    GPU-hours exists only once it has something to count, and no jobs processor stays "no value", never 0."""
    return f"({expr}) or on() (0 * group(job_gpus{{{selector}}}))"


def ledger(selector: str) -> list[Panel]:
    """The fleet's Ledger row: money lost by part and by job, energy per useful PFLOP, stalled GPUs."""
    lost = f'{selector}, ofu_loss_part!="useful"'
    lost_per_job = once_per_job("rate", JOB_COST_COUNTER, lost, "$__range", "k8s_namespace_name, ofu_loss_part, "
                                "ofu_cost_currency")
    # Joules per FLOP over a window: the ratio of the two counters' rates (their increases over the same window).
    # Only jobs with both energy and useful FLOPs: a job of unknown precision has energy but no FLOPs.
    energy = f"{once_per_job('rate', JOB_ENERGY_COUNTER, selector, LEDGER_STEP_WINDOW)} and on ({ONE_JOB}) " \
             f"{once_per_job('rate', JOB_FLOPS_COUNTER, selector, LEDGER_STEP_WINDOW)} > 0"
    flops = f"{once_per_job('rate', JOB_FLOPS_COUNTER, selector, LEDGER_STEP_WINDOW)} and on ({ONE_JOB}) " \
            f"{once_per_job('rate', JOB_ENERGY_COUNTER, selector, LEDGER_STEP_WINDOW)}"
    stalled_jobs = f"max by ({ONE_JOB}) (job_finding{{{selector}, {STALLED}}}) == 1"
    stalled_gpus = f"max by ({ONE_JOB}) (job_gpus{{{selector}}}) and on ({ONE_JOB}) ({stalled_jobs})"
    currency = "the currency is the jobs processor's cost.currency, in the legend (ofu_cost_currency)"
    return [
        timeseries("Money lost per hour, by part",
                   "What the selected jobs' GPU time lost per hour, by part of their loss account, stacked: the "
                   f"jobs processor's cost by part ({JOB_COST_COUNTER}: price per GPU-hour x the GPU-hours each part "
                   "lost, useful left out), its rate over the last 5 minutes at each point x 3600, each job read "
                   f"once (recording rule {COST_LOST}). Only GPUs with a price count; "
                   f"{currency}. A clock boost's gain is job_cost_gained_total, not netted out here "
                   "(docs/jobs.md#cost). " + PART_HELP, MONEY_PER_HOUR,
                   [target(f"sum by (ofu_loss_part, ofu_cost_currency) ({COST_LOST}{{{selector}}})",
                           "{{ofu_loss_part}} {{ofu_cost_currency}}")],
                   width=16, height=9, fill=70, stack=True, overrides=part_colors(then_more=True)),
        Panel("bargauge", "Top jobs by money lost per hour",
              "The 10 jobs that lost the most money per hour over the dashboard's range, the biggest first: the "
              f"increase of their cost over every part but useful ({JOB_COST_COUNTER}) per hour of the range. "
              f"{currency}. Open a job's view for where its loss went.", MONEY_PER_HOUR,
              [target(f"sort_desc(topk(10, sum by (cluster, k8s_namespace_name, ofu_job_id, ofu_cost_currency) "
                      f"({lost_per_job}) * 3600))", "{{ofu_job_id}} {{ofu_cost_currency}}", instant=True)],
              8, 9, thresholds=[{"color": "orange", "value": None}],
              options={"orientation": "horizontal", "displayMode": "basic", "showUnfilled": True,
                       "valueMode": "color", "namePlacement": "auto", "sizing": "auto", "minVizHeight": 16,
                       "maxVizHeight": 300, "minVizWidth": 8,
                       "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}},
              defaults={"decimals": 2, "min": 0}),
        timeseries("Energy per useful PFLOP",
                   "Joules the GPUs used per PFLOP of useful work (10^15 FLOPs at OFU), all the selected jobs "
                   "together (fleet) and per job: increase(job_energy_joules_total) / (increase(job_flops_total) "
                   "/ 1e15) over the last 5 minutes at each point (as the ratio of their rates), each job read "
                   "once. Lower is better: a job that holds its GPUs and does little burns power for nothing. Only "
                   "a job's windows whose energy (a counter or power x time) and precision are known count, and the "
                   "fleet line adds up only jobs with both; a point with no useful FLOP shows no value.",
                   JOULES_PER_PFLOP,
                   [target(f"sum({energy}) / (sum({flops}) / 1e15 > 0)", "fleet"),
                    target(f"sum by (ofu_job_id) ({energy}) / (sum by (ofu_job_id) ({flops}) / 1e15 > 0)",
                           "{{ofu_job_id}}")],
                   width=12, height=8,
                   overrides=[{"matcher": {"id": "byName", "options": "fleet"},
                               "properties": [{"id": "custom.lineWidth", "value": 3},
                                              {"id": "color", "value": {"mode": "fixed", "fixedColor": "text"}}]}]),
        timeseries("Stalled GPUs",
                   "GPUs of jobs whose stalled finding is open (job_finding{ofu_finding_kind=\"stalled\"} == 1: the "
                   "engine busy, tensor pipes, memory and links idle for stall.after, docs/jobs.md#stalled-jobs), "
                   "all together and by job: a hung job holds every one of its GPUs until its NCCL timeout or a "
                   "person ends it. 0 where the jobs processor reports jobs and none is stalled. Alert: "
                   "OfuJobStalled.", GPUS,
                   [target(or_zero_with_jobs(f"sum({stalled_gpus})", selector), "all jobs"),
                    target(f"sum by (ofu_job_id) ({stalled_gpus})", "{{ofu_job_id}}")],
                   width=8, height=8, thresholds=ZERO_IS_GOOD),
        stat("Stalled GPU hours", "GPU time the selected jobs' GPUs spent stalled over the dashboard's range: the "
             f"increase of {JOB_STALLED_COUNTER} (the stalled windows of each stalled finding), each job read once. "
             "0 where the jobs processor reports jobs and none stalled.", GPU_HOURS,
             or_zero_with_jobs(f"sum({once_per_job('increase', JOB_STALLED_COUNTER, selector, '$__range')})",
                               selector), steps=ZERO_IS_GOOD, width=4, height=8, decimals=2),
    ]


def fleet() -> dict[str, Any]:
    variables = [
        datasource_variable(),
        query_variable("cluster", "Cluster", "label_values(gpu_ofu, cluster)", CLUSTER_VARIABLE_HELP),
        query_variable("namespace", "Namespace", 'label_values(gpu_ofu{cluster=~"$cluster"}, k8s_namespace_name)',
                       "Kubernetes namespace of the GPUs' pods (k8s.namespace.name, set by attribution)."),
        query_variable("gpu_model", "GPU model",
                       'label_values(gpu_ofu{cluster=~"$cluster", k8s_namespace_name=~"$namespace"}, hw_model)',
                       "GPU model as the driver names it (hw.model)."),
        query_variable("precision", "Precision", 'label_values(gpu_ofu{cluster=~"$cluster", '
                       'k8s_namespace_name=~"$namespace", hw_model=~"$gpu_model"}, ofu_precision)',
                       "The number format the job runs in (ofu.precision): OFU is a fraction of the peak at it."),
    ]
    fleet_ofu_range = f"""
sum(sum_over_time({FLEET_SUM}{{{FLEET_SEL}}}[$__range]))
/ sum(sum_over_time({FLEET_COUNT}{{{FLEET_SEL}}}[$__range]))"""
    top_jobs = [
        target(f"topk(15, sum by (cluster, k8s_namespace_name, ofu_job_id) "
               f"(sum_over_time({JOB_WASTED}{{{JOBS_SEL}}}[$__range:1m])) / 60)", instant=True, fmt="table"),
        target(f"sum by (cluster, k8s_namespace_name, ofu_job_id) "
               f"(sum_over_time({JOB_GPUS}{{{JOBS_SEL}}}[$__range:1m])) / 60", instant=True, fmt="table"),
        target(f"avg by (cluster, k8s_namespace_name, ofu_job_id) "
               f"(avg_over_time({JOB_OFU_5M}{{{JOBS_SEL}}}[$__range]))", instant=True, fmt="table"),
    ]
    # On the Job column: the clicked job; the fleet's cluster and namespace choices carry over.
    job_link = {"title": "Open the job view", "url": "/d/otel-ofu-job/otel-ofu-job?${datasource:queryparam}"
                "&${cluster:queryparam}&${namespace:queryparam}&var-job=${__value.raw}&${__url_time_range}"}
    table = Panel(
        "table", "Top jobs by wasted GPU hours",
        "Jobs sorted by wasted GPU hours over the dashboard's range: GPU time x (1 - OFU), summed over the job's "
        "GPUs from the recording rule cluster_namespace_job:gpus_wasted:avg5m (one sample a minute). GPU hours "
        "and the GPU-time-weighted mean OFU beside it. Click a job to open its view.",
        GPU_HOURS, top_jobs, width=24, height=9,
        options={"showHeader": True, "cellHeight": "sm", "footer": {"show": False, "reducer": ["sum"], "fields": ""},
                 "sortBy": [{"displayName": "Wasted GPU hours", "desc": True}]},
        defaults={"decimals": 2, "custom": {"align": "auto", "cellOptions": {"type": "auto"}, "inspect": False}},
        overrides=[
            {"matcher": {"id": "byName", "options": "OFU"},
             "properties": [{"id": "unit", "value": PERCENT}, {"id": "decimals", "value": 1},
                            {"id": "custom.cellOptions", "value": {"type": "color-background", "mode": "basic"}},
                            {"id": "thresholds", "value": {"mode": "absolute", "steps": OFU_STEPS}}]},
            {"matcher": {"id": "byName", "options": "Job"},
             "properties": [{"id": "links", "value": [job_link]}]},
        ],
        extra={"transformations": [
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {
                "excludeByName": {"Time": True},
                "indexByName": {"ofu_job_id": 0, "k8s_namespace_name": 1, "cluster": 2, "Value #A": 3,
                                "Value #B": 4, "Value #C": 5},
                "renameByName": {"ofu_job_id": "Job", "k8s_namespace_name": "Namespace", "cluster": "Cluster",
                                 "Value #A": "Wasted GPU hours", "Value #B": "GPU hours", "Value #C": "OFU"}}},
            {"id": "filterByValue", "options": {"type": "include", "match": "all", "filters": [
                {"fieldName": "Wasted GPU hours", "config": {"id": "greater", "options": {"value": 0}}}]}},
        ]},
    )
    rows = [
        ("Over the selected range", [
            stat("Fleet OFU", "Overall FLOP Utilization of the selected GPUs over the dashboard's range, weighted by "
                 "GPU time: the sum of every per-GPU OFU sample divided by their number (recording rules "
                 f"{FLEET_SUM} / {FLEET_COUNT}). OFU = tensor pipe activity x SM clock / reference clock, tile-"
                 "corrected: a fraction of the dense peak at the precision in use. Red below 20 %, green from 35 %.",
                 PERCENT, fleet_ofu_range, steps=OFU_STEPS, width=5, decimals=1),
            stat("GPUs reporting OFU", "GPUs with an OFU point now (distinct GPUs, recording rule "
                 f"{FLEET_GPUS}).", GPUS, f"sum({FLEET_GPUS}{{{FLEET_SEL}}})", width=4, decimals=0),
            stat("GPUs without OFU", "Should be 0. GPUs whose windows the ofu processor dropped in the last 5 minutes "
                 "(blank or unsupported profiling counters, zero clock, ...) plus GPUs that reported OFU within the "
                 f"last hour and nothing now (stale). Recording rule {WITHOUT_OFU}; reasons in the panel below.",
                 GPUS, f"sum({WITHOUT_OFU}{{{FLEET_NO_PRECISION}}}) or vector(0)", steps=ZERO_IS_GOOD, width=5,
                 decimals=0),
            stat("GPU hours", "GPU time of the selected GPUs over the range: the per-minute count of GPUs reporting "
                 f"OFU ({FLEET_GPUS}) summed and divided by 60.", GPU_HOURS,
                 f"sum(sum_over_time({FLEET_GPUS}{{{FLEET_SEL}}}[$__range:1m])) / 60", width=5, decimals=1),
            stat("Wasted GPU hours", "GPU time x (1 - OFU) over the range: the compute the GPUs held but did not use "
                 f"({FLEET_WASTED}, per minute, summed and divided by 60).", GPU_HOURS,
                 f"sum(sum_over_time({FLEET_WASTED}{{{FLEET_SEL}}}[$__range:1m])) / 60",
                 steps=[{"color": "orange", "value": None}], width=5, decimals=1),
        ]),
        ("Over time", [
            timeseries("Fleet OFU by GPU model and precision",
                       "GPU-time-weighted OFU over the last 5 minutes at each point, for the whole selection (fleet) "
                       "and per GPU model and precision: sum of per-GPU OFU samples / their number, from the "
                       "recording rules. A fraction of the dense peak at each precision.", PERCENT,
                       [target(f"sum({FLEET_SUM}{{{FLEET_SEL}}}) / sum({FLEET_COUNT}{{{FLEET_SEL}}})", "fleet"),
                        target(f"sum by (hw_model, ofu_precision) ({FLEET_SUM}{{{FLEET_SEL}}}) / sum by (hw_model, "
                               f"ofu_precision) ({FLEET_COUNT}{{{FLEET_SEL}}})", "{{hw_model}} {{ofu_precision}}")],
                       width=12, thresholds=OFU_STEPS,
                       overrides=[{"matcher": {"id": "byName", "options": "fleet"},
                                   "properties": [{"id": "custom.lineWidth", "value": 3},
                                                  {"id": "color", "value": {"mode": "fixed", "fixedColor": "text"}}]}]),
            Panel("heatmap", "Distribution of GPU OFU",
                  "How many GPUs ran at each OFU level (each GPU's 5-minute mean, in bands of 10 % of peak) over "
                  f"time, from the recording rule {FLEET_BUCKETS}. A band near 0 with many GPUs is idle or stalled "
                  "capacity.", GPUS,
                  [target(f"sum by (le) ({FLEET_BUCKETS}{{{FLEET_SEL}}})", "{{le}}", fmt="heatmap")], 12, 8,
                  options={"calculate": False, "yAxis": {"axisPlacement": "left", "unit": PERCENT, "reverse": False},
                           "rowsFrame": {"layout": "le"}, "color": {"mode": "scheme", "scheme": "Oranges",
                                                                   "fill": "dark-orange", "scale": "exponential",
                                                                   "exponent": 0.5, "steps": 64, "reverse": False},
                           "cellGap": 1, "filterValues": {"le": 1e-9}, "legend": {"show": True},
                           "tooltip": {"mode": "single", "yHistogram": False, "showColorScale": True},
                           "exemplars": {"color": "rgba(255,0,255,0.7)"}, "showValue": "never",
                           "cellValues": {"unit": GPUS, "decimals": 0}},
                  custom={"hideFrom": {"legend": False, "tooltip": False, "viz": False},
                          "scaleDistribution": {"type": "linear"}}),
            timeseries("GPU hours and wasted GPU hours per day",
                       "GPU hours (GPUs reporting OFU x time) and wasted GPU hours (GPU time x (1 - OFU)) in the "
                       "24 hours up to each point; at the right edge: the last day. From the recording rules "
                       f"{FLEET_GPUS} and {FLEET_WASTED}, one sample a minute.", GPU_HOURS,
                       [target(f"sum(sum_over_time({FLEET_GPUS}{{{FLEET_SEL}}}[1d:1m])) / 60", "GPU hours"),
                        target(f"sum(sum_over_time({FLEET_WASTED}{{{FLEET_SEL}}}[1d:1m])) / 60", "wasted GPU hours")],
                       width=12, fill=20),
            timeseries("GPUs without OFU, by reason",
                       "Should stay at 0. GPUs that gave no OFU, by why: blank (a profiler such as Nsight holds "
                       "DCGM's profiling lock, or profiling is paused), not_supported, zero_clock, ... from the ofu "
                       "processor's gpu_ofu_dropped_total, and stale (OFU within the last hour, nothing now).",
                       GPUS, [target(f"sum by (ofu_drop_reason) ({WITHOUT_OFU}{{{FLEET_NO_PRECISION}}})",
                                     "{{ofu_drop_reason}}")],
                       width=12, bars=True, fill=60, stack=True),
        ]),
        ("Where the GPU time went", [
            timeseries("GPUs by part of the loss account",
                       "Where the selected GPUs' time goes, in GPUs, stacked: for the jobs' GPUs each part of the "
                       "loss account (the dense peak split into parts that add up with OFU to 1, "
                       "docs/method.md#where-the-flops-go-the-loss-account) and their OFU (useful); GPUs with no "
                       f"job whole as unallocated. Recording rule {FLEET_PARTS} (5-minute means). A clock boost "
                       "above the reference clock shows below 0 as clock boost (gained). " + PART_HELP,
                       GPUS, lost_and_gained(f"sum by (ofu_loss_part) ({FLEET_PARTS}{{{FLEET_NO_PRECISION}}})"),
                       width=16, height=9, fill=70, stack=True, minimum=None, overrides=part_colors()),
            Panel("bargauge", "GPU hours by part over the range",
                  "The selected GPUs' GPU hours over the dashboard's range by where they went, the biggest first: "
                  f"each part of the jobs' loss account, useful (OFU) and unallocated (no job); {FLEET_PARTS} per "
                  "minute, summed and divided by 60. What to fix first is the biggest part that is not useful. "
                  "clock boost (gained): GPU hours the SM clock gained above the reference clock.",
                  GPU_HOURS, lost_and_gained(f"sum by (ofu_loss_part) (sum_over_time({FLEET_PARTS}"
                                             f"{{{FLEET_NO_PRECISION}}}[$__range:1m])) / 60", gain_sign="-",
                                             sort=True, instant=True),
                  8, 9, thresholds=[{"color": "orange", "value": None}],
                  options={"orientation": "horizontal", "displayMode": "basic", "showUnfilled": True,
                           "valueMode": "color", "namePlacement": "auto", "sizing": "auto", "minVizHeight": 16,
                           "maxVizHeight": 300, "minVizWidth": 8,
                           "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}},
                  defaults={"decimals": 1, "min": 0}, overrides=part_colors()),
        ]),
        ("Ledger", ledger(JOBS_SEL)),
        ("Jobs", [table]),
    ]
    return dashboard("otel-ofu-fleet", "otel-ofu / Fleet",
                     "GPU fleet efficiency from otel-ofu: OFU over time by GPU model and precision, its distribution, "
                     "GPU hours and waste, GPUs without OFU, money lost, energy per useful PFLOP, stalled GPUs, and "
                     "the jobs that waste the most.", variables, rows)


# --- Job ------------------------------------------------------------------------------------------

JOB_SEL = 'cluster=~"$cluster", k8s_namespace_name=~"$namespace", ofu_job_id="$job", host_name=~"$host"'
JOB_ONLY = 'cluster=~"$cluster", ofu_job_id="$job"'
JOB_NS = 'cluster=~"$cluster", k8s_namespace_name=~"$namespace", ofu_job_id="$job"'


def job() -> dict[str, Any]:
    variables = [
        datasource_variable(),
        query_variable("cluster", "Cluster", "label_values(gpu_ofu, cluster)", CLUSTER_VARIABLE_HELP),
        query_variable("namespace", "Namespace", 'label_values(gpu_ofu{cluster=~"$cluster"}, k8s_namespace_name)',
                       "Kubernetes namespace of the job's pods (k8s.namespace.name)."),
        query_variable("job", "Job", f'label_values(gpu_ofu{{cluster=~"$cluster", k8s_namespace_name=~"$namespace", '
                       f'ofu_job_id!~{NO_JOB}}}, ofu_job_id)', "The job (ofu.job.id, named by attribution).",
                       multi=False, include_all=False),
        query_variable("host", "Host", 'label_values(gpu_ofu{cluster=~"$cluster", ofu_job_id="$job"}, host_name)',
                       "Narrow the job's GPUs to some of its hosts."),
    ]
    job_ofu = f"""
sum(sum_over_time(gpu_ofu{{{JOB_SEL}}}[$__range]))
/ sum(count_over_time(gpu_ofu{{{JOB_SEL}}}[$__range]))"""
    finding_table = Panel(
        "table", "Open findings",
        "Findings otel-ofu's jobs processor has open for the job now (job_finding == 1): mfu_gap (the job's reported "
        "MFU disagrees with OFU; cause flop_formula_overcount or uncounted_padding_or_recompute) and regression "
        "(sustained_ofu_drop below its own baseline). The same findings are the annotations on the timelines.",
        COUNT, [target(f"max by (ofu_finding_kind, ofu_finding_cause) (job_finding{{{JOB_ONLY}}} == 1)",
                       instant=True, fmt="table")], width=8, height=6,
        options={"showHeader": True, "cellHeight": "sm", "footer": {"show": False, "reducer": ["sum"], "fields": ""}},
        defaults={"noValue": "no open findings", "custom": {"align": "auto", "cellOptions": {"type": "auto"},
                                                            "inspect": False}},
        extra={"transformations": [{"id": "organize", "options": {
            "excludeByName": {"Time": True, "Value": True},
            "renameByName": {"ofu_finding_kind": "Finding", "ofu_finding_cause": "Likely cause"}}}]},
    )
    rows = [
        ("Over the selected range", [
            stat("OFU", "The job's OFU over the range, weighted by GPU time: the sum of its GPUs' OFU samples divided "
                 "by their number. A fraction of the dense peak at the job's precision.", PERCENT, job_ofu,
                 steps=OFU_STEPS, width=4, decimals=1),
            stat("Reported MFU", "The MFU the job reports about itself (training_mfu, sent by its framework), "
                 "averaged over the range. Far above OFU: its FLOP formula counts work that did not run.", PERCENT,
                 f"avg(avg_over_time(training_mfu{{{JOB_ONLY}}}[$__range]))", width=4, decimals=1,
                 no_value="not reported"),
            stat("GPUs", "The job's GPUs that report OFU now (distinct GPU UUIDs among its gpu_ofu series).", GPUS,
                 f"count(group by (hw_id) (gpu_ofu{{{JOB_SEL}}}))", width=3, decimals=0),
            stat("GPU hours", "The job's GPU time over the range (recording rule "
                 f"{JOB_GPUS}, per minute, summed and divided by 60).", GPU_HOURS,
                 f"sum(sum_over_time({JOB_GPUS}{{{JOB_NS}}}[$__range:1m])) / 60", width=3, decimals=2),
            stat("Wasted GPU hours", "GPU time x (1 - OFU) over the range: compute the job held and did not use "
                 f"({JOB_WASTED}).", GPU_HOURS,
                 f"sum(sum_over_time({JOB_WASTED}{{{JOB_NS}}}[$__range:1m])) / 60",
                 steps=[{"color": "orange", "value": None}], width=3, decimals=2),
            stat("Achieved FLOP/s", "The job's useful tensor FLOP/s, all its GPUs together, averaged over the range: "
                 "OFU x the dense peak at its precision. Only where the precision is known (gpu_flops_achieved).",
                 FLOPS, f"sum(avg_over_time(gpu_flops_achieved_per_second{{{JOB_SEL}}}[$__range]))", width=3,
                 no_value="precision unknown"),
        ]),
        ("Over time", [
            timeseries("OFU, reported MFU and the regression baseline",
                       "The job's OFU (GPU-time-weighted over its GPUs, at each step), the MFU it reports about "
                       "itself, and otel-ofu's regression baseline (the median of its recent per-minute OFU, frozen "
                       "while a regression is open). Annotations: findings (MFU gap, regression) while open.",
                       PERCENT,
                       [target(f"sum(sum_over_time(gpu_ofu{{{JOB_SEL}}}[$__rate_interval])) / "
                               f"sum(count_over_time(gpu_ofu{{{JOB_SEL}}}[$__rate_interval]))", "OFU (measured)"),
                        target(f"avg(training_mfu{{{JOB_ONLY}}})", "reported MFU"),
                        target(f"max(job_ofu_baseline{{{JOB_ONLY}}})", "regression baseline")],
                       width=16, thresholds=OFU_STEPS,
                       overrides=[{"matcher": {"id": "byName", "options": "regression baseline"},
                                   "properties": [{"id": "custom.lineStyle", "value": DASHED},
                                                  {"id": "custom.fillOpacity", "value": 0}]}]),
            finding_table,
            Panel("heatmap", "OFU per GPU",
                  "Each row is one of the job's GPUs (host / GPU index), coloured by its OFU. In a synchronous job "
                  "all rows look alike; a row that stays lighter is a straggler or a GPU that lost OFU.", PERCENT,
                  [target(f"avg by (host_name, gpu_index) (gpu_ofu{{{JOB_SEL}}})", "{{host_name}}/{{gpu_index}}")],
                  16, 9,
                  options={"calculate": False, "yAxis": {"axisPlacement": "left", "reverse": False},
                           "rowsFrame": {"layout": "auto"}, "color": {"mode": "scheme", "scheme": "RdYlGn",
                                                                     "fill": "dark-orange", "scale": "linear",
                                                                     "steps": 64, "reverse": False, "min": 0,
                                                                     "max": 0.7},
                           "cellGap": 1, "legend": {"show": True},
                           "tooltip": {"mode": "single", "yHistogram": False, "showColorScale": True},
                           "exemplars": {"color": "rgba(255,0,255,0.7)"}, "showValue": "never",
                           "cellValues": {"unit": PERCENT, "decimals": 1}},
                  custom={"hideFrom": {"legend": False, "tooltip": False, "viz": False},
                          "scaleDistribution": {"type": "linear"}}),
            timeseries("Achieved FLOP/s",
                       "The job's achieved tensor FLOP/s by precision (OFU x dense peak at the precision), all its "
                       "GPUs together. Empty where the precision is unknown: OFU alone cannot say how many FLOPs.",
                       FLOPS, [target(f"sum by (ofu_precision) (gpu_flops_achieved_per_second{{{JOB_SEL}}})",
                                      "{{ofu_precision}}")], width=8, height=9, stack=True),
            timeseries("Where the job's GPU time went (loss account, stacked)",
                       "The job's GPU time by part of its loss account over the last 5 minutes at each point, "
                       "stacked with its OFU (useful) so the stack is 100 %: the dense peak split into parts, each "
                       "GPU-time weighted over its GPUs (recording rules "
                       f"{JOB_PARTS} and {JOB_OFU_5M}; docs/method.md#where-the-flops-go-the-loss-account). The "
                       "part that grows when OFU falls says where to look. A clock boost above the reference clock "
                       "shows below 0 as clock boost (gained), the stack above 0 then 100 % plus that gain. "
                       + PART_HELP, PERCENT,
                       [*lost_and_gained(f"sum by (ofu_loss_part) ({JOB_PARTS}{{{JOB_NS}}})"),
                        target(f"max({JOB_OFU_5M}{{{JOB_NS}}})", "useful (OFU)")],
                       width=16, height=9, fill=70, stack=True, minimum=None, overrides=part_colors()),
            Panel("table", "Largest losses since the job started",
                  "Each part of the job's loss account in GPU hours since it started, the biggest first, from "
                  f"otel-ofu's jobs processor ({JOB_LOST_COUNTER}: they add up to its wasted GPU hours; what a clock "
                  f"boost above the reference clock gained counts apart, {JOB_GAINED_COUNTER}: GPU time = useful + "
                  "lost - gained). unknown: GPU time whose OFU came without its loss points. "
                  + PART_HELP, GPU_HOURS,
                  lost_and_gained_counters(JOB_ONLY, sort=True, instant=True, fmt="table"), width=8, height=9,
                  options={"showHeader": True, "cellHeight": "sm",
                           "footer": {"show": True, "reducer": ["sum"], "fields": ""},
                           "sortBy": [{"displayName": "GPU hours lost", "desc": True}]},
                  defaults={"decimals": 2, "noValue": "no loss account (the jobs processor sends it)",
                            "custom": {"align": "auto", "cellOptions": {"type": "auto"}, "inspect": False}},
                  extra={"transformations": [
                      {"id": "merge", "options": {}},
                      {"id": "organize", "options": {
                          "excludeByName": {"Time": True},
                          "indexByName": {"ofu_loss_part": 0, "Value #A": 1, "Value #B": 2},
                          "renameByName": {"ofu_loss_part": "Part", "Value #A": "GPU hours lost",
                                           "Value #B": "GPU hours gained"}}}]}),
            timeseries("GPU hours and waste since the job started",
                       "otel-ofu's jobs processor's running totals for the job: GPU hours it has held, wasted GPU "
                       "hours (what its loss parts lost) and GPU hours a clock boost above the reference clock gained "
                       "since it started (job_gpu_seconds_total, job_wasted_gpu_hours_total, "
                       f"{JOB_GAINED_COUNTER}; GPU time = useful + wasted - gained, "
                       "docs/method.md#wasted-gpu-hours-and-the-clock-gain). Counters: none of them ever falls.",
                       GPU_HOURS,
                       [target(f"max(job_gpu_seconds_total{{{JOB_ONLY}}}) / 3600", "GPU hours"),
                        target(f"max(job_wasted_gpu_hours_total{{{JOB_ONLY}}})", "wasted GPU hours"),
                        target(f"sum(max by (ofu_loss_part) ({JOB_GAINED_COUNTER}{{{JOB_ONLY}}}))",
                               "GPU hours gained (clock boost)")], width=24, height=7),
        ]),
    ]
    annotations = [{
        "name": "Findings", "datasource": DS, "enable": True, "hide": False, "iconColor": "red",
        "expr": f"max by (ofu_finding_kind, ofu_finding_cause) (job_finding{{{JOB_ONLY}}}) == 1",
        "step": "1m", "titleFormat": "{{ofu_finding_kind}}", "textFormat": "likely cause: {{ofu_finding_cause}}",
        "tagKeys": "ofu_finding_kind", "useValueForTime": False,
    }]
    return dashboard("otel-ofu-job", "otel-ofu / Job",
                     "One job through otel-ofu: OFU beside the MFU it reports, the regression baseline, findings, its "
                     "GPUs as a heatmap, achieved FLOP/s, GPU hours and waste.", variables, rows,
                     annotations=annotations)


# --- GPU ------------------------------------------------------------------------------------------

GPU_SEL = 'cluster=~"$cluster", host_name=~"$host", hw_id=~"$gpu"'
GPU_LEGEND = "{{host_name}} GPU {{gpu_index}}"


def _reason_bit(bit: int, name: str) -> dict[str, Any]:
    return target(f"max by (host_name, gpu_index) (floor(gpu_clock_event_reasons{{{GPU_SEL}}} / {bit}) % 2)",
                  f"{GPU_LEGEND}: {name}")


def gpu() -> dict[str, Any]:
    variables = [
        datasource_variable(),
        query_variable("cluster", "Cluster", "label_values(gpu_ofu, cluster)", CLUSTER_VARIABLE_HELP),
        query_variable("host", "Host", 'label_values(gpu_ofu{cluster=~"$cluster"}, host_name)',
                       "The node (host.name)."),
        query_variable("gpu", "GPU", 'label_values(gpu_ofu{cluster=~"$cluster", host_name=~"$host"}, hw_id)',
                       "The GPU's UUID (hw.id)."),
    ]
    rows = [
        ("Inputs", [
            timeseries("Tensor pipe activity (TPA)",
                       "Fraction of cycles any tensor pipe was busy, averaged over each counter window (DCGM 1004 / "
                       "NVML GPM): the main input of OFU.", PERCENT,
                       [target(f"max by (host_name, gpu_index) (gpu_tensor_activity{{{GPU_SEL}}})", GPU_LEGEND)]),
            timeseries("SM clock against the reference clock",
                       "The SM clock (mean of the samples in each window), the reference clock f_ref the GPU's "
                       "tensor peak is quoted at, and the maximum SM clock. OFU scales with SM clock / f_ref: a "
                       "clock held below f_ref (power or thermal cap) lowers OFU and the job's speed.", HERTZ,
                       [target(f"max by (host_name, gpu_index) (gpu_sm_clock_frequency_hertz{{{GPU_SEL}}})",
                               f"{GPU_LEGEND} SM clock"),
                        target(f"max by (host_name, gpu_index) (gpu_ofu_reference_clock_hertz{{{GPU_SEL}}})",
                               f"{GPU_LEGEND} reference clock"),
                        target(f"max by (host_name, gpu_index) (gpu_sm_clock_max_hertz{{{GPU_SEL}}})",
                               f"{GPU_LEGEND} max clock")], minimum=None,
                       overrides=[{"matcher": {"id": "byRegexp", "options": ".*(reference|max) clock"},
                                   "properties": [{"id": "custom.lineStyle",
                                                   "value": {"fill": "dash", "dash": [10, 10]}},
                                                  {"id": "custom.fillOpacity", "value": 0}]}]),
        ]),
        ("OFU", [
            timeseries("OFU: raw and tile-corrected",
                       "Raw OFU = TPA x SM clock / f_ref; OFU applies the tile-quantization correction (padded tiles "
                       "run tensor work the job's FLOP count does not include). A fraction of the dense peak at "
                       "the job's precision.", PERCENT,
                       [target(f"max by (host_name, gpu_index) (gpu_ofu_raw{{{GPU_SEL}}})", f"{GPU_LEGEND} raw"),
                        target(f"max by (host_name, gpu_index) (gpu_ofu{{{GPU_SEL}}})", f"{GPU_LEGEND} corrected")],
                       thresholds=OFU_STEPS),
            timeseries("Power", "Board power draw, averaged over each window (DCGM 155), where the source reports it.",
                       WATTS, [target(f"max by (host_name, gpu_index) (gpu_power_usage_watts{{{GPU_SEL}}})",
                                      GPU_LEGEND)]),
        ]),
        ("Why and for whom", [
            Panel("state-timeline", "Clock event reasons",
                  "Why the SM clock was held down, from the clock event (throttle) reason bitmask (DCGM 112) where "
                  "the source reports it: 1 = the reason was active during the window. SW power cap (0x4), HW "
                  "slowdown (0x8), SW / HW thermal (0x20 / 0x40), HW power brake (0x80); idle (0x1) is benign.",
                  COUNT, [_reason_bit(1, "idle"), _reason_bit(4, "SW power cap"), _reason_bit(8, "HW slowdown"),
                          _reason_bit(32, "SW thermal"), _reason_bit(64, "HW thermal"),
                          _reason_bit(128, "HW power brake")], 12, 9,
                  thresholds=[{"color": "transparent", "value": None}, {"color": "orange", "value": 1}],
                  options={"showValue": "never", "mergeValues": True, "rowHeight": 0.8, "alignValue": "left",
                           "legend": {"displayMode": "list", "placement": "bottom", "showLegend": False},
                           "tooltip": {"mode": "single", "sort": "none"}},
                  defaults={"color": {"mode": "thresholds"},
                            "mappings": [{"type": "value", "options": {"0": {"text": "no"}, "1": {"text": "yes"}}}]},
                  custom={"lineWidth": 0, "fillOpacity": 80, "hideFrom": {"legend": False, "tooltip": False,
                                                                          "viz": False}}),
            Panel("state-timeline", "Which job held the GPU",
                  "One row per GPU and job (ofu.job.id, from attribution): coloured while that job held the GPU. "
                  '"none": no job; "unknown": attribution could not tell.', COUNT,
                  [target(f"max by (host_name, gpu_index, ofu_job_id) (group by (host_name, gpu_index, ofu_job_id, "
                          f"hw_id) (gpu_sm_clock_frequency_hertz{{{GPU_SEL}}}))",
                          "{{host_name}} GPU {{gpu_index}}: {{ofu_job_id}}")], 12, 9,
                  thresholds=[{"color": "green", "value": None}],
                  options={"showValue": "never", "mergeValues": True, "rowHeight": 0.8, "alignValue": "left",
                           "legend": {"displayMode": "list", "placement": "bottom", "showLegend": False},
                           "tooltip": {"mode": "single", "sort": "none"}},
                  defaults={"color": {"mode": "palette-classic"},
                            "mappings": [{"type": "value", "options": {"1": {"text": "held"}}}]},
                  custom={"lineWidth": 0, "fillOpacity": 80, "hideFrom": {"legend": False, "tooltip": False,
                                                                          "viz": False}}),
        ]),
    ]
    return dashboard("otel-ofu-gpu", "otel-ofu / GPU",
                     "One GPU through otel-ofu: the inputs (TPA, SM clock against the reference clock), raw and "
                     "corrected OFU, power and clock event reasons, and which job held it when.", variables, rows)


# --- otel-ofu itself ------------------------------------------------------------------------------

SELF_SEL = 'cluster=~"$cluster", service_instance_id=~"$instance"'


def self_telemetry() -> dict[str, Any]:
    variables = [
        datasource_variable(),
        query_variable("cluster", "Cluster", "label_values(otel_ofu_receiver_accepted_total, cluster)",
                       CLUSTER_VARIABLE_HELP),
        query_variable("instance", "Instance", 'label_values(otel_ofu_receiver_accepted_total{cluster=~"$cluster"}, '
                       "service_instance_id)", "An otel-ofu process (service.instance.id: host:pid)."),
    ]

    def rate(metric: str, by: str, legend: str) -> dict[str, Any]:
        return target(f"sum by (service_instance_id, {by}) (rate({metric}{{{SELF_SEL}}}[$__rate_interval]))", legend)

    rows = [
        ("Sources", [
            Panel("state-timeline", "Sources: each receiver's state, and scrape endpoints down",
                  "What each receiver is doing (otel_ofu_receiver_status): ok, or why not: scrape_failed (an "
                  "endpoint does not answer), empty (it answers with none of the metrics read), starting (never "
                  "read anything: a source never seen), the GPU receivers' states (hostengine_unreachable, "
                  "profiling_in_use, ...). Below them, each scraped endpoint while it is down "
                  "(otel_ofu_scrape_up = 0). Alert: OtelOfuSourceDown.", COUNT,
                  [target(f'max by (service_instance_id, receiver, state) (otel_ofu_receiver_status{{{SELF_SEL}, '
                          f'gpu=""}}) == 1', "{{service_instance_id}} {{receiver}}: {{state}}"),
                   target(f"min by (service_instance_id, endpoint) (otel_ofu_scrape_up{{{SELF_SEL}}}) == 0",
                          "{{service_instance_id}} {{endpoint}}: down")], 24, 8,
                  thresholds=[{"color": "red", "value": None}],
                  overrides=[{"matcher": {"id": "byRegexp", "options": ".*: (ok|finished)$"},
                              "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": "green"}}]}],
                  options={"showValue": "never", "mergeValues": True, "rowHeight": 0.8, "alignValue": "left",
                           "legend": {"displayMode": "list", "placement": "bottom", "showLegend": False},
                           "tooltip": {"mode": "single", "sort": "none"}},
                  defaults={"color": {"mode": "thresholds"},
                            "mappings": [{"type": "value", "options": {"1": {"text": "in this state"},
                                                                       "0": {"text": "down"}}}]},
                  custom={"lineWidth": 0, "fillOpacity": 80, "hideFrom": {"legend": False, "tooltip": False,
                                                                          "viz": False}}),
        ]),
        ("In", [
            stat("Instances", "otel-ofu processes sending self-telemetry now (the selftelemetry receiver in a "
                 "pipeline to this data source).", COUNT,
                 f"count(group by (service_instance_id) (otel_ofu_receiver_accepted_total{{{SELF_SEL}}}))",
                 width=4, height=8, decimals=0),
            timeseries("Items in, per receiver",
                       "What each receiver handed to its pipelines per second: GPU windows, metric points, events "
                       "(otel_ofu_receiver_accepted_total).", PER_SECOND,
                       [rate("otel_ofu_receiver_accepted_total", "receiver", "{{service_instance_id}} {{receiver}}")],
                       width=10),
            timeseries("GPU windows without OFU, by reason",
                       "Windows the ofu processor could not turn into OFU, per second, by reason: blank (profiling "
                       "paused or a profiler holds DCGM's lock), not_supported, nan, out_of_range, zero_clock, ... "
                       "Never reported as 0 OFU (otel_ofu_ofu_dropped_total).", PER_SECOND,
                       [rate("otel_ofu_ofu_dropped_total", "reason", "{{service_instance_id}} {{reason}}")],
                       width=10, bars=True, fill=60),
        ]),
        ("Out", [
            timeseries("Exporter queue", "Export requests waiting or in flight in each exporter's sending queue, and "
                       "its capacity (sending_queue.queue_size). A queue near capacity is about to drop data.",
                       "suffix: batches",
                       [target(f"max by (service_instance_id, exporter) (otel_ofu_exporter_queue_size{{{SELF_SEL}}})",
                               "{{service_instance_id}} {{exporter}} queued"),
                        target(f"max by (service_instance_id, exporter) "
                               f"(otel_ofu_exporter_queue_capacity{{{SELF_SEL}}})",
                               "{{service_instance_id}} {{exporter}} capacity")], width=12,
                       overrides=[{"matcher": {"id": "byRegexp", "options": ".*capacity"},
                                   "properties": [{"id": "custom.lineStyle",
                                                   "value": {"fill": "dash", "dash": [10, 10]}},
                                                  {"id": "custom.fillOpacity", "value": 0}]}]),
            timeseries("Sent", "Data points (and log records) the backend accepted, per second, by exporter and "
                       "signal (otel_ofu_exporter_sent_total).", PER_SECOND,
                       [rate("otel_ofu_exporter_sent_total", "exporter, signal",
                             "{{service_instance_id}} {{exporter}} {{signal}}")], width=12),
            timeseries("Retried", "Send attempts that failed retryably and were retried, per second, by reason "
                       "(UNAVAILABLE, http_503, ...; otel_ofu_exporter_retried_total).", PER_SECOND,
                       [rate("otel_ofu_exporter_retried_total", "exporter, reason",
                             "{{service_instance_id}} {{exporter}} {{reason}}")], width=12, bars=True, fill=60),
            timeseries("Dropped", "Data given up on, per second: by exporters (queue_full, retries_exhausted, "
                       "permanent_error, ...; otel_ofu_exporter_dropped_total) and by pipelines whose processor or "
                       "exporter failed (otel_ofu_pipeline_dropped_total). Should be 0: these points are lost.",
                       PER_SECOND,
                       [rate("otel_ofu_exporter_dropped_total", "exporter, reason",
                             "{{service_instance_id}} {{exporter}} {{reason}}"),
                        rate("otel_ofu_pipeline_dropped_total", "pipeline, reason",
                             "{{service_instance_id}} {{pipeline}} {{reason}}")],
                       width=12, bars=True, fill=60, thresholds=ZERO_IS_GOOD),
        ]),
    ]
    return dashboard("otel-ofu-self", "otel-ofu / Self-telemetry",
                     "otel-ofu's own health per instance: each source's state, items in, windows dropped and why, "
                     "exporter queue, sent, retried and dropped.", variables, rows, time_from="now-1h")


DASHBOARDS = {"otel-ofu-fleet.json": fleet, "otel-ofu-job.json": job, "otel-ofu-gpu.json": gpu,
              "otel-ofu-self.json": self_telemetry}


def render(name: str) -> str:
    return json.dumps(DASHBOARDS[name](), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    return write_or_check("Write (or --check) otel-ofu's Grafana dashboards.", "tools.dashboards",
                          [(OUT_DIR / name, functools.partial(render, name)) for name in DASHBOARDS], argv)


if __name__ == "__main__":
    sys.exit(main())
