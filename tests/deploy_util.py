"""Helpers for the deployment tests: Helm, rendered manifests, and checking the configs inside them.

Helm is built from Go modules by collector/build-helm.sh (cached); ``$HELM`` overrides. Missing
tools skip locally and fail under CI (tests/e2e_util.unavailable).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.e2e_util import ROOT, built_tool

CHART = ROOT / "deploy" / "helm" / "otel-ofu"
EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))
RENDERED = ROOT / "deploy" / "kubernetes"
# The release the plain manifests are rendered as (deploy/kubernetes/render.sh).
RELEASE = "otel-ofu"
NAMESPACE = "gpu-monitoring"

# Kubernetes versions the manifests are validated against: the oldest the chart supports in
# kubernetes-validate's schema set, and the newest it ships.
OLDEST_K8S = "1.31.0"
# What `helm template` and `helm lint` are told the cluster runs: a Helm built with a plain `go
# install` assumes Kubernetes 1.20, which the chart's kubeVersion refuses (deploy/helm/otel-ofu/Chart.yaml).
KUBE_VERSION = ("--kube-version", OLDEST_K8S)
# The plain manifests (deploy/kubernetes/render.sh) name the OTLP token's Secret rather than carry a
# token: one in a file everybody has would be no secret, and a random one would change every render.
PLAIN_MANIFEST_SETS = ("agent.otlpReceiver.auth.existingSecret=otel-ofu-otlp-token",)

# A stand-in for every downward-API field the manifests use.
FIELD_PLACEHOLDERS = {
    "spec.nodeName": "gpu-node-01",
    "status.hostIP": "10.0.0.11",
    "status.podIP": "10.244.1.7",
    "metadata.name": "trainer-0-abcde",
    "metadata.namespace": NAMESPACE,
    "metadata.uid": "0b8e9d2c-5f1a-4c2e-9d1b-7a6c5e4f3a21",
}

def helm_binary() -> str:
    """Helm from collector/build-helm.sh (built once, cached); $HELM overrides."""
    return built_tool("helm", "HELM", "build-helm.sh", "run collector/build-helm.sh (needs Go) to build Helm",
                      timeout=1800)


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([helm_binary(), *args], capture_output=True, text=True, timeout=120)
    if check and done.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({done.returncode}):\n{done.stderr}{done.stdout}")
    return done


def template_text(*values_files: Path, sets: tuple[str, ...] = (), release: str = RELEASE,
                  namespace: str = NAMESPACE) -> str:
    args = ["template", release, str(CHART), "--namespace", namespace, *KUBE_VERSION]
    for f in values_files:
        args += ["-f", str(f)]
    for s in sets:
        args += ["--set", s]
    return helm(*args).stdout


def template(*values_files: Path, sets: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The rendered objects (empty documents dropped)."""
    return [d for d in yaml.safe_load_all(template_text(*values_files, sets=sets)) if d]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str, component: str) -> dict[str, Any]:
    found = [o for o in by_kind(objects, kind)
             if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component]
    assert len(found) == 1, f"expected one {kind} for {component}, found {len(found)}"
    return found[0]


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    if workload["kind"] == "Pod":
        return workload["spec"]
    if workload["kind"] == "Job":
        return workload["spec"]["template"]["spec"]
    return workload["spec"]["template"]["spec"]


def container_env(container: dict[str, Any]) -> dict[str, str]:
    """The environment a container would get, with stand-ins for downward-API and Secret values."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        name = item["name"]
        if "value" in item:
            env[name] = str(item["value"])
            continue
        source = item["valueFrom"]
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            if path.startswith("metadata.annotations["):
                env[name] = "bf16"  # the only annotation used: the job's declared precision
            elif path.startswith("metadata.labels["):
                env[name] = "label-value"
            else:
                env[name] = FIELD_PLACEHOLDERS[path]
        elif "secretKeyRef" in source:
            env[name] = f"secret:{source['secretKeyRef']['name']}/{source['secretKeyRef']['key']}"
        elif "configMapKeyRef" in source:
            env[name] = "configmap-value"
        elif "resourceFieldRef" in source:
            env[name] = "1"
        else:
            raise AssertionError(f"env {name}: unknown valueFrom {source}")
    return env


def stage_mounts(config_text: str, spec: dict[str, Any], container: dict[str, Any], root: Path) -> str:
    """Put the container's mounted files under ``root`` and point the config there.

    ``otel-ofu validate`` checks that files it will read (CA bundles, token files) exist. Paths
    under a Secret or ConfigMap mount become placeholder files in ``root``, other mounts
    (emptyDir, hostPath, volume claims) become directories; the config's paths are rewritten to
    match. A path outside every mount is left alone, so a config reading a file the pod does not
    mount still fails.
    """
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    mounts = sorted(container.get("volumeMounts", []), key=lambda m: -len(m["mountPath"]))
    local_of = {}
    for mount in mounts:
        path = mount["mountPath"].rstrip("/")
        local = root / "mnt" / path.lstrip("/")
        local_of[path] = local
        local.mkdir(parents=True, exist_ok=True)
        volume = volumes.get(mount["name"], {})
        if "secret" in volume or "configMap" in volume:
            for ref in set(re.findall(re.escape(path) + r"/([\w.\-]+)", config_text)):
                (local / ref).write_text("placeholder\n")
    if not local_of:
        return config_text
    # One pass, longest mount first, so a rewritten path is not rewritten again.
    pattern = re.compile("|".join(re.escape(p) for p in local_of) + r"(?=/|\s|$|\"|')", re.M)
    return pattern.sub(lambda m: str(local_of[m.group(0)]), config_text)


def otel_ofu_validate(config_text: str, env: dict[str, str], workdir: Path) -> subprocess.CompletedProcess[str]:
    path = workdir / "config.yaml"
    path.write_text(config_text)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OFU_", "K8S_"))}
    return subprocess.run([sys.executable, "-m", "otel_ofu", "validate", "--config", str(path)],
                          capture_output=True, text=True, env={**clean, **env}, timeout=120, cwd=workdir)


def assert_otel_ofu_config_valid(config_text: str, spec: dict[str, Any], container: dict[str, Any],
                                 workdir: Path) -> None:
    """``otel-ofu validate`` accepts the config with the container's env and mounts, and nothing else."""
    staged = stage_mounts(config_text, spec, container, workdir)
    env = container_env(container)
    done = otel_ofu_validate(staged, env, workdir)
    assert done.returncode == 0, f"otel-ofu validate failed:\n{done.stdout}{done.stderr}\n--- config ---\n{staged}"


def doc_blocks(path: Path, heading: str, lang: str) -> list[str]:
    """The ``lang`` code blocks of a Markdown section (from ``heading`` to the next heading of its level)."""
    text = path.read_text()
    start = text.index(heading + "\n")
    level = heading.split(" ")[0]
    end = text.find("\n" + level + " ", start + len(heading))
    section = text[start:end if end >= 0 else len(text)]
    return re.findall(rf"^```{lang}\n(.*?)^```$", section, re.M | re.S)


def resolve_env(items: list[dict[str, Any]], fields: dict[str, str], secrets: dict[tuple[str, str], str]) -> dict[
        str, str]:
    """A container's env as the kubelet resolves it: downward-API fields, Secret keys, and ``$(NAME)``
    references to variables defined earlier in the list (an undefined one stays as written)."""
    env: dict[str, str] = {}
    for item in items:
        if "value" in item:
            env[item["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), str(item["value"]))
            continue
        source = item["valueFrom"]
        if "fieldRef" in source:
            env[item["name"]] = fields[source["fieldRef"]["fieldPath"]]
        else:
            ref = source["secretKeyRef"]
            env[item["name"]] = secrets[(ref["name"], ref["key"])]
    return env
