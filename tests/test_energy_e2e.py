"""Energy per job end to end (issue 34): a served dcgm-exporter page whose energy counter moves, pod labels
naming the jobs, through the dcgm_exporter receiver (real HTTP), attribution, the ofu processor, the OTLP
wire as a jobs tier decodes it, and the jobs processor: job.energy matches the counter's increase, a reset
counts from 0, and a shared GPU's jobs' energies add up to its own."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import yaml

from otel_ofu.core.model import Batch, MetricPoint
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import build_config
from otel_ofu.pipeline.telemetry import Telemetry
from tests.test_energy import ROOT, T0, jobs_processor, latest, processor

# --- end to end: a served dcgm-exporter page with a moving energy counter ---------------------------------

# dcgm-exporter --kubernetes-virtual-gpus, per-process metrics (tests/data/real/README.md: derived from its
# kubernetes.go and process_metrics.go): GPU 0 two pods share (72:24 by their own SM use), GPU 1 one pod's,
# GPU 2 nobody's.
VIRTUAL_GPUS = Path(__file__).parent / "data" / "real" / "dcgm-exporter" / "4.5.3-4.8.2_h100_virtual-gpus.prom"
SCRAPE_S = 30
# mJ each GPU's counter moves per scrape: its page's power x 30 s (612.4 W, 608.125 W, 71.25 W).
MOVES = {"0": 18_372_000, "1": 18_243_750, "2": 2_137_500}
BOOT_MJ = 48_127_770_113  # a counter's reading after some days of uptime (tests/data/real: the A100 MIG page)


def page_with_energy(step: int, reset_gpu1_at: int) -> bytes:
    """The page with DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION as dcgm-exporter's default-counters.csv declares it
    (``counter``, "Total energy consumption since boot (in mJ)."), one row per row of the page's power gauge
    (the same labels: a pod's copy carries the device's value), at ``step``; GPU 1's driver reloaded at
    ``reset_gpu1_at`` (its counter starts again from a small reading)."""
    text = VIRTUAL_GPUS.read_text()
    rows = ["# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).",
            "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter"]
    for line in text.splitlines():
        if line.startswith("DCGM_FI_DEV_POWER_USAGE{"):
            labels = line[len("DCGM_FI_DEV_POWER_USAGE"):line.rindex("}") + 1]
            gpu = labels.split('gpu="', 1)[1].split('"', 1)[0]
            reading = energy_reading(gpu, step, reset_gpu1_at)
            rows.append(f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{labels} {reading}")
    return (text.rstrip("\n") + "\n" + "\n".join(rows) + "\n").encode()


def energy_reading(gpu: str, step: int, reset_gpu1_at: int) -> int:
    if gpu == "1" and step >= reset_gpu1_at:
        return 5_000 + MOVES[gpu] * (step - reset_gpu1_at)
    return BOOT_MJ + MOVES[gpu] * step


def test_job_energy_from_a_served_dcgm_exporter_page_matches_the_counter_and_a_shared_gpus_shares_add_up():
    """Scraped over HTTP by the dcgm_exporter receiver, attributed by the page's pod labels, through the ofu
    processor, sent as OTLP and decoded as the jobs tier decodes it (collector-config/fleet-jobs.yaml), into
    the jobs processor: each job's job.energy is its GPU's counter increase over the scrapes (a reset counted
    from 0), the shared GPU's two jobs' energies add up to its counter's increase (split 75:25 as its time),
    and the idle GPU's is the fleet's unallocated energy."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    from otel_ofu.otlp import join as otlp_join
    from otel_ofu.otlp.codec import encode_request
    from otel_ofu.processors.attribution import AttributionProcessor, AttributionProcessorConfig
    from otel_ofu.receivers.dcgm_exporter import DcgmExporterReceiver, DcgmExporterReceiverConfig
    from tests.e2e_util import PageServer

    decode = frozenset(yaml.safe_load((ROOT / "collector-config" / "fleet-jobs.yaml").read_text())
                       ["receivers"]["otlp"]["decode"])
    steps, reset_at = 12, 7
    attribution = AttributionProcessor(build_config(AttributionProcessorConfig, {}),
                                       Context("attribution", Telemetry()))
    ofu = processor()
    jobs = jobs_processor(default_interval=f"{SCRAPE_S}s", carbon={"grams_per_kwh": 350})
    out: list[MetricPoint] = []
    events = []
    with PageServer({"/metrics": page_with_energy(0, reset_at)}) as server:
        config = build_config(DcgmExporterReceiverConfig, {"endpoint": f"{server.url}/metrics"})
        receiver = DcgmExporterReceiver(config, Context("dcgm_exporter", Telemetry()), lambda batch: None)
        try:
            for step in range(steps):
                server.set("/metrics", page_with_energy(step, reset_at))
                scraped = receiver.poll().samples
                assert {s.energy_mj for s in scraped if s.gpu_index == 0} == {energy_reading("0", step, reset_at)}
                # The data time is ours (the receiver stamps the scrape's): one scrape every 30 s.
                samples = [dataclasses.replace(s, time_unix_nano=(T0 + SCRAPE_S * step) * 10**9, precision="bf16")
                           for s in scraped]
                wire = encode_request(ofu.process(attribution.process(Batch(samples=samples)))
                                           .points_and_rows())
                found = otlp_join.split(ExportMetricsServiceRequest.FromString(wire), wire=wire, decode=decode,
                                        passthrough=False)
                result = jobs.process(Batch(points=found.points))
                out += result.points
                events += result.events
        finally:
            receiver.shutdown()
    final = jobs.flush()
    out += final.points
    events += final.events
    ended = {dict(e.attributes)["ofu.job.id"]: dict(e.attributes) for e in events if e.name == "ofu.job.end"}
    shared = ("k8s:nlp/Pod/bert-ft-0", "k8s:serving/Pod/embed-api-5d8f7c6b9-q2w4e")
    alone = "k8s:nlp/Pod/bert-ft-1"
    gpu0 = (steps - 1) * MOVES["0"] / 1000
    # GPU 1: its moves up to the reset, the reset's reading counted from 0 (not a fall of 48 MJ), its moves after.
    gpu1 = ((reset_at - 1) * MOVES["1"] + energy_reading("1", reset_at, reset_at)
            + (steps - 1 - reset_at) * MOVES["1"]) / 1000
    assert ended[alone]["ofu.job.energy"] == pytest.approx(gpu1, rel=1e-12)
    assert [ended[job]["ofu.job.energy"] for job in shared] == pytest.approx([0.75 * gpu0, 0.25 * gpu0], rel=1e-12)
    assert math.fsum(ended[job]["ofu.job.energy"] for job in shared) == pytest.approx(gpu0, rel=1e-12)
    # The job's series say the same up to each bin's end: job.energy (J), and its emissions at 350 g/kWh.
    series = [p for p in out if dict(p.resource).get("ofu.job.id") == alone]
    moves = {k: (energy_reading("1", k, reset_at) - energy_reading("1", k - 1, reset_at)
                 if k != reset_at else energy_reading("1", k, reset_at)) / 1000 for k in range(1, steps)}
    for name, factor in (("job.energy", 1.0), ("job.emissions", 350 / 3.6e6)):
        points = [p for p in series if p.name == name]
        assert len(points) >= steps * SCRAPE_S // 60 - 1
        for point in points:
            upto = math.fsum(j for k, j in moves.items() if (T0 + SCRAPE_S * k) * 10**9 <= point.time_unix_nano)
            assert point.value == pytest.approx(upto * factor, rel=1e-12)
    idle = (steps - 1) * MOVES["2"] / 1000
    assert jobs.book.fleet_energy.by_use()["unallocated"] == pytest.approx(idle, rel=1e-12)
    # fleet.energy goes out once a bin: its latest value counts the idle GPU's windows up to that bin's.
    served = latest(out, "fleet.energy", **{"ofu.energy.use": "unallocated"}).value
    assert served / (MOVES["2"] / 1000) == pytest.approx(round(served / (MOVES["2"] / 1000)), abs=1e-9)
    assert 0 < served <= idle
