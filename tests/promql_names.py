"""The Prometheus metric names otel-ofu serves and the names a PromQL expression reads."""

from __future__ import annotations

import re

from otel_ofu.core import metrics
from otel_ofu.exporters.prometheus import prometheus_name
from otel_ofu.pipeline import registry

# Prefixes of otel-ofu's own metrics once converted (gpu_*, job_*, otel_ofu_*, ...).
OWN_PREFIXES = ("gpu_", "job_", "otel_ofu_", "training_", "sim_")


def served_names() -> set[str]:
    """Every sample name the prometheus exporter serves for the registered metrics (counters with _total)."""
    registry.factories()  # importing the components registers their metrics
    out = set()
    for info in metrics.METRICS.values():
        counter = info.kind == "sum"
        name = prometheus_name(info.name, info.unit, counter=counter)
        out.add(f"{name}_total" if counter else name)
    return out


def read_names(expr: str) -> set[str]:
    """Metric and recording-rule names an expression reads (labels, functions and keywords left out)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|`[^`]*`', "", expr)  # strings
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges and subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    tokens = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", text))
    return {t for t in tokens if ":" in t or t.startswith(OWN_PREFIXES) or t == "up"}
