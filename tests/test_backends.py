"""The roads into a Prometheus-compatible backend (docs/backends.md).

Names first: otel-ofu declares units so that every road's standard Prometheus translation names
its metrics as the dashboards and rules read them.
"""

from __future__ import annotations

from otel_ofu.core import metrics
from otel_ofu.pipeline import registry


def test_no_metric_is_declared_unit_1_so_no_road_adds_ratio():
    """A gauge of unit "1" becomes NAME_ratio on Prometheus 3's OTLP receiver, VictoriaMetrics'
    Prometheus naming and the Collector's exporters: dashboards reading NAME find nothing there."""
    registry.factories()  # the components register their metrics on import
    unit_1 = sorted(name for name, info in metrics.METRICS.items() if info.unit == "1")
    assert not unit_1, f"declare a ratio {{ratio}} (a count {{item}}, a state {{state}}): {unit_1}"
