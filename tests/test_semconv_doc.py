"""docs/semconv.md maps every metric and attribute otel-ofu emits to the OpenTelemetry semantic
conventions (issue 34): a metric or attribute added to the registries (docs/metrics.md is generated
from them, and tests/test_docs.py keeps it current) must be placed there too."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).parent.parent / "docs"


def test_semconv_names_every_metric_and_attribute_of_the_reference():
    reference = (DOCS / "metrics.md").read_text()
    names = set(re.findall(r"^\| `([^`]+)` \|", reference, flags=re.MULTILINE))
    assert {"gpu.ofu", "gpu.energy", "job.energy", "hw.id", "ofu.energy.basis"} <= names
    mapping = (DOCS / "semconv.md").read_text()
    missing = sorted(name for name in names if f"`{name}`" not in mapping)
    assert not missing, f"docs/semconv.md does not place: {', '.join(missing)}"
