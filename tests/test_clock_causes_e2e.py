"""The clock loss by cause end to end (issue 34): a served dcgm-exporter page with pod labels and moving
per-reason throttle counters -> dcgm_exporter receiver -> attribution -> ofu -> jobs -> file exporter.

The page is tests/data/real/dcgm-exporter/4.5.3-4.8.2_h100_ledger-counters.prom (derived: no public page
carries DCGM 1420-1424; its README says how it is shaped after dcgm-exporter's CSV naming), made anew for
each scrape with the clock event counters moved by one step: GPU 0 (a training pod) 3 s at the power cap
and 1 s of software thermal slowdown per scrape, GPU 1 (another pod) 2 s of sync boost. Every window
after the first therefore has exactly those increases, so its clock part splits 3:1 and whole.
"""

from __future__ import annotations

import math
import re
import threading
from pathlib import Path

from otel_ofu.core.model import JOB_ID
from otel_ofu.pipeline import registry
from otel_ofu.pipeline.config import parse_service_config
from otel_ofu.pipeline.service import Service
from tests.e2e_util import PageServer, read_points, wait_for

PAGE = Path(__file__).parent / "data" / "real" / "dcgm-exporter" / "4.5.3-4.8.2_h100_ledger-counters.prom"
S = 10**9
# ns added per scrape, by (GPU index, metric): what each window's increase is
STEP = {("0", "DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP_NS"): 3 * S,
        ("0", "DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN_NS"): 1 * S,
        ("1", "DCGM_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST_NS"): 2 * S}
# GPU 1's pod runs at 1500 MHz on this page (below f_ref: a clock loss to split), not the capture's 1980.
SLOWER = ('DCGM_FI_DEV_SM_CLOCK{gpu="1"', " 1980\n", " 1500\n")


class MovingPage:
    """The page with its clock event counters one step further at every request."""

    def __init__(self) -> None:
        lines = PAGE.read_text().splitlines(keepends=True)
        self.lines = [line.replace(SLOWER[1], SLOWER[2]) if line.startswith(SLOWER[0]) else line for line in lines]
        self.scrapes = 0
        self.lock = threading.Lock()

    def __call__(self) -> bytes:
        with self.lock:
            self.scrapes += 1
            k = self.scrapes
        out = []
        for line in self.lines:
            match = re.match(r'(\w+)\{gpu="(\d)".* (\d+)\n$', line)
            step = STEP.get((match.group(2), match.group(1))) if match else None
            if step is not None:
                line = line[:match.start(3)] + str(int(match.group(3)) + k * step) + "\n"
            out.append(line)
        return "".join(out).encode()


def test_the_clock_causes_add_up_to_the_clock_part_of_gpu_and_job_loss_end_to_end(tmp_path):
    out = tmp_path / "out.jsonl"
    page = MovingPage()
    with PageServer({"/metrics": page}) as node:
        doc = {
            "receivers": {"dcgm_exporter": {"endpoint": f"{node.url}/metrics", "collection_interval": "200ms",
                                            "exporter_collect_interval": "1s"}},
            "processors": {"attribution": {}, "ofu": {},
                           "jobs": {"default_interval": "1s", "resolution": "10s", "windows": ["10s"],
                                    "job_timeout": "1m"}},
            "exporters": {"file": {"path": str(out)}},
            "service": {"pipelines": {"metrics": {"receivers": ["dcgm_exporter"],
                                                  "processors": ["attribution", "ofu", "jobs"],
                                                  "exporters": ["file"]}}},
        }
        service = Service(parse_service_config(doc, "clock-causes.yaml", registry.factories()))
        service.start()
        try:
            def split_job_windows():
                points = read_points(out)
                causes = {dict(p.attributes).get("ofu.loss.cause") for p in points if p.name == "job.ofu.loss"
                          and dict(p.attributes)["ofu.loss.part"] == "clock"}
                return points if {"sw_power_cap", "sw_thermal", "sync_boost"} <= causes else None
            wait_for("job.ofu.loss split by the clock's causes", split_job_windows, timeout=60)
        finally:
            service.shutdown()
    points = read_points(out)

    # Each GPU window: its clock points add up to its clock part (TPA - raw OFU) exactly, split 3:1 on GPU 0.
    by_window: dict[tuple, dict[str, list]] = {}
    for p in points:
        if p.name in ("gpu.ofu.loss", "gpu.ofu.raw", "gpu.tensor.activity"):
            by_window.setdefault((p.resource, p.time_unix_nano), {}).setdefault(p.name, []).append(p)
    split = 0
    for (resource, _), found in by_window.items():
        clock = {dict(p.attributes)["ofu.loss.cause"]: p.value for p in found["gpu.ofu.loss"]
                 if dict(p.attributes)["ofu.loss.part"] == "clock"}
        (tpa,), (raw,) = found["gpu.tensor.activity"], found["gpu.ofu.raw"]
        assert math.fsum(clock.values()) == tpa.value - raw.value, clock
        if len(clock) > 1:
            split += 1
            assert dict(resource)["gpu.index"] == "0" and set(clock) == {"sw_power_cap", "sw_thermal"}
            assert abs(clock["sw_power_cap"] / clock["sw_thermal"] - 3.0) < 1e-9
        elif dict(resource)["gpu.index"] == "1":
            assert set(clock) <= {"sync_boost", "unknown"}  # unknown: its first window (no increase, no bitmask)
        assert dict(resource).get("k8s.pod.name")  # the pod labels came through
    assert split > 0

    # Each job window: its clock causes add up to its clock part (1 - job.ofu - the other parts).
    jobs: dict[tuple, dict[str, float]] = {}
    ofu: dict[tuple, float] = {}
    for p in points:
        if p.name not in ("job.ofu", "job.ofu.loss"):
            continue
        key = (dict(p.resource)[JOB_ID], p.time_unix_nano, dict(p.attributes).get("ofu.window"))
        if p.name == "job.ofu":
            ofu[key] = p.value
        elif p.name == "job.ofu.loss":
            a = dict(p.attributes)
            part = a["ofu.loss.part"] if a["ofu.loss.part"] != "clock" else f"clock/{a.get('ofu.loss.cause')}"
            jobs.setdefault(key, {})[part] = p.value
    both = 0
    for key, parts in jobs.items():
        causes = {part: v for part, v in parts.items() if part.startswith("clock/")}
        others = math.fsum(v for part, v in parts.items() if not part.startswith("clock/"))
        assert abs(math.fsum(causes.values()) - (1.0 - ofu[key] - others)) < 1e-12, (key, parts)
        both += {"clock/sw_power_cap", "clock/sw_thermal"} <= set(causes)
    assert both > 0
