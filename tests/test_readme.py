"""Every command the README shows runs, here, as written (or as close as a test can: noted per command).

The README is the front door: a newcomer copies its commands. A command line the README adds
without a test here fails :func:`test_every_readme_command_is_run_by_a_test`.
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from otel_ofu.otlp.files import read_json_lines

README = Path(__file__).parent.parent / "README.md"
TEXT = README.read_text()


def readme_commands() -> list[str]:
    """Shell lines in the README: indented code lines that start with a command, outside YAML."""
    commands = []
    for line in TEXT.splitlines():
        stripped = line.strip()
        if re.match(r"^ {4,}\S", line) and re.match(r"^([A-Z_]+=\S+ )*(otel-ofu|python3?|\.ci/run|helm)\b", stripped):
            commands.append(stripped)
    return commands


DEMO = ("python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/otel-ofu run --config "
        "collector-config/demo.yaml --duration 60")
HELM = ("helm install ofu deploy/helm/otel-ofu -n gpu-monitoring --create-namespace "
        "--set image.repository=REGISTRY/otel-ofu")


def test_every_readme_command_is_run_by_a_test():
    covered = {DEMO, ".ci/run", HELM, *quick_commands()}
    assert readme_commands(), "the command finder found nothing: it is broken"
    missing = [c for c in readme_commands() if c not in covered]
    assert not missing, f"README commands no test runs (add one to tests/test_readme.py): {missing}"


def test_the_demo_command_runs_and_records_otlp_json(tmp_path):
    """The demo command after its install steps (the test's environment is that install), with a
    shorter --duration; in a fresh directory, where it writes demo-metrics.jsonl."""
    assert DEMO in readme_commands()
    run = DEMO.split("&& .venv/bin/otel-ofu ")[1].replace("--duration 60", "--duration 6")
    (tmp_path / "collector-config").symlink_to(README.parent / "collector-config")
    done = subprocess.run([sys.executable, "-m", "otel_ofu", *shlex.split(run)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    written = (tmp_path / "demo-metrics.jsonl.zst").read_bytes()
    assert written.startswith(b"\x28\xb5\x2f\xfd"), "the demo's recording is not zstd: it would fill the disk"
    assert not (tmp_path / "demo-metrics.jsonl").exists()
    recorded = "".join(text for _, text in read_json_lines(tmp_path / "demo-metrics.jsonl.zst"))
    assert '"gpu.ofu"' in recorded and '"job.ofu"' in recorded
    assert "demo-metrics.jsonl.zst" in TEXT


def test_the_readme_describes_the_demo_fleet_the_demo_config_runs():
    """The README's "N nodes with M GPUs each (T GPUs)" is the sim receiver's nodes x gpus_per_node."""
    sim = yaml.safe_load((README.parent / "collector-config" / "demo.yaml").read_text())["receivers"]["sim"]
    said = re.search(r"fleet of (\w+) nodes with (\w+) GPUs each \((\d+) GPUs\)", " ".join(TEXT.split()))
    assert said, "the README no longer says the demo fleet's size"
    words = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "eight": 8, "sixteen": 16}
    nodes, per_node, total = words.get(said[1], said[1]), words.get(said[2], said[2]), int(said[3])
    assert (nodes, per_node, total) == (sim["nodes"], sim["gpus_per_node"], sim["nodes"] * sim["gpus_per_node"])


def test_the_test_command_is_the_ci_entry_point():
    """`.ci/run` is what CI runs (it runs this very test): it exists, is executable, runs pytest."""
    ci = README.parent / ".ci" / "run"
    assert ".ci/run" in readme_commands() and os.access(ci, os.X_OK)
    assert ".venv/bin/pytest" in ci.read_text()


def test_the_helm_command_renders(tmp_path):
    """`helm install` needs a cluster; `helm template` with the same chart, namespace and values
    renders what it would install, and the agent's image is the one the command names."""
    helm = os.environ.get("HELM") or subprocess.run(["bash", "-c", "command -v helm"], capture_output=True,
                                                    text=True).stdout.strip()
    if not helm:
        if os.environ.get("CI"):
            pytest.fail("HELM is not set under CI: .ci/run builds it (collector/build-helm.sh)")
        pytest.skip("helm not built: HELM=$(collector/build-helm.sh | tail -1)")
    assert HELM in readme_commands()
    args = shlex.split(HELM)[2:]  # after "helm install"
    done = subprocess.run([helm, "template", *args, "--kube-version", "1.31.0"], cwd=README.parent,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.search(r"image: \"?REGISTRY/otel-ofu:", done.stdout) and "kind: DaemonSet" in done.stdout


# --- the quick paths, run as the README writes them ---------------------------------------------

QUICK = TEXT.split("<!-- quick-paths:start -->")[1].split("<!-- quick-paths:end -->")[0]


def quick_commands() -> list[str]:
    """The indented shell lines of the quick paths, in order."""
    return [line.strip() for line in QUICK.splitlines() if line.startswith("    ") and "otel-ofu" in line]


def argv_env(command: str, replace: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """A README command as argv + environment; `otel-ofu` runs this checkout's package."""
    import shlex
    import sys

    words = shlex.split(command)
    env = {}
    while "=" in words[0]:
        name, value = words.pop(0).split("=", 1)
        env[name] = (replace or {}).get(value, value)
    assert words[0] == "otel-ofu", command
    return [sys.executable, "-m", "otel_ofu", *words[1:]], env


def mig_page() -> str:
    """A dcgm-exporter 4.x page in Kubernetes: GPU 0 split into three MIG instances, GPU 1 whole."""
    base = 'gpu="{gpu}",UUID="{uuid}",pci_bus_id="00000000:1{gpu}:00.0",device="nvidia{gpu}",' \
           'modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-01",DCGM_FI_DRIVER_VERSION="575.57.08"'
    entities = [(0, "GPU-3b1c5e2a-8f0d-4c61-9a7e-1d2f3a4b5c60", mig, pod, tpa)
                for mig, pod, tpa in (("1", "train-a-0", 0.61), ("2", "train-b-0", 0.32), ("3", "infer-c-0", 0.05))]
    entities.append((1, "GPU-3b1c5e2a-8f0d-4c61-9a7e-1d2f3a4b5c61", None, "train-d-0", 0.88))
    lines = []
    for metric, kind, value in (("DCGM_FI_DEV_SM_CLOCK", "gauge", lambda t: 1755),
                                ("DCGM_FI_DEV_POWER_USAGE", "gauge", lambda t: 512.25),
                                ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", lambda t: t)):
        lines += [f"# HELP {metric} {metric}.", f"# TYPE {metric} {kind}"]
        for gpu, uuid, mig, pod, tpa in entities:
            labels = base.format(gpu=gpu, uuid=uuid)
            if mig:
                labels += f',GPU_I_PROFILE="2g.20gb",GPU_I_ID="{mig}"'
            labels += f',container="main",namespace="ml",pod="{pod}"'
            v = value(tpa)
            lines.append(f"{metric}{{{labels}}} {v:.6f}" if isinstance(v, float) else f"{metric}{{{labels}}} {v}")
    return "\n".join(lines) + "\n"


def test_quick_path_dcgm_exporter_and_prometheus(tmp_path):
    """The README's command against a dcgm-exporter page over HTTP, then the README's scrape config in
    a real Prometheus: every GPU and MIG instance is its own series, named by its pod's job."""
    import urllib.request

    import yaml

    from tests.e2e_util import PageServer, Process, free_ports, prometheus_binary, require_alive, wait_for
    from tests.test_prometheus_e2e import promql

    server = PageServer({"/metrics": mig_page().encode()})
    ofu_port, prom_port = free_ports(2)
    command = next(c for c in quick_commands() if "dcgm-exporter.yaml" in c)
    argv, env = argv_env(command, {"http://localhost:9400/metrics": f"{server.url}/metrics"})
    # The documented knobs: the listen address, dcgm-exporter's -c (milliseconds), where the recording goes.
    env.update(OFU_PROMETHEUS_ENDPOINT=f"127.0.0.1:{ofu_port}", DCGM_EXPORTER_INTERVAL="1000",
               OFU_OUT=str(tmp_path / "dcgm-exporter-metrics.jsonl"))
    ofu = Process("otel-ofu", argv, tmp_path / "otel-ofu.log", env)
    try:
        def scraped() -> str | None:
            require_alive(ofu)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ofu_port}/metrics", timeout=5) as response:
                    text = response.read().decode()
            except OSError:
                return None
            return text if text.count("gpu_ofu{") == 4 else None

        text = wait_for("otel-ofu to serve gpu_ofu for 4 GPU entities", scraped, timeout=60, diagnostics=ofu.tail)
        for job in ("k8s:ml/Pod/train-a-0", "k8s:ml/Pod/train-b-0", "k8s:ml/Pod/infer-c-0", "k8s:ml/Pod/train-d-0"):
            assert f'ofu_job_id="{job}"' in text, job

        prometheus = prometheus_binary()
        scrape = yaml.safe_load(QUICK.split("```yaml")[1].split("```")[0])
        scrape["scrape_configs"][0]["static_configs"][0]["targets"] = [f"127.0.0.1:{ofu_port}"]
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({"global": {"scrape_interval": "1s"}, **scrape}))
        prom = Process("prometheus", [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                                      f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                      f"--web.listen-address=127.0.0.1:{prom_port}"], tmp_path / "prometheus.log")
        try:
            series = wait_for("PromQL gpu_ofu for every GPU and MIG instance", lambda: (
                r if len(r := promql(prom_port, "gpu_ofu")) == 4 else None), timeout=120, diagnostics=prom.tail)
            migs = sorted(s["metric"].get("gpu_mig_instance_id", "-") for s in series)
            assert migs == ["-", "1", "2", "3"]
            jobs = wait_for("PromQL job_ofu{ofu_window=\"1h\"} for the four jobs", lambda: (
                r if len(r := promql(prom_port, 'job_ofu{ofu_window="1h"}')) == 4 else None), timeout=150,
                diagnostics=lambda: prom.tail() + ofu.tail())
            assert {s["metric"]["ofu_job_id"] for s in jobs} == {"k8s:ml/Pod/train-a-0", "k8s:ml/Pod/train-b-0",
                                                                 "k8s:ml/Pod/infer-c-0", "k8s:ml/Pod/train-d-0"}
        finally:
            prom.stop()
    finally:
        ofu.stop()
        server.close()
    # "I have a recording" follows: the README's report command, in the directory of the recording.
    import subprocess

    report = next(c for c in quick_commands() if "report" in c and "dcgm-exporter-metrics" in c)
    argv, env = argv_env(report)
    done = subprocess.run(argv, cwd=tmp_path, env={**__import__("os").environ, **env}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    for job in ("k8s:ml/Pod/train-a-0", "k8s:ml/Pod/train-b-0", "k8s:ml/Pod/infer-c-0", "k8s:ml/Pod/train-d-0"):
        assert job in done.stdout, done.stdout


def test_quick_path_recording(tmp_path):
    """The recording commands, as written, in a directory holding the files they name."""
    import shutil
    import subprocess

    data = Path(__file__).parent / "data" / "replay"
    (tmp_path / "collector-config").symlink_to(README.parent / "collector-config")
    shutil.copy(data / "sim-ofu.jsonl", tmp_path / "recording.jsonl")
    shutil.copy(data / "h100-dmon.txt", tmp_path / "node7.dmon")
    outputs = {}
    for command in quick_commands():
        if "dcgm-exporter" in command:  # the quick path above, and its recording
            continue
        argv, env = argv_env(command)
        done = subprocess.run(argv, cwd=tmp_path, env={**__import__("os").environ, **env}, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, (command, done.stderr[-2000:])
        outputs[command] = done.stdout
    by_kind = {("dmon" if "node7.dmon" in c else "jsonl" if "recording.jsonl" in c else "?") +
               ("-replay" if "replay.yaml" in c else ""): out for c, out in outputs.items()}
    assert "llama-70b" in by_kind["jsonl"]
    assert "No job: the 2 GPUs below come from a dmon recording" in by_kind["dmon"] and "GPU 0" in by_kind["dmon"]
    replayed = (tmp_path / "replay-metrics.jsonl").read_text()  # the replay ended by itself and flushed
    assert replayed.count('"gpu.ofu"') >= 2 and '"stringValue":"0"' in replayed and '"stringValue":"1"' in replayed


def test_the_quickstart_says_why_job_ofu_lags():
    """job_ofu comes once per resolution of data time: the quickstart says so, with the default in force."""
    from otel_ofu.cli.docs import format_duration
    from otel_ofu.jobs.tracker import JobsConfig

    text = (README.parent / "docs" / "quickstart.md").read_text()
    assert "`job_ofu` lags `gpu_ofu`" in text
    assert f"`resolution`, default `{format_duration(float(JobsConfig().resolution))}`" in text
