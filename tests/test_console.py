"""The console's state and rendering: keys, missing values, staleness, findings, truncation, colour."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from otel_ofu.console import render
from otel_ofu.console.state import STALE, FleetState
from otel_ofu.core.model import Batch, Event, MetricPoint, attrs
from otel_ofu.exporters.console import ConsoleExporter, ConsoleExporterConfig
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.telemetry import STARTING, Telemetry

ANSI = re.compile(r"\x1b\[")
COLOUR = re.compile(r"\x1b\[[0-9;]*?(?:3[0-7]|9[0-7]|38;[25])[;m]")  # a foreground colour, any form
S = 1_000_000_000
T0 = 1_790_000_000 * S


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def gpu_resource(host="node-a", index="0", uuid="GPU-a", mig=None, model="NVIDIA H100 80GB HBM3"):
    return attrs({"host.name": host, "gpu.index": index, "hw.id": uuid, "hw.model": model,
                  "gpu.mig.instance_id": mig})


def ofu_points(resource, t, ofu, job="train", precision="bf16", tpa=None, clock_mhz=1830.0):
    """A GPU window's points as the ofu processor emits them: job and precision on the resource."""
    resource = attrs({**dict(resource), "ofu.job.id": job, "ofu.precision": precision})
    a = attrs({"ofu.fref.source": "spec"})
    return [MetricPoint("gpu.ofu", ofu, t, resource, a), MetricPoint("gpu.ofu.raw", ofu * 1.02, t, resource, a),
            MetricPoint("gpu.ofu.reference_clock", 1830e6, t, resource, a, "Hz"),
            MetricPoint("gpu.tensor.activity", tpa if tpa is not None else ofu, t, resource, a),
            MetricPoint("gpu.sm.clock.frequency", clock_mhz * 1e6, t, resource, a, "Hz")]


def dropped(resource, t, reason):
    return MetricPoint("gpu.ofu.dropped", 1, t, resource, attrs({"ofu.drop.reason": reason}), "{window}", True)


def finding_event(name, job, t, **numbers):
    a = {"ofu.job.id": job, "ofu.finding.id": f"{job}/{numbers.pop('kind')}/1", **numbers}
    a["ofu.finding.kind"] = a["ofu.finding.id"].split("/")[1]
    return Event(name, t, attrs({"ofu.job.id": job}), attrs(a))


def test_gpus_without_uuid_and_mig_instances_are_rows_of_their_own():
    state = FleetState()
    points = []
    for host in ("dmon-1", "dmon-2"):  # dmon replays: no UUID, the index is the identity
        for index in range(4):
            points += ofu_points(gpu_resource(host, str(index), uuid=""), T0, 0.3)
    for mig in ("1", "2"):  # two MIG instances share their parent's UUID and index
        points += ofu_points(gpu_resource("hgx", "0", "GPU-b200", mig=mig, model="NVIDIA B200"), T0, 0.2)
    state.update(Batch(points=points))
    view = state.view()
    assert len(view.gpus) == 10
    assert [render.gpu_label(r) for r in view.gpus if r.state.host == "hgx"] == ["0 mig1", "0 mig2"]
    assert render.header_facts(view)[0].startswith("GPUs 10 on 3 hosts, 10 with OFU")


def test_a_gpu_without_a_value_shows_why_never_zero_and_recovers():
    clock = Clock()
    state = FleetState(clock=clock)
    good, blank = gpu_resource(index="0", uuid="GPU-0"), gpu_resource(index="1", uuid="GPU-1")
    state.update(Batch(points=[*ofu_points(good, T0, 0.4), dropped(blank, T0, "blank")]))
    view = state.view()
    assert [r.reason for r in view.gpus] == ["", "blank"]
    assert view.no_value == {"blank": 1} and view.ofu_now == pytest.approx(0.4)
    lines = render.plain_lines(view)
    row = next(line for line in lines if "GPU-1" in line or line.strip().startswith("node-a  1"))
    assert "- (blank)" in row and "0.0%" not in row
    # A later window with a value replaces the reason; an unsupported counter reads as such.
    clock.now += 1
    state.update(Batch(points=[*ofu_points(blank, T0 + 10 * S, 0.5), dropped(good, T0 + 10 * S, "not_supported")]))
    view = state.view()
    assert [r.reason for r in view.gpus] == ["not_supported", ""]
    assert "1 without (1 unsupported)" in render.header_facts(view)[1]


def test_a_gpu_that_stops_reporting_turns_stale_after_three_of_its_intervals():
    clock = Clock()
    state = FleetState(clock=clock)
    a, b = gpu_resource(index="0", uuid="GPU-0"), gpu_resource(index="1", uuid="GPU-1")
    for k in range(3):  # both report every 10 s
        state.update(Batch(points=[*ofu_points(a, T0 + k * 10 * S, 0.4), *ofu_points(b, T0 + k * 10 * S, 0.4)]))
        clock.now += 10
    clock.now -= 10
    for k in range(3, 7):  # then only GPU 0, for four of its intervals
        clock.now += 10
        state.update(Batch(points=ofu_points(a, T0 + k * 10 * S, 0.4)))
    view = state.view()
    assert [r.reason for r in view.gpus] == ["", STALE]
    assert view.no_value == {STALE: 1}
    assert view.ofu_now == pytest.approx(0.4)  # the stale GPU's last value is not "now"


def test_fleet_mean_is_weighted_by_gpu_time_and_waste_counts_the_rest():
    clock = Clock()
    state = FleetState(clock=clock)
    a, b = gpu_resource(index="0", uuid="GPU-0"), gpu_resource(index="1", uuid="GPU-1")
    # GPU 0 reports every 10 s at 0.6, GPU 1 every 30 s at 0.2: over 60 s both hold 60 GPU-s.
    for k in range(7):
        points = ofu_points(a, T0 + k * 10 * S, 0.6)
        if k % 3 == 0:
            points += ofu_points(b, T0 + k * 10 * S, 0.2)
        state.update(Batch(points=points))
    totals = state.view().totals
    assert totals.gpu_seconds == pytest.approx(120)
    assert totals.ofu_mean == pytest.approx(0.4)  # a plain mean over points would say (6 x 0.6 + 2 x 0.2) / 8 = 0.5
    assert totals.wasted_gpu_seconds == pytest.approx(60 * 0.4 + 60 * 0.8)


def test_findings_open_close_and_survive_the_pipeline_shutdown():
    state = FleetState()
    res = gpu_resource()
    state.update(Batch(points=ofu_points(res, T0, 0.26, job="moe"), events=[
        finding_event("ofu.finding.open", "moe", T0, kind="mfu_gap", **{
            "ofu.finding.cause": "flop_formula_overcount", "ofu.finding.mfu_reported": 0.547,
            "ofu.finding.ofu": 0.263, "ofu.finding.window": "5m", "ofu.finding.since_unix_nano": T0 - 600 * S})]))
    job = state.view().jobs[0]
    assert [f.kind for f in job.open_findings] == ["mfu_gap"]
    text = render.finding_text(job.open_findings[0], T0)
    assert text == ("mfu_gap: reported MFU 54.7% vs OFU 26.3% (5m), likely flop formula overcount, since "
                    f"{render.clock(T0 - 600 * S)} (10m)")
    # Shutdown: the jobs processor closes findings "with the job" and ends it (reason shutdown);
    # the last frame still shows what was open.
    state.update(Batch(events=[
        finding_event("ofu.finding.close", "moe", T0 + S, kind="mfu_gap", **{"ofu.finding.reason": "job_end"}),
        Event("ofu.job.end", T0 + S, attrs({"ofu.job.id": "moe"}),
              attrs({"ofu.job.id": "moe", "ofu.job.end_reason": "shutdown"}))]))
    view = state.view()
    assert view.open_findings == 1 and not view.jobs[0].ended and view.gpus[0].job_finding
    # A real end (timeout) moves it to closed; a cleared finding shows as cleared.
    state.update(Batch(events=[Event("ofu.job.end", T0 + 2 * S, attrs({"ofu.job.id": "moe"}),
                                     attrs({"ofu.job.id": "moe", "ofu.job.end_reason": "timeout"}))]))
    job = state.view().jobs[0]
    assert job.ended and not job.open_findings
    assert render.finding_text(job.closed_findings[0], T0, is_open=False) == "mfu_gap open when the job ended"


@pytest.mark.parametrize(("close", "expected"), [
    ({}, "mfu_gap cleared at {closed} (was reported MFU 54.7% vs OFU 26.3% (5m), flop formula overcount)"),
    ({"ofu.finding.reason": "no_mfu_report", "ofu.finding.no_report_s": 330.0},
     "mfu_gap closed at {closed}: no MFU report for 5m (was reported MFU 54.7% vs OFU 26.3% (5m), flop formula "
     "overcount)"),
])
def test_a_closed_mfu_gap_says_why_and_no_longer_calls_its_cause_likely(close, expected):
    """Issue 31 item 4: the jobs processor closes an mfu_gap whose job stopped reporting MFU; the console says
    so, and a closed finding's cause is what it was opened for, not a likely one."""
    state = FleetState()
    state.update(Batch(points=ofu_points(gpu_resource(), T0, 0.26, job="moe"), events=[
        finding_event("ofu.finding.open", "moe", T0, kind="mfu_gap", **{
            "ofu.finding.cause": "flop_formula_overcount", "ofu.finding.mfu_reported": 0.547,
            "ofu.finding.ofu": 0.263, "ofu.finding.window": "5m", "ofu.finding.since_unix_nano": T0 - 600 * S})]))
    state.update(Batch(events=[finding_event("ofu.finding.close", "moe", T0 + 900 * S, kind="mfu_gap", **close)]))
    job = state.view().jobs[0]
    assert not job.open_findings
    text = render.finding_text(job.closed_findings[0], T0 + 900 * S, is_open=False)
    assert text == expected.format(closed=render.clock(T0 + 900 * S))
    assert "likely" not in "\n".join(render.plain_lines(state.view()))


def test_a_stalled_job_says_what_it_was_judged_on_and_when_work_resumed():
    """Issue 34: the jobs processor's stalled finding in the console: busy with nothing moving, its evidence and
    GPU-hours, then cleared."""
    state = FleetState()
    state.update(Batch(points=ofu_points(gpu_resource(), T0, 0.0, job="hung"), events=[
        finding_event("ofu.finding.open", "hung", T0, kind="stalled", **{
            "ofu.finding.cause": "engine_busy_no_work", "ofu.finding.evidence": "activity_only",
            "ofu.finding.stalled_for_s": 600.0, "ofu.finding.stalled_gpu_hours": 1.333,
            "ofu.finding.since_unix_nano": T0 - 600 * S})]))
    job = state.view().jobs[0]
    assert render.finding_text(job.open_findings[0], T0) == (
        "stalled: engine busy, nothing moving (no link counters), 1.33 GPU h at open, likely a deadlock or a "
        f"spinning kernel, since {render.clock(T0 - 600 * S)} (10m)")
    state.update(Batch(events=[finding_event("ofu.finding.close", "hung", T0 + 300 * S, kind="stalled", **{
        "ofu.finding.reason": "work_resumed"})]))
    job = state.view().jobs[0]
    assert render.finding_text(job.closed_findings[0], T0 + 300 * S, is_open=False) == (
        f"stalled cleared at {render.clock(T0 + 300 * S)} (was engine busy, nothing moving (no link counters), "
        "1.33 GPU h at open)")


def test_jobs_with_findings_come_first_then_lowest_ofu():
    state = FleetState()
    points = []
    for i, (job, ofu) in enumerate([("fast", 0.6), ("slow", 0.1), ("flagged", 0.5), ("mid", 0.3)]):
        points += ofu_points(gpu_resource(index=str(i), uuid=f"GPU-{i}"), T0, ofu, job=job)
    state.update(Batch(points=points, events=[finding_event(
        "ofu.finding.open", "flagged", T0, kind="regression",
        **{"ofu.finding.ofu": 0.2, "ofu.finding.baseline": 0.5, "ofu.finding.ratio": 2.5})]))
    assert [j.job_id for j in state.view().jobs] == ["flagged", "slow", "mid", "fast"]


def test_many_gpus_truncate_to_findings_missing_and_lowest_ofu_first():
    state = FleetState()
    points = []
    for i in range(80):
        job = "flagged" if i == 70 else "bulk"
        points += ofu_points(gpu_resource(f"node-{i // 8:02d}", str(i % 8), f"GPU-{i}"), T0, 0.3 + i / 1000, job=job)
    points.append(dropped(gpu_resource("node-09", "7", "GPU-79"), T0 + 1, "blank"))
    state.update(Batch(points=points, events=[finding_event(
        "ofu.finding.open", "flagged", T0, kind="regression",
        **{"ofu.finding.ofu": 0.2, "ofu.finding.baseline": 0.5, "ofu.finding.ratio": 2.5})]))
    lines = render.plain_lines(state.view(), max_gpus=10)
    rows = [line for line in lines if line.startswith("  node-")]
    assert len(rows) == 10 and "  ... 70 more GPUs" in lines[-1]
    assert any("flagged" in r for r in rows) and any("- (blank)" in r for r in rows)
    shown = [float(r.split()[-1].rstrip("%")) for r in rows if "flagged" not in r and "blank" not in r]
    assert max(shown) < 31.0  # the rest are the lowest OFU
    # Natural order among the shown rows.
    assert rows == sorted(rows, key=lambda r: (r.split()[0], int(r.split()[1])))


def _rich_text(view, monkeypatch, no_color: bool) -> str:
    if no_color:
        monkeypatch.setenv("NO_COLOR", "1")
    else:
        monkeypatch.delenv("NO_COLOR", raising=False)
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, color_system="truecolor", width=160, height=50)
    console.print(render.live_layout(view, console))
    return out.getvalue()


def test_colour_only_for_meaning_and_the_screen_reads_the_same_without_it(monkeypatch):
    state = FleetState()
    flagged, blank = gpu_resource(index="0", uuid="GPU-0"), gpu_resource(index="1", uuid="GPU-1")
    state.update(Batch(points=[*ofu_points(flagged, T0, 0.26, job="moe"), dropped(blank, T0, "blank")], events=[
        finding_event("ofu.finding.open", "moe", T0, kind="mfu_gap", **{
            "ofu.finding.mfu_reported": 0.547, "ofu.finding.ofu": 0.263, "ofu.finding.window": "5m"})]))
    view = state.view()
    coloured = _rich_text(view, monkeypatch, no_color=False)
    plain = _rich_text(view, monkeypatch, no_color=True)
    assert COLOUR.search(coloured) and not COLOUR.search(plain)
    strip = re.compile(r"\x1b\[[0-9;]*m")
    assert strip.sub("", coloured) == strip.sub("", plain)
    text = strip.sub("", plain)
    assert "⚠ moe" in text and "⚠ mfu_gap: reported MFU 54.7% vs OFU 26.3% (5m)" in text
    assert "— blank" in text and "1 without (1 blank)" in text


def test_plain_exporter_prints_header_and_jobs_each_refresh_and_the_gpu_table_at_the_end():
    stream = io.StringIO()
    exporter = ConsoleExporter(ConsoleExporterConfig(plain_gpu_table=3600), Context("console"), stream=stream)
    assert not exporter.live and exporter.console is None
    res = gpu_resource(index="3", uuid="GPU-x")
    exporter.export(Batch(points=ofu_points(res, T0, 0.4321, clock_mhz=1755)))
    exporter._draw()  # the first frame has the table
    exporter.export(Batch(points=ofu_points(res, T0 + 10 * S, 0.4)))
    exporter._draw()  # within plain_gpu_table: header and jobs only
    exporter._draw()  # nothing new: nothing printed
    exporter.shutdown()  # the last frame has the table again
    frames = stream.getvalue().strip().split("\n\n")
    assert len(frames) == 3
    assert all(f.startswith("otel-ofu ") and "mean OFU" in f and "job train: 1 GPUs" in f for f in frames)
    assert ["H100 80GB HBM3" in f for f in frames] == [True, False, True]
    assert "1755 / 1830" in frames[0] and "43.2%" in frames[0] and not ANSI.search(stream.getvalue())



def test_plain_exporter_says_what_its_sources_say_when_it_changes_and_stops_when_they_recover():
    """A source that fails is printed under the header (whether or not data came before); one still
    waiting only while nothing has arrived; a recovered one no more. Each change is a frame."""
    stream = io.StringIO()
    telemetry = Telemetry()
    exporter = ConsoleExporter(ConsoleExporterConfig(plain_gpu_table=3600), Context("console", telemetry),
                               stream=stream)
    telemetry.receiver_state("otlp", STARTING)
    telemetry.receiver_state("dcgm_exporter", "scrape_failed",
                             why="cannot scrape http://n:9400/metrics: connection refused; retrying every 30s")
    exporter._draw()
    exporter._draw()  # nothing changed: nothing printed
    exporter.export(Batch(points=ofu_points(gpu_resource(), T0, 0.5)))
    exporter._draw()  # data: the waiting source is no longer news, the failing one still is
    telemetry.receiver_state("dcgm_exporter", "ok")
    exporter._draw()
    frames = [f.splitlines() for f in stream.getvalue().strip().split("\n\n")]
    failing = "  source dcgm_exporter: cannot scrape http://n:9400/metrics: connection refused; retrying every 30s"
    assert [[line for line in f if line.startswith("  source")] for f in frames] == [
        [failing, "  source otlp: nothing read yet"], [failing], []]

def test_live_exporter_draws_through_rich():
    stream = io.StringIO()
    exporter = ConsoleExporter(ConsoleExporterConfig(mode="live", refresh_interval=60), Context("console"),
                               stream=stream)
    exporter.start()
    exporter.export(Batch(points=ofu_points(gpu_resource(), T0, 0.5)))
    exporter.shutdown()
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", stream.getvalue())
    assert exporter.live and "otel-ofu · data time" in text and "50.0%" in text


@pytest.mark.parametrize("config,key", [({"refresh_interval": 0}, "refresh_interval"), ({"max_jobs": 0}, "max_jobs"),
                                        ({"sparkline_bucket": "0s"}, "sparkline_bucket"),
                                        ({"stale_after": -1}, "stale_after"), ({"mode": "fancy"}, "mode")])
def test_bad_config_names_the_key(config, key):
    from otel_ofu.pipeline.config import FieldError, build_config

    with pytest.raises(FieldError) as error:
        build_config(ConsoleExporterConfig, config)
    assert key in str(error.value)


def test_a_long_watch_forgets_gpus_gone_for_an_hour_and_keeps_the_newest_ended_jobs():
    clock = Clock()
    state = FleetState(clock=clock, keep_ended_jobs=2)
    for i in range(4):
        job = f"job-{i}"
        state.update(Batch(points=ofu_points(gpu_resource(index=str(i), uuid=f"GPU-{i}"), T0 + i * S, 0.4, job=job),
                           events=[Event("ofu.job.end", T0 + i * S, attrs({"ofu.job.id": job}),
                                         attrs({"ofu.job.id": job, "ofu.job.end_reason": "timeout"}))]))
    assert [j.job_id for j in state.view().jobs] == ["job-2", "job-3"]
    assert len(state.view().gpus) == 4
    clock.now += 3601
    state.update(Batch(points=ofu_points(gpu_resource(index="0", uuid="GPU-0"), T0 + 3600 * S, 0.4, job="job-0")))
    assert [r.state.index for r in state.view().gpus] == ["0"]


def test_jobs_without_an_end_event_are_forgotten_with_their_gpus():
    """No jobs processor upstream, so no ofu.job.end: a long watch keeps no job last seen an hour ago (issue 11, 5)."""
    clock = Clock()
    state = FleetState(clock=clock)
    for i in range(50):
        clock.now += 60
        state.update(Batch(points=ofu_points(gpu_resource(index="0", uuid="GPU-0"), T0 + i * 60 * S, 0.4,
                                             job=f"short-{i}")))
    assert len(state.jobs) == 50
    clock.now += 3601
    state.update(Batch(points=ofu_points(gpu_resource(index="0", uuid="GPU-0"), T0 + 3 * 3600 * S, 0.4, job="now")))
    assert [j.job_id for j in state.view().jobs] == ["now"] and list(state.jobs) == ["now"]


def loss_points(resource, t, job, parts):
    """The ofu processor's gpu.ofu.loss points of a window: one per part, on the GPU's job resource."""
    resource = attrs({**dict(resource), "ofu.job.id": job, "ofu.precision": "bf16"})
    return [MetricPoint("gpu.ofu.loss", share, t, resource,
                        attrs({"ofu.loss.part": part, **({"ofu.loss.cause": cause} if cause else {})}))
            for part, share, cause in parts]


def test_the_jobs_panel_names_each_jobs_largest_loss(monkeypatch):
    state = FleetState(clock=Clock())
    a, b, c = (gpu_resource(index=str(i), uuid=f"GPU-{i}") for i in range(3))
    for k in range(4):
        t = T0 + k * 10 * S
        state.update(Batch(points=[
            *ofu_points(a, t, 0.2, job="starved"),
            *loss_points(a, t, "starved", [("engine_idle", 0.6, None), ("non_tensor", 0.15, "not_memory_bound"),
                                           ("clock", 0.05, "sw_power_cap")]),
            *ofu_points(b, t, 0.45, job="hot"),
            *loss_points(b, t, "hot", [("engine_idle", 0.05, None), ("non_tensor", 0.1, "not_memory_bound"),
                                       ("clock", 0.4, "hw_thermal")]),
            *ofu_points(c, t, 0.5, job="old-agent"),  # OFU without its account: unknown, never a made-up part
        ]))
    view = state.view()
    largest = {job.job_id: job.largest_loss for job in view.jobs}
    assert largest["starved"] == ("engine_idle", pytest.approx(0.6), None)
    assert largest["hot"] == ("clock", pytest.approx(0.4), "hw_thermal")
    assert largest["old-agent"] == ("unknown", pytest.approx(0.5), None)
    text = "\n".join(render.plain_lines(view, gpus=False))
    assert "largest loss engine idle 60%" in text and "largest loss clock 40% (hw thermal)" in text
    assert "largest loss" in _rich_text(view, monkeypatch, no_color=True) and "clock 40% (hw thermal)" in \
        _rich_text(view, monkeypatch, no_color=True)


def test_a_clock_boost_above_f_ref_reads_as_a_gain_never_as_a_negative_loss(monkeypatch):
    """Issue 31 item 6: a job whose SM clock boosts above f_ref has a negative clock part; the console says
    what it gained, and a job that lost nothing else still names no negative "largest loss"."""
    state = FleetState(clock=Clock())
    a, b = gpu_resource(index="0", uuid="GPU-0"), gpu_resource(index="1", uuid="GPU-1")
    for k in range(4):
        t = T0 + k * 10 * S
        state.update(Batch(points=[
            *ofu_points(a, t, 0.93, job="boosted", clock_mhz=1980.0),
            *loss_points(a, t, "boosted", [("engine_idle", 0.1, None), ("clock", -0.05, "none"),
                                           ("padding", 0.02, None)]),
            *ofu_points(b, t, 1.05, job="all-boost", clock_mhz=1980.0),
            *loss_points(b, t, "all-boost", [("engine_idle", 0.0, None), ("clock", -0.05, "none")]),
        ]))
    view = state.view()
    text = "\n".join(render.plain_lines(view, gpus=False))
    assert "largest loss engine idle 10%; clock boost: +5% gained" in text
    assert "job all-boost: 1 GPUs, OFU 105.0% now, 105.0% over the job, clock boost: +5% gained" in text
    assert "-5%" not in text
    rich = _rich_text(view, monkeypatch, no_color=True)
    assert "clock boost: +5% gained" in rich and "-5%" not in rich


def test_a_job_that_throttles_and_boosts_shows_the_clock_lost_and_the_gain_apart():
    """Issue 31 item 6: window by window, a clock part above 0 is lost and one below 0 gained, apart (as the
    jobs processor's counters count them): a job power-capped half the time and boosting the other half lost
    15% to the clock and gained 5%, not "10% lost"; the waste is what was lost, and GPU time = useful + wasted -
    gained."""
    state = FleetState(clock=Clock())
    a = gpu_resource(index="0", uuid="GPU-0")
    for k in range(5):  # the first window only starts the GPU's series; four of 10 s follow
        t = T0 + k * 10 * S
        if k % 2:
            points = [*ofu_points(a, t, 0.6, job="capped", clock_mhz=1280.0),
                      *loss_points(a, t, "capped", [("engine_idle", 0.1, None), ("clock", 0.3, "sw_power_cap")])]
        else:
            points = [*ofu_points(a, t, 1.0, job="capped", clock_mhz=1980.0),
                      *loss_points(a, t, "capped", [("engine_idle", 0.1, None), ("clock", -0.1, "none")])]
        state.update(Batch(points=points))
    view = state.view()
    text = "\n".join(render.plain_lines(view, gpus=False))
    assert "largest loss clock 15% (sw power cap); clock boost: +5% gained" in text
    totals = view.totals
    assert totals.wasted_gpu_seconds == pytest.approx(0.4 * 20 + 0.1 * 20)
    assert totals.gained_gpu_seconds == pytest.approx(0.1 * 20)
    assert totals.ofu_gpu_seconds + totals.wasted_gpu_seconds - totals.gained_gpu_seconds == \
        pytest.approx(totals.gpu_seconds)


def test_a_priced_job_shows_what_its_losses_cost_per_hour(monkeypatch):
    """Issue 34: with prices set in the jobs processor, the console reads job.cost and shows what the job's loss
    parts cost per hour of data time: (1 - OFU) x the price for one GPU whose clock neither lost nor gained."""
    from otel_ofu.core.model import GpuSample
    from otel_ofu.jobs.config import JobsConfig
    from otel_ofu.pipeline.config import build_config
    from otel_ofu.processors.jobs import JobsProcessor
    from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig

    t0 = 1_800_000_000
    ofu = OfuProcessor(OfuProcessorConfig(), Context("ofu"))
    jobs = JobsProcessor(build_config(JobsConfig, {"resolution": "1m", "cost": {"currency": "EUR",
                                                                                "per_gpu_hour": {"*H100*": 3.6}}}),
                         Context("jobs"), clock=lambda: t0)
    state = FleetState(clock=Clock())
    values = []
    for k in range(60):  # ten minutes: ten job.cost stamps, the rate over the last six
        sample = GpuSample((t0 + 10 * (k + 1)) * 10**9, 10.0, "node-a", 0, "GPU-a", "NVIDIA H100 80GB HBM3", 0.5,
                           1830.0, clock_event_reasons=0, sm_active=0.8, gr_active=0.9, job_id="train",
                           precision="bf16")
        batch = jobs.process(ofu.process(Batch(samples=[sample])))
        values += [p.value for p in batch.points if p.name == "gpu.ofu"]
        state.update(batch)
    (row,) = state.view().jobs
    assert row.currency == "EUR"
    assert row.cost_lost_per_hour == pytest.approx((1 - values[-1]) * 3.6, rel=1e-6)
    text = "\n".join(render.plain_lines(state.view(), gpus=False))
    assert f"losing {(1 - values[-1]) * 3.6:.2f} EUR/h" in text
    assert f"jobs losing {(1 - values[-1]) * 3.6:.2f} EUR/h" in text  # the fleet's header
    assert f"jobs losing {(1 - values[-1]) * 3.6:.2f} EUR/h" in _rich_text(state.view(), monkeypatch, no_color=True)
    unpriced = FleetState(clock=Clock())
    unpriced.update(Batch(points=ofu_points(gpu_resource(), T0, 0.4)))
    assert "/h" not in "\n".join(render.plain_lines(unpriced.view(), gpus=False))
