"""One naming scheme for every environment variable the shipped files read or set.

Ours are ``OFU_<WHAT>``. A variable another program owns keeps its owner's name and meaning
(``DCGM_EXPORTER_INTERVAL`` is dcgm-exporter's ``-c`` in milliseconds; ``OTEL_*`` are the
OpenTelemetry SDK's). docs/config.md lists every one of them; this test finds them in the
shipped configs, the Dockerfile, the Helm chart (templates, values and its renderings) and the
systemd unit, and fails on a name outside the scheme or missing from the docs.
"""

from __future__ import annotations

import re
from pathlib import Path

import dockerfile
import pytest
import yaml

from otel_ofu.pipeline.config import load_document
from tests.e2e_util import ROOT

OURS = re.compile(r"OFU_[A-Z0-9_]+")
FAMILY = re.compile(r"(OFU_[A-Z0-9_]+_)\d+")  # OFU_HEADER_0, ...: documented as OFU_HEADER_<n>
# Names other programs own: exact names, or a prefix ending in "_" (a family).
FOREIGN = {
    "DCGM_EXPORTER_INTERVAL": "dcgm-exporter",
    "OTEL_EXPORTER_OTLP_": "OpenTelemetry SDK", "OTEL_SERVICE_NAME": "OpenTelemetry SDK",
    "OTEL_RESOURCE_ATTRIBUTES": "OpenTelemetry SDK", "OTEL_METRIC_EXPORT_INTERVAL": "OpenTelemetry SDK",
    "K8S_": "Kubernetes downward API", "KUBECONFIG": "Kubernetes clients", "SLURM_": "Slurm",
    "NVIDIA_": "NVIDIA container runtime",
    "GOMEMLIMIT": "Go runtime", "HOME": "system", "PATH": "system", "LD_LIBRARY_PATH": "system",
    "PYTHONDONTWRITEBYTECODE": "Python", "PYTHONUNBUFFERED": "Python",
}
CONFIG_DOC = ROOT / "docs" / "config.md"
CHART = ROOT / "deploy" / "helm" / "otel-ofu"
REFERENCE = re.compile(r"\$\{(?:env:)?([A-Za-z_][A-Za-z0-9_]*)")


def owner(name: str) -> str | None:
    if OURS.fullmatch(name):
        return "otel-ofu"
    for known, who in FOREIGN.items():
        if name == known or (known.endswith("_") and name.startswith(known)):
            return who
    return None


def without_comments(text: str) -> str:
    return "\n".join(line.split(" #")[0] for line in text.splitlines() if not line.lstrip().startswith("#"))


def pod_env_names(path: Path) -> set[str]:
    names = set()
    for doc in yaml.safe_load_all(path.read_text()):
        for container in _containers(doc or {}):
            names |= {item["name"] for item in container.get("env", [])}
    return names


def _containers(node: object) -> list[dict]:
    if isinstance(node, dict):
        found = [c for key in ("containers", "initContainers") for c in node.get(key) or [] if isinstance(c, dict)]
        return found + [c for v in node.values() for c in _containers(v)]
    if isinstance(node, list):
        return [c for v in node for c in _containers(v)]
    return []


def dockerfile_names() -> set[str]:
    names = set()
    for cmd in dockerfile.parse_file(str(ROOT / "Dockerfile")):
        if cmd.cmd == "ENV":
            names |= set(cmd.value[0::2])
        names |= set(re.findall(r"environ(?:\.get\(|\[)['\"](\w+)['\"]", " ".join(cmd.value)))
    return names


def found_names() -> dict[str, set[str]]:
    """Every variable name, and the files it is in."""
    where: dict[str, set[str]] = {}

    def add(names: set[str], path: Path) -> None:
        for name in names:
            where.setdefault(name, set()).add(str(path.relative_to(ROOT)))

    for path in [*sorted((ROOT / "collector-config").glob("*.yaml")), ROOT / "deploy" / "systemd" / "otel-ofu.yaml",
                 *sorted((CHART / "templates").glob("*")), CHART / "values.yaml", *sorted(CHART.glob("examples/*"))]:
        add(set(REFERENCE.findall(without_comments(path.read_text()))), path)
    for path in sorted((CHART / "templates").glob("*")):
        add(set(re.findall(r"^\s*- name: ([A-Z][A-Z0-9_]*)\s*$", path.read_text(), re.M)), path)
    for path in sorted((ROOT / "deploy" / "kubernetes").rglob("*.yaml")):
        add(pod_env_names(path) | set(REFERENCE.findall(path.read_text())), path)
    unit = (ROOT / "deploy" / "systemd" / "otel-ofu.service").read_text()
    add(set(re.findall(r"^Environment=\"?(\w+)=", unit, re.M)) | set(REFERENCE.findall(unit)),
        ROOT / "deploy" / "systemd" / "otel-ofu.service")
    add(dockerfile_names(), ROOT / "Dockerfile")
    return where


def documented() -> str:
    text = CONFIG_DOC.read_text()
    start = text.index("## Environment variables")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def test_every_variable_follows_the_scheme() -> None:
    wrong = {name: sorted(files) for name, files in found_names().items() if owner(name) is None}
    assert not wrong, f"name these OFU_<WHAT> (or add their owner to FOREIGN and docs/config.md): {wrong}"


def test_every_variable_is_documented() -> None:
    section = documented()
    def documented_as(name: str) -> str:
        family = FAMILY.fullmatch(name)
        stem = family.group(1) if family else name
        return f"`{stem}<n>`" if stem.endswith("_") else f"`{stem}`"

    missing = {name: sorted(files) for name, files in found_names().items()
               if owner(name) == "otel-ofu" and documented_as(name) not in section}
    assert not missing, f"docs/config.md, 'Environment variables', does not list: {missing}"
    for known in FOREIGN:
        assert f"`{known}" in section, f"docs/config.md does not say who owns {known}"


def test_the_scan_finds_what_it_should() -> None:
    """The scan is not vacuous: it sees the chart's env, the Dockerfile's, the configs' references."""
    names = found_names()
    assert {"OFU_PROMETHEUS_ENDPOINT", "DCGM_EXPORTER_INTERVAL", "K8S_NODE_NAME", "OFU_DCGM_ADDRESS"} <= set(names)
    assert "Dockerfile" in names["OFU_PROMETHEUS_ENDPOINT"]
    assert any(f.startswith("deploy/kubernetes/") for f in names["K8S_NODE_NAME"])


def dockerfile_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for cmd in dockerfile.parse_file(str(ROOT / "Dockerfile")):
        if cmd.cmd == "ENV":
            env.update(zip(cmd.value[0::2], cmd.value[1::2]))
    return env


PROMETHEUS_CONFIGS = [p for p in sorted((ROOT / "collector-config").glob("*.yaml"))
                      if not p.name.startswith("otelcol-")
                      and "prometheus" in (yaml.safe_load(p.read_text()).get("exporters") or {})]


@pytest.mark.parametrize("path", PROMETHEUS_CONFIGS, ids=lambda p: p.name)
def test_in_the_image_every_prometheus_endpoint_listens_beyond_the_container(path: Path, monkeypatch) -> None:
    """The image's ENV sets OFU_PROMETHEUS_ENDPOINT=0.0.0.0:9464: each shipped config must read it."""
    image_env = dockerfile_env()
    assert image_env["OFU_PROMETHEUS_ENDPOINT"] == "0.0.0.0:9464"
    for name, value in image_env.items():
        monkeypatch.setenv(name, value)
    exporters = load_document(path)["exporters"]
    endpoints = {cid: e.get("endpoint") for cid, e in exporters.items() if cid.split("/")[0] == "prometheus"}
    assert endpoints and set(endpoints.values()) == {"0.0.0.0:9464"}, f"{path.name}: {endpoints}"
