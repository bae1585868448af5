"""The jobs processor's own state: a restart or a crash resumes every job; nothing counted twice or lost."""

from __future__ import annotations

import logging
import pickle

import pytest

from otel_ofu.core.model import JOB_ID, Batch
from otel_ofu.jobs.config import JobsConfig
from otel_ofu.jobs.state import JobState
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import FieldError, build_config
from otel_ofu.processors.jobs import JobsProcessor
from tools.fleet_sim import NodeTier

JOBS = [{"id": "steady-a", "scenario": "steady", "gpus": 4, "precision": "bf16"},
        {"id": "moe-b", "scenario": "moe_inflated", "gpus": 4},
        {"id": "regress-c", "scenario": "regression", "gpus": 2, "regress_at": "12m", "recover_at": "30m"},
        {"id": "short-d", "scenario": "steady", "gpus": 2, "duration": "10m"},
        # hangs at 8m: its stalled finding opens at 18m, open across the later crash (jobs.stall's state)
        {"id": "hung-e", "scenario": "hung", "gpus": 2, "hang_at": "8m"}]
WINDOWS = 240  # 40 minutes of 10 s windows: findings open, a job ends


@pytest.fixture(scope="module")
def windows():
    tier = NodeTier.of(nodes=4, gpus_per_node=4, jobs=JOBS)
    return [[p for points in tier.window().values() for p in points] for _ in range(WINDOWS)]


def processor(storage=None, **extra) -> JobsProcessor:
    config = build_config(JobsConfig, {"storage": str(storage) if storage else None, **extra})
    proc = JobsProcessor(config, Context("jobs@metrics"))
    proc.start()
    return proc


def outputs(proc: JobsProcessor, batches) -> list[Batch]:
    out = []
    for points in batches:
        out.append(proc.process(Batch(points=list(points))))
        proc.exported()
    return out


def job_results(batches: list[Batch]) -> tuple[list, list]:
    # the jobs' points, their loss account's among them (job.ofu.loss), and the fleet's GPU-hours by part
    points = sorted((p.name, str(dict(p.resource).get(JOB_ID)), p.time_unix_nano, p.start_time_unix_nano,
                     p.attributes, round(p.value, 9))
                    for b in batches for p in b.points if p.name.startswith(("job.", "fleet.")))
    events = sorted((e.name, e.time_unix_nano, tuple((k, round(v, 9) if isinstance(v, float) else v)
                                                     for k, v in e.attributes)) for b in batches for e in b.events)
    return points, events


@pytest.fixture(scope="module")
def uninterrupted(windows):
    return job_results(outputs(processor(), windows))


@pytest.mark.parametrize("crash_at", [37, 150])
def test_a_killed_instance_resumes_every_job_from_its_state(windows, uninterrupted, tmp_path, crash_at):
    first = processor(tmp_path, checkpoint_interval="1h")  # the journal carries everything since the start
    before = outputs(first, windows[:crash_at])
    first.state.close()  # the process dies: no flush, no checkpoint (the kernel closes the file)
    second = processor(tmp_path)
    after = outputs(second, windows[crash_at:])
    assert job_results(before + after) == uninterrupted
    assert {e.name for b in before + after for e in b.events} >= {"ofu.finding.open", "ofu.job.end"}
    assert any(name == "ofu.finding.open" and ("ofu.finding.kind", "stalled") in attributes
               for name, _, attributes in uninterrupted[1])
    # ... the loss account's GPU-hours among them, what the clock gained above f_ref too (its own accumulator)
    assert {name for name, *_ in uninterrupted[0]} >= {"job.ofu.loss", "job.ofu.loss.gpu_hours", "fleet.gpu_hours",
                                                       "job.ofu.gain.gpu_hours", "fleet.gpu_hours.gained"}


def test_a_batch_sent_again_after_a_crash_is_not_counted_twice(windows, uninterrupted, tmp_path):
    first = processor(tmp_path)
    before = outputs(first, windows[:100])
    # Batch 100 reached the exporters, then the process died before journaling it: never acknowledged,
    # so the gateway sends it again. Its outputs went out once already (a backend keeps one copy).
    lost = first.process(Batch(points=list(windows[100])))
    first.state.close()
    second = processor(tmp_path)
    after = outputs(second, windows[100:])
    assert job_results(before + after) == uninterrupted
    assert job_results([lost])[0] == job_results(after[:1])[0]


def series_values(batches: list[Batch]) -> dict[tuple, set[str]]:
    """Each job series at each timestamp: the values (exact bits) it was sent with."""
    found: dict[tuple, set[str]] = {}
    for b in batches:
        for p in b.points:
            if p.name.startswith("job."):
                found.setdefault((p.name, p.resource, p.attributes, p.time_unix_nano), set()).add(p.value.hex())
    return found


CLOSES_A_BIN = 59  # window 59 ends at T0 + 600 s: it closes the tenth minute's bin


def test_a_bin_made_before_a_crash_is_sent_again_as_it_was_never_made_from_other_data(windows, uninterrupted,
                                                                                     tmp_path):
    """Issue 31, item 1: the dead process's queue held a job's bin; the restarted one emitted that bin again
    from other data, one value apart, and Prometheus refused the request (duplicate sample for timestamp).

    The process works a batch that closes a bin (its outputs reach the exporters' disk queue) and is killed
    before the exporters' mark. Its source polls (the sim, DCGM): that window never comes again, the next
    one does. The batch was journaled before it went out, so the restart replays it (its bin stays closed)
    and sends its outputs again with the values they had; no job series gets two values at one timestamp,
    and nothing is lost.
    """
    first = processor(tmp_path)
    before = outputs(first, windows[:CLOSES_A_BIN])
    lost = first.process(Batch(points=list(windows[CLOSES_A_BIN])))  # queued by the exporters, then kill -9
    assert any(p.name == "job.ofu" for p in lost.points)
    first.state.close()
    after = outputs(processor(tmp_path), windows[CLOSES_A_BIN + 1:])
    sent = before + [lost] + after
    assert {key: values for key, values in series_values(sent).items() if len(values) > 1} == {}
    assert set(job_results(sent)[0]) == set(uninterrupted[0])
    assert job_results([lost])[0] == job_results(after[:1])[0]  # sent again, as it was


def test_a_jobs_final_counters_made_before_a_crash_are_sent_again_as_they_were(windows, uninterrupted, tmp_path):
    """The batch that ends short-d (its ofu.job.end and its counters' final values, the last partial bin counted)
    reaches the exporters, then kill -9: the restart sends them again with the values they had, once per
    timestamp, and the job does not end twice."""
    plain = processor()
    ends_at = next(i for i, points in enumerate(windows)
                   if any(e.name == "ofu.job.end" for e in plain.process(Batch(points=list(points))).events))
    first = processor(tmp_path)
    before = outputs(first, windows[:ends_at])
    lost = first.process(Batch(points=list(windows[ends_at])))
    final = [p for p in lost.points if p.name == "job.gpu_seconds" and dict(p.resource)[JOB_ID] == "short-d"]
    (end,) = [dict(e.attributes) for e in lost.events if e.name == "ofu.job.end"]
    assert end[JOB_ID] == "short-d" and [p.value / 3600 for p in final] == [end["ofu.job.gpu_hours"]]
    first.state.close()
    after = outputs(processor(tmp_path), windows[ends_at + 1:])
    sent = before + [lost] + after
    assert {key: values for key, values in series_values(sent).items() if len(values) > 1} == {}
    assert set(job_results(sent)[0]) == set(uninterrupted[0])
    again = job_results(after[:1])  # sent again, as it was: the end event too
    assert set(job_results([lost])[0]) <= set(again[0]) and set(job_results([lost])[1]) <= set(again[1])
    assert [dict(e.attributes)[JOB_ID] for b in after for e in b.events if e.name == "ofu.job.end"].count(
        "short-d") == 1


def test_outputs_to_send_again_survive_another_crash_and_go_out_at_shutdown(windows, tmp_path):
    """Killed again before the restart got a batch: the next start still has them; a clean stop sends them."""
    first = processor(tmp_path)
    outputs(first, windows[:CLOSES_A_BIN])
    lost = first.process(Batch(points=list(windows[CLOSES_A_BIN])))
    first.state.close()
    processor(tmp_path).state.close()  # started (a checkpoint), killed before its first batch
    third = processor(tmp_path)
    final = third.flush()  # a clean stop before any batch
    assert final is not None and job_results([final])[0] == job_results([lost])[0]
    third.shutdown()
    fourth = processor(tmp_path)  # the export at shutdown has no mark: sent once more, the same
    assert set(job_results(outputs(fourth, windows[CLOSES_A_BIN + 1:CLOSES_A_BIN + 2]))[0]) >= \
        set(job_results([lost])[0])


def test_shutdown_keeps_the_jobs_and_a_restart_continues_them(windows, uninterrupted, tmp_path):
    first = processor(tmp_path)
    before = outputs(first, windows[:120])
    assert first.flush() is None  # no ofu.job.end at shutdown: the jobs go on after the restart
    first.shutdown()
    after = outputs(processor(tmp_path), windows[120:])
    assert job_results(before + after) == uninterrupted


def test_checkpoints_bound_the_journal_and_a_torn_last_frame_is_ignored(windows, tmp_path, caplog):
    proc = processor(tmp_path, checkpoint_interval="1h", max_journal_bytes=1024 * 1024)
    outputs(proc, windows[:60])
    size = proc.state.journal_path.stat().st_size
    assert 0 < size < 1024 * 1024 + 200_000
    proc.state.close()
    with open(proc.state.journal_path, "ab") as f:
        f.write(b"\x40\x00\x00\x00garbage")  # a frame cut short by the kill
    with caplog.at_level(logging.WARNING):
        again = processor(tmp_path)
    assert "cut short" in caplog.text
    assert set(again.book.jobs) == set(proc.book.jobs)


def test_a_state_of_another_configuration_or_a_corrupt_one_is_set_aside(windows, tmp_path, caplog):
    proc = processor(tmp_path)
    outputs(proc, windows[:30])
    proc.flush()
    proc.shutdown()
    with caplog.at_level(logging.WARNING):
        other = processor(tmp_path, resolution="2m", windows=["4m", "1h"])
    assert not other.book.jobs and "another jobs configuration" in caplog.text
    assert (tmp_path / "jobs_metrics.snapshot.unusable").exists()
    other.flush()
    other.shutdown()
    (tmp_path / "jobs_metrics.snapshot").write_bytes(b"OFUJOBS1" + b"\x00" * 20)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert not processor(tmp_path, resolution="2m", windows=["4m", "1h"]).book.jobs
    assert "corrupt" in caplog.text


def test_a_snapshot_naming_a_foreign_class_is_refused(tmp_path):
    state = JobState(tmp_path, "x", "fp")
    state.checkpoint({"evil": pickle.loads(pickle.dumps(print))})  # builtins.print: not a jobs state class
    fresh = JobState(tmp_path, "x", "fp")
    assert fresh.load() == (None, [], ([], []))


def test_storage_must_be_a_directory(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(FieldError) as info:
        build_config(JobsConfig, {"storage": str(tmp_path / "f")})
    assert info.value.key == "storage"


def test_a_job_that_moves_here_starts_fresh_and_says_so(windows, caplog):
    """After the gateway's ring changes, an instance gets a running job from its middle on."""
    proc = processor()
    with caplog.at_level(logging.INFO):
        out = outputs(proc, windows[100:130])
    assert "job steady-a first seen by this instance" in caplog.text
    starts = [e for b in out for e in b.events if e.name == "ofu.job.start"]
    assert {dict(e.attributes)[JOB_ID] for e in starts} >= {"steady-a", "moe-b"}
    seconds = [p for b in out for p in b.points
               if p.name == "job.gpu_seconds" and dict(p.resource)[JOB_ID] == "steady-a"]
    # Its totals begin with the windows this instance saw: 30 windows x 4 GPUs x 10 s at most.
    assert 0 < seconds[-1].value <= 30 * 4 * 10
    assert seconds[-1].start_time_unix_nano >= windows[100][0].time_unix_nano - 10 * 10**9


def test_a_journal_record_of_another_layout_stops_the_replay_without_a_crash(tmp_path, caplog):
    """A journal left by the layout before the write-ahead one (now, names, resources, rows) beside no snapshot."""
    state = JobState(tmp_path, "jobs", "fp")
    state._open_journal()
    state._write_frame((1.0, {}, {}, []))
    state.close()
    with caplog.at_level(logging.WARNING):
        assert JobState(tmp_path, "jobs", "fp").load() == (None, [], ([], []))
    assert "another layout" in caplog.text
