"""Preview images of the Grafana dashboards, drawn with matplotlib from the same queries.

Grafana does not run here, so this runs the demo into a real Prometheus
(tools/demo_prometheus.py), evaluates every panel's queries as Grafana would
(tools/grafana_queries.py) and draws each dashboard on Grafana's grid: panel titles, units
and thresholds as in the JSON. Each image is marked as a preview.

    python -m tools.render_dashboards            # writes docs/img/dashboard-*.png
    python -m tools.render_dashboards --out DIR

Needs prometheus and promtool (collector/install-prometheus.sh).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tools import grafana_queries as gq
from tools.demo_prometheus import DemoData, demo_in_prometheus, prometheus_binary, promtool_binary

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD_DIR = ROOT / "deploy" / "grafana"
OUT_DIR = ROOT / "docs" / "img"
UNIT_W_IN = 0.62  # inches per grid column (Grafana: 24 columns)
UNIT_H_IN = 0.36  # inches per grid row (Grafana: 30 px)
COLORS = ["#7EB26D", "#EAB839", "#6ED0E0", "#EF843C", "#E24D42", "#1F78C1", "#BA43A9", "#705DA0", "#508642",
          "#CCA300", "#447EBC", "#C15C17", "#890F02", "#0A437C", "#6D1F62", "#584477"]
THRESHOLD_COLORS = {"green": "#56A64B", "orange": "#FF9830", "red": "#E02F44", "blue": "#3274D9",
                    "transparent": "#00000000", "text": "#222222"}
BACKGROUND, PANEL_BG, TEXT = "#F4F5F5", "#FFFFFF", "#24292E"

log = logging.getLogger("tools.render_dashboards")

# What each preview shows: variable values (where the data has them) and which wall-clock span.
CHOICES: dict[str, dict[str, str]] = {
    "otel-ofu-fleet": {},
    "otel-ofu-job": {"job": "sft-debug-flag"},
    "otel-ofu-gpu": {"job": "capped-finetune"},  # the GPU variable picks one of this job's GPUs
    "otel-ofu-self": {},
}


# --- numbers and units ------------------------------------------------------------------------------

def format_value(value: float | None, unit: str, decimals: int | None = None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if unit == "percentunit":
        return f"{value * 100:.{1 if decimals is None else decimals}f}%"
    if unit.startswith("suffix:"):
        suffix = unit.split(":", 1)[1]
        digits = decimals if decimals is not None else (0 if abs(value) >= 100 else 1 if abs(value) >= 10 else 2)
        return f"{value:,.{digits}f}{suffix}"
    for name, base in (("flops", "FLOP/s"), ("hertz", "Hz"), ("watt", "W")):
        if unit == name:
            for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
                if abs(value) >= factor:
                    scaled = value / factor
                    return f"{scaled:.{decimals}f} {prefix}{base}" if decimals is not None else \
                        f"{scaled:.3g} {prefix}{base}"
            return f"{value:.0f} {base}"
    return f"{value:.{0 if decimals is None else decimals}f}" if float(value).is_integer() or decimals is not None \
        else f"{value:.3g}"


def threshold_color(value: float | None, steps: list[dict[str, Any]]) -> str:
    color = steps[0]["color"]
    for step in steps[1:]:
        if value is not None and value >= step["value"]:
            color = step["color"]
    return THRESHOLD_COLORS.get(color, color)


# --- drawing ------------------------------------------------------------------------------------------

def _series_points(series: dict[str, Any]) -> tuple[list[datetime], list[float]]:
    times = [datetime.fromtimestamp(float(t), UTC) for t, _ in series["values"]]
    return times, [float(v) for _, v in series["values"]]


def _axis_format(ax: Any, unit: str) -> None:
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    if unit.startswith("suffix:") and "GPUs" in unit:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=5))

    def tick(value: float, _: Any) -> str:
        if unit in ("flops", "hertz", "watt"):
            return format_value(value, unit)
        decimals = 0 if unit in ("percentunit",) or float(value).is_integer() else 1
        return format_value(value, unit, decimals)

    ax.yaxis.set_major_formatter(FuncFormatter(tick))


def _time_axis(ax: Any, span_s: float) -> None:
    import matplotlib.dates as mdates

    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S" if span_s < 600 else "%H:%M"))
    ax.tick_params(axis="both", labelsize=7, colors="#555555")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.grid(True, color="#E6E6E6", linewidth=0.6)


def draw_stat(ax: Any, panel: dict[str, Any], results: list[gq.QueryResult]) -> None:
    defaults = panel["fieldConfig"]["defaults"]
    series = results[0].series
    value = float(series[0]["value"][1]) if series else None
    text = format_value(value, defaults["unit"], defaults.get("decimals")) if series else defaults.get("noValue", "-")
    ax.set_facecolor(threshold_color(value, defaults["thresholds"]["steps"]))
    width_pt = ax.get_position().width * ax.figure.get_figwidth() * 72
    size = min(20.0, 0.9 * width_pt / (0.62 * max(len(text), 1)))
    ax.text(0.5, 0.42, text, ha="center", va="center", fontsize=size, color="white", weight="bold",
            transform=ax.transAxes)
    ax.text(0.98, 0.04, f"unit: {defaults['unit']}", ha="right", va="bottom", fontsize=6, color="white",
            transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def draw_timeseries(ax: Any, panel: dict[str, Any], results: list[gq.QueryResult], window: gq.TimeRange,
                    findings: list[dict[str, Any]]) -> None:
    custom = panel["fieldConfig"]["defaults"].get("custom", {})
    unit = panel["fieldConfig"]["defaults"]["unit"]
    bars = custom.get("drawStyle") == "bars"
    stacked = custom.get("stacking", {}).get("mode") == "normal"
    dashed = {o["matcher"]["options"] for o in panel["fieldConfig"]["overrides"]
              if any(p["id"] == "custom.lineStyle" for p in o["properties"])}
    bold = {o["matcher"]["options"] for o in panel["fieldConfig"]["overrides"]
            if any(p["id"] == "custom.lineWidth" for p in o["properties"])}
    import re

    base: dict[datetime, float] = {}
    k = 0
    for result in results:
        for series in result.series:
            name = gq.legend(result.target, series["metric"])
            times, values = _series_points(series)
            color = COLORS[k % len(COLORS)]
            k += 1
            if name in bold:
                color = TEXT
            is_dashed = any(name == d or re.fullmatch(d, name) for d in dashed)
            if bars:
                width = window.step / 86400 * 0.9
                bottoms = [base.get(t, 0.0) if stacked else 0.0 for t in times]
                ax.bar(times, values, width=width, bottom=bottoms, color=color, label=name, alpha=0.85)
                if stacked:
                    for t, v, b in zip(times, values, bottoms):
                        base[t] = b + v
            else:
                ax.plot(times, values, color=color, label=name, linewidth=2.2 if name in bold else 1.3,
                        linestyle="--" if is_dashed else "-")
                if custom.get("fillOpacity", 0) and not is_dashed and "axisSoftMin" in custom:
                    ax.fill_between(times, values, color=color, alpha=custom["fillOpacity"] / 100 * 0.6)
    for finding in findings:
        ax.axvspan(finding["from"], finding["to"], color="#E02F44", alpha=0.10)
        ax.text(finding["from"], 0.98, f" {finding['text']}", transform=ax.get_xaxis_transform(), fontsize=6.5,
                color="#C4162A", va="top")
    if "axisSoftMin" in custom:
        ax.set_ylim(bottom=min(0, ax.get_ylim()[0]))
    _axis_format(ax, unit)
    _time_axis(ax, window.range_s)
    handles, labels = ax.get_legend_handles_labels()
    if labels:
        ax.legend(fontsize=6.5, loc="upper left", bbox_to_anchor=(0, -0.13), ncol=min(4, len(labels)), frameon=False)


def draw_heatmap(ax: Any, panel: dict[str, Any], results: list[gq.QueryResult], window: gq.TimeRange) -> None:
    import matplotlib.dates as mdates
    import numpy as np

    series = results[0].series
    options = panel["options"]
    if options.get("rowsFrame", {}).get("layout") == "le":  # cumulative buckets -> GPUs per band
        def bound(s: dict[str, Any]) -> float:
            return math.inf if s["metric"]["le"] == "+Inf" else float(s["metric"]["le"])

        ordered = sorted(series, key=bound)
        times = sorted({float(t) for s in ordered for t, _ in s["values"]})
        grid = np.zeros((len(ordered), len(times)))
        for i, s in enumerate(ordered):
            values = {float(t): float(v) for t, v in s["values"]}
            for j, t in enumerate(times):
                grid[i, j] = values.get(t, 0.0)
        grid = np.diff(np.vstack([np.zeros(len(times)), grid]), axis=0)
        labels = [f"≤{format_value(bound(s), 'percentunit', 0)}" if bound(s) < math.inf else ">100%" for s in ordered]
        cmap, vmin, vmax, value_unit = "Oranges", 0, max(1.0, grid.max()), "GPUs"
    else:  # one row per series
        ordered = sorted(series, key=lambda s: gq.legend(results[0].target, s["metric"]))
        times = sorted({float(t) for s in ordered for t, _ in s["values"]})
        grid = np.full((len(ordered), len(times)), np.nan)
        for i, s in enumerate(ordered):
            values = {float(t): float(v) for t, v in s["values"]}
            for j, t in enumerate(times):
                grid[i, j] = values.get(t, np.nan)
        labels = [gq.legend(results[0].target, s["metric"]) for s in ordered]
        color = options.get("color", {})
        cmap, vmin, vmax, value_unit = color.get("scheme", "RdYlGn"), color.get("min", 0), color.get("max", 1), "OFU"
    if not times:
        return
    x0, x1 = mdates.date2num(datetime.fromtimestamp(times[0], UTC)), mdates.date2num(
        datetime.fromtimestamp(times[-1], UTC))
    image = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", origin="lower", cmap=cmap, vmin=vmin, vmax=vmax,
                      extent=(x0, x1, -0.5, len(ordered) - 0.5), interpolation="nearest")
    ax.xaxis_date()
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=6.5)
    _time_axis(ax, window.range_s)
    ax.grid(False)
    colorbar = ax.figure.colorbar(image, ax=ax, fraction=0.03, pad=0.01)
    colorbar.ax.tick_params(labelsize=6)
    colorbar.set_label(value_unit, fontsize=6.5)
    if value_unit == "OFU":
        from matplotlib.ticker import FuncFormatter

        colorbar.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_value(v, "percentunit", 0)))


def _table_rows(panel: dict[str, Any], results: list[gq.QueryResult]) -> tuple[list[str], list[list[str]]]:
    """Grafana's merge + organize transformations, for instant table queries."""
    organize = next((t["options"] for t in panel.get("transformations", []) if t["id"] == "organize"), {})
    rename, exclude = organize.get("renameByName", {}), organize.get("excludeByName", {})
    merged: dict[tuple, dict[str, Any]] = {}
    label_names: list[str] = []
    for i, result in enumerate(results):
        for series in result.series:
            labels = {k: v for k, v in series["metric"].items() if k != "__name__"}
            for name in labels:
                if name not in label_names:
                    label_names.append(name)
            row = merged.setdefault(tuple(sorted(labels.items())), dict(labels))
            row["Value" if len(results) == 1 else f"Value #{chr(ord('A') + i)}"] = float(series["value"][1])
    value_names = ["Value"] if len(results) == 1 else [f"Value #{chr(ord('A') + i)}" for i in range(len(results))]
    order = organize.get("indexByName", {})
    columns = sorted([c for c in label_names + value_names if not exclude.get(c)],
                     key=lambda c: order.get(c, 100 + (label_names + value_names).index(c)))
    units = {o["matcher"]["options"]: next((p["value"] for p in o["properties"] if p["id"] == "unit"), None)
             for o in panel["fieldConfig"]["overrides"]}
    default_unit = panel["fieldConfig"]["defaults"]["unit"]
    rows = []
    for row in merged.values():
        if "Value #A" in row and row["Value #A"] <= 0:
            continue  # the panel's filterByValue: jobs that wasted nothing
        cells = []
        for column in columns:
            value = row.get(column)
            shown = rename.get(column, column)
            if isinstance(value, float):
                cells.append(format_value(value, units.get(shown) or default_unit, 1 if units.get(shown) else 2))
            else:
                cells.append(str(value) if value is not None else "")
        rows.append(cells)
    sort = panel["options"].get("sortBy", [])
    headers = [rename.get(c, c) for c in columns]
    if sort and sort[0]["displayName"] in headers:
        index = headers.index(sort[0]["displayName"])
        rows.sort(key=lambda r: float(r[index].split()[0].rstrip("%").replace(",", "") or 0), reverse=sort[0]["desc"])
    return headers, rows


def draw_table(ax: Any, panel: dict[str, Any], results: list[gq.QueryResult]) -> None:
    ax.set_xticks([])
    ax.set_yticks([])
    for side in ax.spines.values():
        side.set_visible(False)
    headers, rows = _table_rows(panel, results)
    if not rows:
        ax.text(0.5, 0.5, panel["fieldConfig"]["defaults"].get("noValue", "No data"), ha="center", va="center",
                fontsize=9, color="#777777", transform=ax.transAxes)
        return
    table = ax.table(cellText=rows, colLabels=headers, loc="upper center", cellLoc="left", colLoc="left")
    table.auto_set_font_size(False)
    table.set_fontsize(7.5)
    table.scale(1, 1.25)
    for (r, _), cell in table.get_celld().items():
        cell.set_edgecolor("#DDDDDD")
        if r == 0:
            cell.set_text_props(weight="bold")
            cell.set_facecolor("#F0F0F0")


def draw_state_timeline(ax: Any, panel: dict[str, Any], results: list[gq.QueryResult], window: gq.TimeRange) -> None:
    import matplotlib.dates as mdates

    rows = []
    for result in results:
        for series in result.series:
            rows.append((gq.legend(result.target, series["metric"]), series))
    rows.sort(key=lambda r: r[0])
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    palette = panel["fieldConfig"]["defaults"]["color"]["mode"] == "palette-classic"
    width = window.step / 86400
    for i, (_, series) in enumerate(rows):
        color = COLORS[i % len(COLORS)] if palette else threshold_color(1.0, steps)
        on = [mdates.date2num(datetime.fromtimestamp(float(t), UTC)) for t, v in series["values"] if float(v) >= 1]
        ax.broken_barh([(t - width, width) for t in on], (i - 0.4, 0.8), facecolors=color)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r[0] for r in rows], fontsize=6.5)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlim(mdates.date2num(datetime.fromtimestamp(window.start, UTC)),
                mdates.date2num(datetime.fromtimestamp(window.end, UTC)))
    ax.xaxis_date()
    _time_axis(ax, window.range_s)
    ax.grid(False)


def findings_of(api: Any, dashboard: dict[str, Any], values: dict[str, str], window: gq.TimeRange) -> list[dict]:
    out = []
    for _, series_list in gq.run_annotations(api, dashboard, values, window):
        for series in series_list:
            times = [float(t) for t, v in series["values"] if float(v) >= 1]
            if times:
                out.append({"from": datetime.fromtimestamp(times[0] - window.step, UTC),
                            "to": datetime.fromtimestamp(times[-1], UTC),
                            "text": f"{series['metric'].get('ofu_finding_kind')}: "
                                    f"{series['metric'].get('ofu_finding_cause')}"})
    return out


def render(dashboard: dict[str, Any], demo: DemoData, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    uid = dashboard["uid"]
    if uid == "otel-ofu-self":
        window = gq.TimeRange(demo.self_start, demo.self_end, 0.5, "2s")
        span_text = "the demo run's own seconds (wall time)"
    else:
        window = gq.TimeRange(demo.start, demo.end - 120, 60.0, "1m")
        span_text = "the demo's hour of fleet time"
    prefer = dict(CHOICES.get(uid, {}))
    if uid == "otel-ofu-gpu" and "job" in prefer:
        held = demo.prometheus.query(f'gpu_ofu{{ofu_job_id="{prefer["job"]}"}}', window.end)
        prefer = {"host": held[0]["metric"]["host_name"], "gpu": held[0]["metric"]["hw_id"]}
    values = gq.resolve_variables(demo.prometheus, dashboard, window, prefer, use_all=uid != "otel-ofu-gpu")
    if uid == "otel-ofu-job":
        values = {**values, "job": gq.regex_escape(prefer["job"])}
    findings = findings_of(demo.prometheus, dashboard, values, window)

    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dashboard["panels"])
    header_in = 0.9
    fig_w, fig_h = 24 * UNIT_W_IN, bottom * UNIT_H_IN + header_in
    fig = plt.figure(figsize=(fig_w, fig_h), facecolor=BACKGROUND)
    shown = {k: v for k, v in values.items() if k != "datasource"}
    variables_text = "   ".join(f"{k} = {'All' if v == gq.ALL else v.replace(chr(92), '')}" for k, v in shown.items())
    fig.text(0.01, 1 - 0.28 / fig_h, f"PREVIEW  {dashboard['title']}", fontsize=15, weight="bold", color=TEXT,
             va="top")
    fig.text(0.01, 1 - 0.62 / fig_h, f"Not a Grafana screenshot: drawn by tools/render_dashboards.py from the "
             f"dashboard's own queries on {span_text} in Prometheus.   {variables_text}", fontsize=8.5, color="#555555",
             va="top")
    fig.text(0.99, 1 - 0.28 / fig_h, "PREVIEW", fontsize=15, weight="bold", color="#C4162A", va="top", ha="right")

    def box(pos: dict[str, int], pad_top: float = 0.0) -> list[float]:
        left = pos["x"] * UNIT_W_IN / fig_w
        width = pos["w"] * UNIT_W_IN / fig_w
        top = 1 - (header_in + pos["y"] * UNIT_H_IN) / fig_h
        height = pos["h"] * UNIT_H_IN / fig_h
        return [left, top - height, width, height]

    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        if panel["type"] == "row":
            fig.text(box(pos)[0] + 0.002, box(pos)[1] + box(pos)[3] * 0.5, panel["title"], fontsize=11, weight="bold",
                     color=TEXT, va="center")
            continue
        left, low, width, height = box(pos)
        frame = fig.add_axes([left + 0.002, low + 0.004, width - 0.004, height - 0.008], facecolor=PANEL_BG)
        frame.set_xticks([])
        frame.set_yticks([])
        for side in frame.spines.values():
            side.set_edgecolor("#D8D9DA")
        unit = panel["fieldConfig"]["defaults"]["unit"]
        frame.text(0.01, 0.985, panel["title"], fontsize=9, weight="bold", color=TEXT, va="top",
                   transform=frame.transAxes)
        if panel["type"] != "stat":  # stats show it in their box: their titles fill the width
            frame.text(0.99, 0.985, f"unit: {unit}", fontsize=6.5, color="#888888", va="top", ha="right",
                       transform=frame.transAxes)
        title_h = 0.34 / (pos["h"] * UNIT_H_IN)
        results = gq.run_panel(demo.prometheus, panel, values, window)
        kind = panel["type"]
        if kind == "stat":
            inner = fig.add_axes([left + 0.006, low + 0.012, width - 0.012, height * (1 - title_h) - 0.016])
            draw_stat(inner, panel, results)
            continue
        legend_room = 0.22 if kind == "timeseries" else 0.0
        margin_in = {"heatmap": 1.0, "state-timeline": 2.0}.get(kind, 0.95)  # room for the y tick labels
        margin_left = margin_in / (pos["w"] * UNIT_W_IN)
        inner_box = [left + width * margin_left, low + height * (0.1 + legend_room),
                     width * (1 - margin_left - 0.03), height * (1 - title_h - 0.14 - legend_room)]
        inner = fig.add_axes(inner_box)
        if kind == "timeseries":
            draw_timeseries(inner, panel, results, window, findings)
        elif kind == "heatmap":
            draw_heatmap(inner, panel, results, window)
        elif kind == "table":
            inner.set_position([left + 0.006, low + 0.01, width - 0.012, height * (1 - title_h) - 0.02])
            draw_table(inner, panel, results)
        elif kind == "state-timeline":
            draw_state_timeline(inner, panel, results, window)
    path = out / f"dashboard-{uid.removeprefix('otel-ofu-')}.png"
    fig.savefig(path, dpi=80, facecolor=BACKGROUND)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render preview PNGs of deploy/grafana's dashboards from the demo.")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help=f"output folder (default {OUT_DIR})")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("otel_ofu",):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    prometheus = prometheus_binary()
    promtool = promtool_binary(prometheus)
    if not prometheus or not promtool:
        print("needs prometheus and promtool: run collector/install-prometheus.sh", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="otel-ofu-demo-") as work, \
            demo_in_prometheus(Path(work), prometheus, promtool) as demo:
        for path in sorted(DASHBOARD_DIR.glob("*.json")):
            written = render(json.loads(path.read_text()), demo, args.out)
            log.info("wrote %s", written)
    return 0


if __name__ == "__main__":
    sys.exit(main())
