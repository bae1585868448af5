"""Reference tables generated from the code (``python -m otel_ofu.cli.docs``).

The metric table comes from the metric registry after every component module is imported
(components register their own metrics).
"""

from __future__ import annotations

from otel_ofu.core import metrics
from otel_ofu.pipeline import registry


def metric_table() -> str:
    registry.factories()
    return metrics.markdown_table()


if __name__ == "__main__":
    print(metric_table())
