"""Energy per GPU window and per job (issue 34): gpu.energy from the GPU's energy counter (DCGM 156
``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``, mJ since the driver loaded; 1611 in J and NVML's
``nvmlDeviceGetTotalEnergyConsumption`` reach GpuSample.energy_mj in mJ too), power x time only where a
source has no counter, split as a device's time is (MIG slices, a shared GPU's jobs' shares), and the
jobs processor's job.energy, J per useful PFLOP and emissions (docs/method.md#energy-per-job).
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_ofu.core.model import JOB_SHARED, Batch, GpuSample, MetricPoint
from otel_ofu.core.values import DCGM_INT64_BLANK
from otel_ofu.jobs.book import JobBook
from otel_ofu.jobs.config import JobsConfig
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import FieldError, build_config
from otel_ofu.pipeline.telemetry import Telemetry
from otel_ofu.processors.jobs import JobsProcessor
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig

ROOT = Path(__file__).parent.parent
H100 = "NVIDIA H100 80GB HBM3"
T0 = 1_800_000_000
INTERVAL = 10


def sample(step: int, energy_mj: object = None, **kw) -> GpuSample:
    base = dict(time_unix_nano=(T0 + INTERVAL * step) * 10**9, window_s=INTERVAL, host="n0", gpu_index=0,
                uuid="GPU-0", model=H100, tensor_active=0.5, sm_clock_mhz=1830, max_sm_clock_mhz=1980,
                power_w=650.0, job_id="job-a", precision="bf16", energy_mj=energy_mj)
    base.update(kw)
    return GpuSample(**base)


def processor(**cfg) -> OfuProcessor:
    return OfuProcessor(build_config(OfuProcessorConfig, cfg), Context("ofu", Telemetry()))


def energy_points(proc: OfuProcessor, samples: list[GpuSample]) -> list[MetricPoint]:
    return [p for p in proc.process(Batch(samples=samples)).points if p.name == "gpu.energy"]


def energies(proc: OfuProcessor, readings: list[object], **kw) -> list[tuple[float, str] | None]:
    """Each reading's window: (J, ofu.energy.basis) of its one gpu.energy point, or None without one."""
    out = []
    for step, reading in enumerate(readings):
        points = energy_points(proc, [sample(step, reading, **kw)])
        assert len(points) <= 1
        out.append((points[0].value, dict(points[0].attributes)["ofu.energy.basis"]) if points else None)
    return out


# --- the ofu processor: gpu.energy ------------------------------------------------------------------------


def test_a_windows_energy_is_the_counters_increase_in_joules():
    got = energies(processor(), [1_000_000, 1_006_500, 1_013_250])
    assert got == [None, (6.5, "counter"), (6.75, "counter")]  # the first reading has nothing to subtract


@pytest.mark.parametrize("blank", [DCGM_INT64_BLANK, float("nan"), "N/A", -5])
def test_a_blank_counter_gives_no_energy_not_zero_and_the_next_reading_counts_from_the_last_good_one(blank):
    got = energies(processor(), [1_000_000, blank, 1_020_000])
    assert got == [None, None, (20.0, "counter")]


def test_a_counter_reset_counts_from_zero_as_prometheus_does():
    """The driver reloaded (or the GPU was reset): the counter starts again near 0; the window's energy is
    the new reading, never a negative amount."""
    got = energies(processor(), [5_000_000, 5_006_000, 3_000])
    assert got == [None, (6.0, "counter"), (3.0, "counter")]


def test_without_a_counter_energy_is_power_times_the_window_and_says_so():
    got = energies(processor(), [None, None, None], power_w=400.0)
    assert got == [None, (4000.0, "power_x_time"), (4000.0, "power_x_time")]
    assert energies(processor(energy={"power_x_time": False}), [None, None], power_w=400.0) == [None, None]


def test_power_times_time_stops_at_max_power_gap_and_a_blank_power_gives_none():
    proc = processor(energy={"max_power_gap": "15s"})
    readings = [energy_points(proc, [sample(step, None, power_w=power)]) for step, power in
                ((0, 300.0), (1, 300.0), (3, 300.0), (4, float("nan")), (5, 300.0))]
    assert [[p.value for p in points] for points in readings] == [[], [3000.0], [], [], [3000.0]]


def test_a_gpu_without_a_counter_or_power_has_no_gpu_energy():
    assert energies(processor(), [None, None], power_w=None) == [None, None]


def test_a_window_without_ofu_still_has_its_energy():
    """A blank TPA gives no gpu.ofu (gpu.ofu.dropped), but the GPU used energy in that window."""
    proc = processor()
    energy_points(proc, [sample(0, 1_000_000)])
    out = proc.process(Batch(samples=[sample(1, 1_009_000, tensor_active=None)])).points
    assert {p.name for p in out} >= {"gpu.ofu.dropped", "gpu.energy"} and "gpu.ofu" not in {p.name for p in out}
    assert [p.value for p in out if p.name == "gpu.energy"] == [9.0]


def test_mig_instances_take_their_slices_share_of_the_devices_energy():
    """The counter is the whole device's (every instance's sample carries it): each instance gets its slices'
    share of one increase (gpu.mig.share: 3/7, 4/7 of an H100); an instance of unknown size gets none."""
    proc = processor()
    instances = [{"gpu.mig.instance_id": "1", "gpu.mig.profile": "3g.40gb"},
                 {"gpu.mig.instance_id": "2", "gpu.mig.profile": "4g.40gb"},
                 {"gpu.mig.instance_id": "9"}]
    energy_points(proc, [sample(0, 1_000_000, resource=r) for r in instances])
    points = energy_points(proc, [sample(1, 1_007_000, resource=r) for r in instances])
    by_instance = {dict(p.resource)["gpu.mig.instance_id"]: p.value for p in points}
    assert by_instance == pytest.approx({"1": 3.0, "2": 4.0})


def test_a_devices_last_reading_is_forgotten_after_forget_after():
    proc = processor(energy={"forget_after": "1h"})
    other = dict(uuid="GPU-1", gpu_index=1)
    assert energies(proc, [1_000_000]) == [None]
    energy_points(proc, [sample(400, 1_000, **other)])  # data time moves on 4000 s: GPU-0 left
    assert energy_points(proc, [sample(401, 1_500_000)]) == []  # a first reading again, not 500 J


def test_samples_made_from_another_otel_ofus_points_get_no_second_energy():
    """recompute: the arriving gpu.energy passes on; none is worked out again from the re-emitted power."""
    node = processor()
    first = node.process(Batch(samples=[sample(0, 1_000_000)])).points
    second = node.process(Batch(samples=[sample(1, 1_009_000)])).points
    stage = processor(recompute=True)
    stage.process(Batch(points=first))
    out = stage.process(Batch(points=second)).points
    assert [(p.value, dict(p.attributes)["ofu.energy.basis"]) for p in out if p.name == "gpu.energy"] == [
        (9.0, "counter")]


@settings(max_examples=300, deadline=None)
@given(raw=st.one_of(st.integers(-10, 2**64), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                     st.none(), st.sampled_from([DCGM_INT64_BLANK, DCGM_INT64_BLANK + 2, 2**31, 0x7FFFFFF0 + 1,
                                                 140737488355328.0, "48127770113", "N/A", " 12 ", "x"])),
       field_type=st.sampled_from(["int64", "int32", "fp64"]))
def test_the_counters_quick_reading_is_the_blank_rules(raw, field_type):
    """CounterTracker reads an ordinary number at once, and anything else through core.values.clean: the same."""
    from otel_ofu.core.counters import CounterTracker
    from otel_ofu.core.values import clean

    got = CounterTracker(field_type).reading(raw)
    want = clean(raw, field_type)[0]
    assert (got is None) == (want is None)
    if got is not None:
        assert got == want and type(got) is type(want)


# --- a shared GPU: the jobs' energies add up to the device's ----------------------------------------------


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.tuples(st.integers(0, 5_000_000), st.lists(st.integers(1, 100), max_size=4)),
                      min_size=2, max_size=8),
       mig=st.booleans())
def test_the_jobs_shares_of_a_devices_energy_add_up_to_it(steps, mig):
    """steps[k] = (the counter's increase in mJ, the uses of the jobs sharing the device, [] for one job).
    Each window's gpu.energy points of the device add up to its counter's increase x the instance's share
    (1e-9); through the jobs processor, each job's job.energy is its shares of them and the jobs' and no job's
    together are all of it."""
    proc = processor()
    resource = {"gpu.mig.instance_id": "1", "gpu.mig.profile": "7g.80gb"} if mig else {}
    reading = 10**9
    points: list[MetricPoint] = []
    want: dict[str, float] = defaultdict(float)
    device_total = 0.0
    for step, (increase, uses) in enumerate(steps):
        reading += increase
        if uses:
            shares = [u / sum(uses) for u in uses]
            shares[-1] = 1.0 - math.fsum(shares[:-1])
            samples = [sample(step, reading, job_id=f"job-{k}", share=share, share_basis="sm_util",
                              resource={**resource, JOB_SHARED: True}) for k, share in enumerate(shares)]
        else:
            shares = [1.0]
            samples = [sample(step, reading, job_id="job-0", resource=resource)]
        out = proc.process(Batch(samples=samples)).points
        points += out
        window = [p.value for p in out if p.name == "gpu.energy"]
        if step == 0:
            assert window == []
            continue
        device_total += increase / 1000
        assert math.fsum(window) == pytest.approx(increase / 1000, rel=1e-9, abs=1e-12)
        for k, share in enumerate(shares):
            want[f"job-{k}"] += increase / 1000 * share
    book = JobBook(build_config(JobsConfig, {"default_interval": f"{INTERVAL}s"}))
    for t in sorted({p.time_unix_nano for p in points}):
        book.observe([p for p in points if p.time_unix_nano == t])
    got = {s.job_id: s.totals.energy or 0.0 for s in book.close_all().ended}
    assert {job: got.get(job, 0.0) for job in want} == pytest.approx(dict(want), rel=1e-9, abs=1e-9)
    fleet = book.fleet_energy.by_use()
    assert fleet["jobs"] + fleet["unallocated"] == pytest.approx(device_total, rel=1e-9, abs=1e-9)


# --- the jobs processor: job.energy, J per useful PFLOP, emissions -----------------------------------------


def jobs_processor(**cfg) -> JobsProcessor:
    config = build_config(JobsConfig, {"resolution": "1m", "default_interval": f"{INTERVAL}s", **cfg})
    return JobsProcessor(config, Context("jobs", Telemetry()), clock=lambda: T0 + 10_000)


def run(cfg: dict, readings: list[object], **kw) -> tuple[list[MetricPoint], list]:
    ofu = processor()
    jobs = jobs_processor(**cfg)
    points, events = [], []
    for step, reading in enumerate(readings):
        out = jobs.process(ofu.process(Batch(samples=[sample(step, reading, **kw)])))
        points += out.points
        events += out.events
    final = jobs.flush()
    if final is not None:
        points += final.points
        events += final.events
    return points, events


def latest(points: list[MetricPoint], name: str, **attributes) -> MetricPoint:
    found = [p for p in points if p.name == name and all(dict(p.attributes).get(k) == v for k, v in
                                                         attributes.items())]
    assert found, name
    return max(found, key=lambda p: p.time_unix_nano)


def test_job_energy_is_the_counters_increase_with_j_per_useful_pflop_and_emissions():
    """13 windows of 10 s: the counter moves 6.5 kJ each (650 W); the job's energy is the increase over the
    windows after the first, its FLOPs are OFU x the H100's dense BF16 peak over the same windows."""
    readings = [10**9 + 6_500_000 * k for k in range(13)]
    points, events = run({"carbon": {"grams_per_kwh": 400}}, readings)
    energy = latest(points, "job.energy")
    assert energy.monotonic and energy.unit == "J"
    joules = 12 * 6500.0
    assert energy.value == pytest.approx(joules, rel=1e-12)
    flop_per_window = [p.value for p in points if p.name == "gpu.flops.achieved"][0] * INTERVAL
    per_pflop = latest(points, "job.energy.per_useful_pflop")
    assert per_pflop.value == pytest.approx(6500.0 / (flop_per_window / 1e15), rel=1e-9)
    grams = latest(points, "job.emissions")
    assert grams.monotonic and grams.value == pytest.approx(joules / 3.6e6 * 400, rel=1e-12)
    fleet = latest(points, "fleet.energy", **{"ofu.energy.use": "jobs"})
    assert fleet.monotonic and fleet.value == pytest.approx(joules, rel=1e-12)
    assert latest(points, "fleet.energy", **{"ofu.energy.use": "unallocated"}).value == 0.0
    end = next(e for e in events if e.name == "ofu.job.end")
    assert dict(end.attributes)["ofu.job.energy"] == pytest.approx(joules, rel=1e-12)


def test_no_counter_and_no_power_gives_no_job_energy_not_zero():
    points, _ = run({"carbon": {"grams_per_kwh": 400}}, [None] * 13, power_w=None)
    assert not {"job.energy", "job.energy.per_useful_pflop", "job.emissions", "fleet.energy"} & {
        p.name for p in points}
    assert any(p.name == "job.gpu_seconds" for p in points)


def test_without_carbon_intensity_there_are_no_emissions():
    points, _ = run({}, [10**9 + 6_500_000 * k for k in range(13)])
    assert any(p.name == "job.energy" for p in points)
    assert not any(p.name == "job.emissions" for p in points)


def test_no_jobs_gpus_energy_is_the_fleets_unallocated_energy():
    points, _ = run({}, [10**9 + 1_000_000 * k for k in range(13)], job_id="none")
    assert not any(p.name == "job.energy" for p in points)
    assert latest(points, "fleet.energy", **{"ofu.energy.use": "unallocated"}).value == pytest.approx(12_000.0)


def test_a_window_spanning_bins_splits_its_energy_as_its_time():
    """Life values stamped at a bin's end count the job up to that end: a window across two bins gives each
    its part of the window's energy; the job's energy at its end is all of it, exactly as summed."""
    book = JobBook(build_config(JobsConfig, {"resolution": "1m", "default_interval": "40s"}))
    resource = (("hw.id", "G"), ("ofu.job.id", "j"))
    seen = []
    for k, end in enumerate((40, 80, 120)):  # windows [0, 40], [40, 80], [80, 120] after T0 (a multiple of 60)
        t = (T0 + end) * 10**9
        book.observe([MetricPoint("gpu.ofu", 0.5, t, resource),
                      MetricPoint("gpu.energy", 1000.0 * (k + 1), t, resource, (), "J")])
        tracker = book.jobs["j"]
        seen.append((tracker.closed_totals.energy, tracker.totals.energy))
    # The bin ending at 60 closes with the second window (2000 J), half of which is in it.
    assert seen == [(None, 1000.0), (2000.0, 3000.0), (6000.0, 6000.0)]


def test_a_bad_energy_point_is_skipped_and_its_window_counts_without_energy():
    book = JobBook(build_config(JobsConfig, {}))
    resource = (("hw.id", "G"), ("ofu.job.id", "j"))
    update = book.observe([MetricPoint("gpu.ofu", 0.5, T0 * 10**9, resource),
                           MetricPoint("gpu.energy", -3.0, T0 * 10**9, resource, (), "J")])
    assert update.skipped == {"bad_energy": 1}
    assert book.jobs["j"].totals.gpu_seconds > 0 and book.jobs["j"].totals.energy is None


def test_the_journal_keeps_energy_across_a_restart(tmp_path):
    """gpu.energy is one of the jobs processor's inputs: journaled, replayed after a restart, decoded by a
    jobs tier's otlp receiver and forwarded by the gateway (tests/test_fleet_configs.py checks the lists)."""
    readings = [10**9 + 6_500_000 * k for k in range(13)]
    ofu = processor()
    batches = [ofu.process(Batch(samples=[sample(step, reading)])) for step, reading in enumerate(readings)]
    first = jobs_processor(storage=str(tmp_path))
    first.start()
    for batch in batches[:7]:
        first.process(batch)
        first.exported()
    first.state.close()  # a crash: no checkpoint at shutdown
    again = jobs_processor(storage=str(tmp_path))
    again.start()
    points = []
    for batch in batches[7:]:
        points += again.process(batch).points
        again.exported()
    again.shutdown()
    assert "gpu.energy" in again.inputs
    assert latest(points, "job.energy").value == pytest.approx(12 * 6500.0, rel=1e-12)


def test_carbon_intensity_is_checked():
    with pytest.raises(FieldError, match="grams_per_kwh"):
        build_config(JobsConfig, {"carbon": {"grams_per_kwh": -1}})


def test_energy_settings_are_checked():
    with pytest.raises(FieldError, match="max_power_gap"):
        build_config(OfuProcessorConfig, {"energy": {"max_power_gap": "0s"}})


def test_gpu_energy_travels_on_the_wire_as_a_joule_gauge():
    """The jobs tier gets gpu points over OTLP: a gpu.energy point comes back from the codec as it left."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    from otel_ofu.otlp.codec import encode_request, from_request

    proc = processor()
    proc.process(Batch(samples=[sample(0, 1_000_000)]))
    out = proc.process(Batch(samples=[sample(1, 1_004_000)]))
    [energy] = [p for p in out.points if p.name == "gpu.energy"]
    request = ExportMetricsServiceRequest.FromString(encode_request(out.points_and_rows()))
    back = [p for p in from_request(request) if p.name == "gpu.energy"]
    assert [dataclasses.replace(p, start_time_unix_nano=0) for p in back] == [energy]


# --- the report -------------------------------------------------------------------------------------------


def record_energy(path, readings: list[object], **kw) -> None:
    """A recording of the ofu processor's points (the file exporter's JSON lines), one GPU of job-a."""
    from otel_ofu.exporters.file import FileExporter, FileExporterConfig

    ofu = processor()
    exporter = FileExporter(FileExporterConfig(path=str(path)), Context("file"))
    exporter.start()
    for step, reading in enumerate(readings):
        exporter.export(ofu.process(Batch(samples=[sample(step, reading, **kw)])))
    exporter.shutdown()


def test_the_report_gives_each_jobs_energy_and_j_per_useful_pflop(tmp_path, capsys):
    import csv
    import json

    from otel_ofu.cli.main import main

    path = tmp_path / "energy.jsonl"
    record_energy(path, [10**9 + 6_500_000 * k for k in range(31)])
    doc = yaml.safe_load((ROOT / "collector-config" / "demo.yaml").read_text())
    doc["processors"]["jobs"].update(default_interval="10s", carbon={"grams_per_kwh": 400})
    config = tmp_path / "jobs.yaml"
    config.write_text(yaml.safe_dump(doc))
    assert main(["report", str(path), "--json", "--config", str(config)]) == 0
    data = json.loads(capsys.readouterr().out)
    (job,) = data["jobs"]
    assert job["energy_joules"] == pytest.approx(30 * 6500.0)
    flop_per_window = job["flops"] / 31
    assert job["joules_per_useful_pflop"] == pytest.approx(6500.0 / (flop_per_window / 1e15), rel=1e-9)
    assert job["emissions_grams"] == pytest.approx(30 * 6500.0 / 3.6e6 * 400)
    assert data["fleet"]["energy_joules"] == pytest.approx(30 * 6500.0)
    assert data["fleet"]["unattributed_energy_joules"] == 0.0
    assert main(["report", str(path)]) == 0
    header = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("job "))
    assert "energy kWh" in header and "J/PFLOP" in header
    out = tmp_path / "jobs.csv"
    assert main(["report", str(path), "--csv", str(out)]) == 0
    (row,) = csv.DictReader(out.open())
    assert float(row["energy_joules"]) == pytest.approx(30 * 6500.0) and row["emissions_grams"] == ""


def test_the_report_without_energy_keeps_its_columns(tmp_path, capsys):
    from otel_ofu.cli.main import main
    from otel_ofu.report.build import TABLE_COLUMNS

    path = tmp_path / "no-energy.jsonl"
    record_energy(path, [None] * 31, power_w=None)
    assert main(["report", str(path)]) == 0
    header = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("job "))
    assert header.split() == " ".join(TABLE_COLUMNS).split()


# --- the console ------------------------------------------------------------------------------------------


def test_the_console_shows_a_jobs_energy_where_the_jobs_processor_sends_it():
    from otel_ofu.console import render
    from otel_ofu.console.state import FleetState

    with_energy, _ = run({}, [10**9 + 6_500_000 * k for k in range(13)])
    without, _ = run({}, [None] * 13, power_w=None)
    lines = {}
    for name, points in (("with", with_energy), ("without", without)):
        state = FleetState()
        state.update(Batch(points=points))
        (job,) = state.view().jobs
        lines[name] = next(line for line in render.plain_lines(state.view()) if line.startswith("  job job-a"))
        if name == "with":
            assert job.energy == latest(points, "job.energy").value
    per_pflop = latest(with_energy, "job.energy.per_useful_pflop").value
    kwh = latest(with_energy, "job.energy").value / 3.6e6
    assert lines["with"].endswith(f", energy {kwh:.2f} kWh ({per_pflop:,.0f} J/useful PFLOP)")
    assert "energy" not in lines["without"]
