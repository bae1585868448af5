"""Every otel-ofu config we ship reports on itself: a selftelemetry pipeline to wherever its data goes.

Without it an unreachable or empty source is a warning in a log and then silence: Prometheus sees
otel-ofu up with no series (issue 23). With it, every receiver's state
(``otel_ofu.receiver.status``), drops and queues reach the same backend as the data, where the
OtelOfuSourceDown alert and the Self-telemetry dashboard read them.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.e2e_util import ROOT


def shipped_configs() -> list[tuple[str, dict[str, Any]]]:
    """(where, config) for the configs otel-ofu runs: collector-config/, the systemd unit's, the chart's renderings."""
    out = [(p.name, yaml.safe_load(p.read_text())) for p in sorted((ROOT / "collector-config").glob("*.yaml"))
           if not p.name.startswith("otelcol-")]  # those are the Collector's
    out.append(("deploy/systemd/otel-ofu.yaml", yaml.safe_load((ROOT / "deploy/systemd/otel-ofu.yaml").read_text())))
    for path in sorted((ROOT / "deploy" / "kubernetes").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "ConfigMap" and "config.yaml" in doc.get("data", {}):
                where = f"{path.relative_to(ROOT)}: {doc['metadata']['name']}"
                out.append((where, yaml.safe_load(doc["data"]["config.yaml"])))
    return out


CONFIGS = shipped_configs()


def test_the_chart_renderings_are_among_them() -> None:
    assert sum(1 for where, _ in CONFIGS if where.startswith("deploy/kubernetes")) >= 4


@pytest.mark.parametrize(("where", "config"), CONFIGS, ids=[w for w, _ in CONFIGS])
def test_self_telemetry_goes_wherever_the_data_goes(where: str, config: dict[str, Any]) -> None:
    pipelines = config["service"]["pipelines"]
    own = [p for p in pipelines.values() if any(r.split("/")[0] == "selftelemetry" for r in p["receivers"])]
    assert own, f"{where}: no pipeline with the selftelemetry receiver"
    reported = {e for p in own for e in p["exporters"]}
    data = {e for p in pipelines.values() if p not in own for e in p["exporters"]}
    # The console draws GPUs and jobs for a person; the agents' lane to the jobs tier (straight to
    # the chart's jobs instance, or through the fleet's gateway) carries only what the jobs processor reads.
    expected = {e for e in data if e.split("/")[0] != "console" and e not in ("otlp/jobs", "otlp/gateway")}
    assert expected <= reported, f"{where}: self-telemetry does not reach {sorted(expected - reported)}"
