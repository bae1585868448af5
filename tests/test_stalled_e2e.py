"""The stalled finding end to end: a served dcgm-exporter page -> dcgm_exporter receiver -> attribution
(the page's pod labels) -> ofu -> jobs -> file exporter, read back as OTLP JSON.

The page is a real dcgm-exporter 4.x capture with pod labels (tests/data/real/README.md:
4.5.3-4.8.2_h100_kubernetes.prom): GPU 0 in pod llama3-70b-worker-0, GPU 2 moved to a pod of its own
(an input-bound job: engine busy a third of the time, tensor pipes at 0.18), GPU 1 idle; with PCIe and
NVLink traffic lines added as the derived ledger page writes them (4.5.3-4.8.2_h100_ledger-counters.prom:
DCGM_FI_PROF_PCIE_TX_BYTES/_RX_BYTES, DCGM_FI_PROF_NVLINK_TX_BYTES/_RX_BYTES, bytes per second, its
training and input-bound pods' values). Its energy counter moves at every scrape. GPU 0 works, then
hangs as an NCCL deadlock does (GR stays 0.9987, DCGM_FI_DEV_GPU_UTIL stays 100, tensor pipes, DRAM
and NVLink drop to ~0, PCIe to the 1-2 MB/s of housekeeping), then works again. The jobs processor
runs with one-second bins and stall.after 3s, so the test waits seconds, not minutes.
"""

from __future__ import annotations

import re
from pathlib import Path

from otel_ofu.otlp import codec as otlp
from otel_ofu.pipeline import registry
from otel_ofu.pipeline.config import parse_service_config
from otel_ofu.pipeline.service import Service
from tests.e2e_util import PageServer, read_points, wait_for

ROOT = Path(__file__).resolve().parent.parent
K8S_PAGE = ROOT / "tests" / "data" / "real" / "dcgm-exporter" / "4.5.3-4.8.2_h100_kubernetes.prom"
INPUT_POD = "vit-input-bound-0"
WORKING = {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.998713, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.587012,
           "DCGM_FI_PROF_DRAM_ACTIVE": 0.402118, "DCGM_FI_PROF_PCIE_TX_BYTES": 1048576,
           "DCGM_FI_PROF_PCIE_RX_BYTES": 73400320, "DCGM_FI_PROF_NVLINK_TX_BYTES": 98765432109,
           "DCGM_FI_PROF_NVLINK_RX_BYTES": 97531086420}
HUNG = {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.998713, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.0,
        "DCGM_FI_PROF_DRAM_ACTIVE": 0.004, "DCGM_FI_PROF_PCIE_TX_BYTES": 1048576, "DCGM_FI_PROF_PCIE_RX_BYTES": 524288,
        "DCGM_FI_PROF_NVLINK_TX_BYTES": 0, "DCGM_FI_PROF_NVLINK_RX_BYTES": 0}
INPUT_BOUND = {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.35, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.18,
               "DCGM_FI_PROF_DRAM_ACTIVE": 0.12, "DCGM_FI_PROF_PCIE_TX_BYTES": 123456789,
               "DCGM_FI_PROF_PCIE_RX_BYTES": 9876543210, "DCGM_FI_PROF_NVLINK_TX_BYTES": 0,
               "DCGM_FI_PROF_NVLINK_RX_BYTES": 0}
IDLE = {"DCGM_FI_PROF_PCIE_TX_BYTES": 0, "DCGM_FI_PROF_PCIE_RX_BYTES": 0, "DCGM_FI_PROF_NVLINK_TX_BYTES": 0,
        "DCGM_FI_PROF_NVLINK_RX_BYTES": 0}
LINK_FIELDS = ("DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES", "DCGM_FI_PROF_NVLINK_TX_BYTES",
               "DCGM_FI_PROF_NVLINK_RX_BYTES")
_LINE = re.compile(r'^(?P<name>\w+)\{(?P<labels>[^}]*)\} (?P<value>\S+)$')


class MovingPage:
    """The capture with GPU 0's and GPU 2's readings set, and the energy counters moving at every render."""

    def __init__(self, server: PageServer):
        self.server = server
        self.lines = K8S_PAGE.read_text().splitlines()
        self.gpu0 = WORKING
        self.renders = 0

    def render(self) -> bytes:
        self.renders += 1
        out = []
        gpu_labels: dict[str, str] = {}
        for line in self.lines:
            match = _LINE.match(line)
            if match is None:
                out.append(line)
                continue
            name, labels, value = match["name"], match["labels"], match["value"]
            gpu = re.search(r'\bgpu="(\d+)"', labels)[1]
            if gpu == "2":
                labels = labels.replace('pod="llama3-70b-worker-0"', f'pod="{INPUT_POD}"')
            gpu_labels[gpu] = labels
            readings = self.readings(gpu)
            if name in readings:
                value = f"{readings[name]:.6f}"
            elif name == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION":  # mJ since the driver loaded: 600 W x 0.25 s
                value = str(int(value) + self.renders * 150_000)
            out.append(f"{name}{{{labels}}} {value}")
        for name in LINK_FIELDS:  # gauges in bytes per second, printed as ints (%d) as the ledger page has them
            out += [f"# HELP {name} The rate of data transmitted / received over the link, in bytes per second.",
                    f"# TYPE {name} gauge"]
            out += [f"{name}{{{labels}}} {int(self.readings(gpu)[name])}" for gpu, labels in gpu_labels.items()]
        return ("\n".join(out) + "\n").encode()

    def readings(self, gpu: str) -> dict[str, float]:
        return {"0": self.gpu0, "2": INPUT_BOUND}.get(gpu, IDLE)

    def advance(self) -> None:
        self.server.set("/metrics", self.render())


def read_events(path: Path) -> list:
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        if line.startswith('{"resourceLogs"'):
            try:
                events += otlp.events_from_request(otlp.from_json_line(line))
            except ValueError:
                continue  # a line being written
    return events


def stalled(events: list, name: str) -> list[dict]:
    return [dict(e.attributes) for e in events
            if e.name == name and dict(e.attributes).get("ofu.finding.kind") == "stalled"]


def test_a_hung_pod_is_found_stalled_and_an_input_bound_pod_is_not(tmp_path):
    out = tmp_path / "out.jsonl"
    with PageServer({"/metrics": b""}) as node:
        page = MovingPage(node)
        page.advance()
        doc = {
            "receivers": {"dcgm_exporter": {"endpoint": f"{node.url}/metrics", "collection_interval": "250ms",
                                            "exporter_collect_interval": "250ms"}},
            "processors": {"attribution": {}, "ofu": {},
                           "jobs": {"resolution": "1s", "windows": ["5s"], "default_interval": "250ms",
                                    "job_timeout": "30s", "silence_timeout": "60s", "stall": {"after": "3s"}}},
            "exporters": {"file": {"path": str(out)}},
            "service": {"pipelines": {"metrics": {"receivers": ["dcgm_exporter"],
                                                  "processors": ["attribution", "ofu", "jobs"],
                                                  "exporters": ["file"]}}},
        }
        service = Service(parse_service_config(doc, "stalled.yaml", registry.factories()))
        service.start()
        try:
            def started(pods: tuple[str, ...]):
                page.advance()
                jobs = [dict(e.attributes)["ofu.job.id"] for e in read_events(out) if e.name == "ofu.job.start"]
                return jobs if all(any(p in j for j in jobs) for p in pods) else None

            jobs = wait_for("both pods' jobs to start", lambda: started(("llama3-70b-worker-0", INPUT_POD)), 60)
            page.gpu0 = HUNG
            opened = wait_for("the hung pod's stalled finding", lambda: (page.advance(), stalled(
                read_events(out), "ofu.finding.open"))[1], 60)
            page.gpu0 = WORKING
            closed = wait_for("the stalled finding to clear", lambda: (page.advance(), stalled(
                read_events(out), "ofu.finding.close"))[1], 60)
        finally:
            service.shutdown()
    [hung] = [j for j in jobs if "llama3-70b-worker-0" in j]
    assert [f["ofu.job.id"] for f in opened] == [hung]  # the input-bound pod, running all along, is not stalled
    assert opened[0]["ofu.finding.cause"] == "engine_busy_no_work"
    # NVLink and PCIe idle too, not only the activity counters
    assert opened[0]["ofu.finding.evidence"] == "links"
    assert closed[0]["ofu.finding.reason"] == "work_resumed" and closed[0]["ofu.finding.stalled_gpu_hours"] > 0
    events = read_events(out)
    assert not any(INPUT_POD in f["ofu.job.id"] for f in stalled(events, "ofu.finding.open"))
    points = read_points(out)
    held = [p.value for p in points if p.name == "job.stalled_gpu_hours" and dict(p.resource)["ofu.job.id"] == hung]
    assert held and max(held) > 0
