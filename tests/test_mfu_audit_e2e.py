"""The MFU audit end to end, as a cluster runs it: training processes report their MFU with the
helper (the real OpenTelemetry SDK, OTLP over gRPC and HTTP) to otel-ofu, whose GPU counters
come from scraped dcgm-exporter pages (real HTTP servers) and whose pods' jobs come from a real
kube-apiserver (tests/kube_apiserver.py).

One otel-ofu (`otel-ofu run`) watches two nodes' pages:
- gpu-node-1, Kubernetes: PyTorchJob ``llama`` (2 pods x 2 GPUs), two ranks on different pods
  reporting 2.1x and 1.9x the job's OFU; Job ``bert`` (2 pods x 2 GPUs), one rank reporting
  its OFU;
- gpu-node-2, Slurm (dcgm-exporter's hpc_job mapping): job 4242 reporting TFLOP/s per GPU at
  twice its OFU, job 4243 reporting its OFU.
Findings must name exactly the two inflated jobs, with the numbers the jobs sent.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from otel_ofu.core import specs
from otel_ofu.core.model import Batch, job_id_of
from otel_ofu.otlp import codec as otlp
from otel_ofu.pipeline.component import Context
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig
from otel_ofu.receivers.dcgm_exporter import parse_metrics
from tests.e2e_util import (
    PageServer,
    Process,
    free_ports,
    otel_ofu_command,
    read_points,
    require_alive,
    wait_for,
)
from tests.kube_apiserver import WATCHER_TOKEN, WATCHER_USER, KubeApiServer

PODS_ONLY = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
H100 = "NVIDIA H100 80GB HBM3"
TPA, CLOCK_MHZ = 0.40, 1200  # every GPU: OFU about 0.26, as the paper's MoE job
K8S_NODE, SLURM_NODE = "gpu-node-1", "gpu-node-2"


def dcgm_page(host: str, gpus: list[tuple[str, dict[str, str]]]) -> bytes:
    """A dcgm-exporter /metrics page: SM clock, power and tensor activity per GPU, its labels as 3.x/4.x write them."""
    families = [("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", f"{CLOCK_MHZ}"),
                ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "612.304000"),
                ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active.", f"{TPA:.6f}")]
    lines = []
    for name, help_text, value in families:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        for index, (uuid, extra) in enumerate(gpus):
            labels = {"gpu": str(index), "UUID": uuid, "pci_bus_id": f"00000000:{0x18 + index:02X}:00.0",
                      "device": f"nvidia{index}", "modelName": H100, "Hostname": host,
                      "DCGM_FI_DRIVER_VERSION": "570.124.06", **extra}
            lines.append(name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "} " + value)
    return ("\n".join(lines) + "\n").encode()


def pod_labels(pod: str, namespace: str = "llm") -> dict[str, str]:
    return {"container": "trainer", "namespace": namespace, "pod": pod, "pod_uid": ""}


K8S_PAGE = dcgm_page(K8S_NODE, [
    ("GPU-11111111-0000-4000-8000-000000000000", pod_labels("llama-worker-0")),
    ("GPU-11111111-0000-4000-8000-000000000001", pod_labels("llama-worker-0")),
    ("GPU-11111111-0000-4000-8000-000000000002", pod_labels("llama-worker-1")),
    ("GPU-11111111-0000-4000-8000-000000000003", pod_labels("llama-worker-1")),
    ("GPU-11111111-0000-4000-8000-000000000004", pod_labels("bert-0-x7k2p")),
    ("GPU-11111111-0000-4000-8000-000000000005", pod_labels("bert-0-x7k2p")),
    ("GPU-11111111-0000-4000-8000-000000000006", pod_labels("bert-1-q9m4z")),
    ("GPU-11111111-0000-4000-8000-000000000007", pod_labels("bert-1-q9m4z")),
])
SLURM_PAGE = dcgm_page(SLURM_NODE, [
    ("GPU-22222222-0000-4000-8000-000000000000", {"hpc_job": "4242"}),
    ("GPU-22222222-0000-4000-8000-000000000001", {"hpc_job": "4242"}),
    ("GPU-22222222-0000-4000-8000-000000000002", {"hpc_job": "4243"}),
    ("GPU-22222222-0000-4000-8000-000000000003", {"hpc_job": "4243"}),
])


def page_ofu(page: bytes, precision: str = "bf16") -> float:
    """The OFU otel-ofu computes for the page's GPUs (all alike), through the same code, offline."""
    samples = parse_metrics(page.decode(), time_unix_nano=1, window_s=1.0)
    for sample in samples:
        sample.precision = precision
    values = {p.value for p in OfuProcessor(OfuProcessorConfig(), Context("ofu")).process(Batch(samples=samples)).points
              if p.name == "gpu.ofu"}
    assert len(values) == 1
    return values.pop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    server = KubeApiServer(tmp_path_factory.mktemp("kube")).start()
    server.grant(WATCHER_USER, "otel-ofu-pods", PODS_ONLY)
    server.namespace("llm")
    bf16 = {"ofu.dev/precision": "bf16"}
    for pod in ("llama-worker-0", "llama-worker-1"):
        server.create_pod("llm", pod, K8S_NODE, labels={"training.kubeflow.org/job-name": "llama"}, annotations=bf16,
                          owners=[{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "llama",
                                   "uid": "uid-pytorchjob-llama", "controller": True}])
    for pod in ("bert-0-x7k2p", "bert-1-q9m4z"):
        server.create_pod("llm", pod, K8S_NODE, labels={"batch.kubernetes.io/job-name": "bert"}, annotations=bf16,
                          owners=[{"apiVersion": "batch/v1", "kind": "Job", "name": "bert", "uid": "uid-job-bert",
                                   "controller": True}])
    yield server
    server.stop()


@pytest.fixture
def pages():
    with PageServer({"/metrics": K8S_PAGE}) as k8s, PageServer({"/metrics": SLURM_PAGE}) as slurm:
        yield [f"{k8s.url}/metrics", f"{slurm.url}/metrics"]


def events(path: Path, name: str) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        if line.startswith('{"resourceLogs"'):
            try:
                request = otlp.from_json_line(line)
                out += [dict(e.attributes) for e in otlp.events_from_request(request) if e.name == name]
            except ValueError:
                continue  # a line being written
    return out


def test_reported_mfu_twice_the_ofu_is_a_finding_for_that_job_and_honest_jobs_get_none(cluster, pages, tmp_path):
    grpc_port, http_port = free_ports(2)
    out = tmp_path / "out.jsonl"
    config = tmp_path / "otel-ofu.yaml"
    config.write_text(yaml.safe_dump({
        "receivers": {
            "dcgm_exporter": {"endpoints": pages, "collection_interval": "1s", "exporter_collect_interval": "1s"},
            "otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{grpc_port}"},
                                   "http": {"endpoint": f"127.0.0.1:{http_port}"}}},  # decode: its default
        },
        "processors": {
            "attribution": {
                "kubernetes_api": {"enabled": True, "kubeconfig": str(cluster.kubeconfig(WATCHER_TOKEN, WATCHER_USER))},
                "rules": [{"match": {"attributes": {"hpc.job.id": "424?"}}, "precision": "bf16"}]},
            "ofu": {},
            "jobs": {"resolution": "1s", "windows": ["5s"], "default_interval": "1s", "max_gap": "5s",
                     "job_timeout": "60s", "audit": {"window": "5s", "sustain": "3s", "clear_after": "3s"}},
        },
        "exporters": {"file": {"path": str(out)}},
        "service": {"pipelines": {"metrics": {"receivers": ["dcgm_exporter", "otlp"],
                                              "processors": ["attribution", "ofu", "jobs"], "exporters": ["file"]}}},
    }))
    run = Process("otel-ofu", otel_ofu_command(config), tmp_path / "otel-ofu.log", env={"K8S_NODE_NAME": K8S_NODE})
    ofu = page_ofu(K8S_PAGE)
    assert page_ofu(SLURM_PAGE) == ofu and 0.2 < ofu < 0.3
    peak_tflops = specs.find_spec(H100).peak("bf16").flops / 1e12
    ranks: list[Process] = []

    def rank(name: str, env: dict[str, str], *args: str, http: bool = False) -> None:
        endpoint = ["--endpoint", f"http://127.0.0.1:{http_port}", "--protocol", "http/protobuf"] if http else [
            "--endpoint", f"http://127.0.0.1:{grpc_port}"]
        command = [sys.executable, "-m", "tests.training_job", *endpoint, *args]
        ranks.append(Process(name, command, tmp_path / f"{name}.log", env={"OTEL_SERVICE_NAME": "train", **env}))

    def gpu_jobs() -> set[str] | None:
        require_alive(run)
        found = {job_id_of(p) for p in read_points(out) if p.name == "gpu.ofu"}
        wanted = {"k8s:llm/PyTorchJob/llama", "k8s:llm/Job/bert", "4242", "4243"}
        return found if wanted <= found else None

    try:
        # Training starts once its GPUs are allocated: by then otel-ofu names them.
        wait_for("the GPUs' jobs", gpu_jobs, timeout=120, diagnostics=run.tail)
        k8s = {"K8S_NAMESPACE": "llm"}
        rank("llama-rank0", {**k8s, "K8S_POD_NAME": "llama-worker-0"}, "--mfu", f"{2.1 * ofu}")
        rank("llama-rank2", {**k8s, "K8S_POD_NAME": "llama-worker-1"}, "--mfu", f"{1.9 * ofu}")
        rank("bert-rank3", {**k8s, "K8S_POD_NAME": "bert-1-q9m4z"}, "--mfu", f"{ofu}", http=True)  # OTLP/HTTP
        rank("slurm-4242", {"SLURM_JOB_ID": "4242"}, "--tflops-per-gpu", f"{2 * ofu * peak_tflops}")
        rank("slurm-4243", {"SLURM_JOB_ID": "4243"}, "--mfu", f"{ofu}")

        def audited() -> bool:
            require_alive(run, *ranks)
            points = read_points(out)
            reported = {}
            for p in points:
                if p.name == "job.mfu.reported" and dict(p.attributes).get("ofu.window") == "5s":
                    reported[job_id_of(p)] = reported.get(job_id_of(p), 0) + 1
            opened = {e["ofu.job.id"] for e in events(out, "ofu.finding.open")}
            # Honest jobs: audited for well over window + sustain (5 s + 3 s) with their reports in.
            honest = min(reported.get(job, 0) for job in ("k8s:llm/Job/bert", "4243"))
            return {"k8s:llm/PyTorchJob/llama", "4242"} <= opened and honest >= 15

        wait_for("findings for the inflated jobs and a long audit of the honest ones", audited, timeout=180,
                 diagnostics=lambda: "\n".join(p.tail() for p in (run, *ranks)))
    finally:
        # Every process stopped before any exit status is checked: one that will not stop must not
        # leave otel-ofu running after the test.
        stopped = [(process, process.stop()) for process in (*ranks, run)]
    for process, status in stopped:
        assert status == 0, process.tail()

    opened = events(out, "ofu.finding.open")
    assert sorted(e["ofu.job.id"] for e in opened) == ["4242", "k8s:llm/PyTorchJob/llama"]
    for finding in opened:
        assert (finding["ofu.finding.kind"], finding["ofu.finding.cause"]) == ("mfu_gap", "flop_formula_overcount")
        assert finding["ofu.finding.ofu"] == pytest.approx(ofu, rel=1e-6)
    by_job = {f["ofu.job.id"]: f["ofu.finding.mfu_reported"] for f in opened}
    assert by_job["4242"] == pytest.approx(2 * ofu, rel=1e-6)  # TFLOP/s over the H100's BF16 peak
    # llama: the mean of its two ranks (2.1x and 1.9x), each weighted by the time its reports cover
    assert by_job["k8s:llm/PyTorchJob/llama"] == pytest.approx(2 * ofu, rel=0.02)
    log = (tmp_path / "otel-ofu.log").read_text()
    assert "finding (mfu_gap): job k8s:llm/PyTorchJob/llama" in log and "finding (mfu_gap): job 4242" in log
    assert "match no job" not in log  # every report found its job
    honest = {job_id_of(p): p.value for p in read_points(out)
              if p.name == "job.mfu.reported" and dict(p.attributes).get("ofu.window") == "life"}
    assert honest["k8s:llm/Job/bert"] == pytest.approx(ofu, rel=1e-3) and honest["4243"] == pytest.approx(ofu, rel=1e-3)
