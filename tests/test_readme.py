"""The README's metric table is the metric registry: none missing, none stale."""

import re
from pathlib import Path

from otel_ofu.core import metrics
from otel_ofu.pipeline import registry

README = Path(__file__).parent.parent / "README.md"


def readme_table() -> dict[str, str]:
    text = README.read_text()
    block = text.split("<!-- metrics-table:start -->")[1].split("<!-- metrics-table:end -->")[0]
    return {m.group(1): m.group(2).strip() for m in re.finditer(r"^\| `([^`]+)` \| `([^`]*)` \|", block, re.M)}


def test_every_registered_metric_is_in_the_readme_table_with_its_unit():
    registry.factories()  # importing the components registers their metrics
    table = readme_table()
    missing = sorted(set(metrics.METRICS) - set(table))
    assert not missing, f"add to README (python -m otel_ofu.cli.docs prints the table): {missing}"
    stale = sorted(set(table) - set(metrics.METRICS))
    assert not stale, f"in README but not registered: {stale}"
    for name, info in metrics.METRICS.items():
        assert table[name] == info.unit, name
