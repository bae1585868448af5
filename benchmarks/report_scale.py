"""The report at fleet scale: ``otel-ofu report``'s CPU against the protobuf decode of the same points.

Why: issue 33 asks the report to read at the decoder's speed (from proto at most 4x the upb
decode of the same points, from JSON at most 10x) and a day of a 1,000-GPU fleet at 10 s
(8.64 M GPU-windows) to be reported from a recording on one core in under 5 minutes. This
measures, in one run on this machine:

- the recording: a simulated fleet (otel_ofu/sim through the ``ofu`` and ``jobs`` processors, as
  ``otel-ofu run`` with collector-config/demo.yaml's processors) written by the ``file`` exporter
  as OTLP JSON lines, and the same batches as OTLP protobuf in the Collector file exporter's
  length-prefixed records (``format: proto``), encoded with the protobuf classes; the CPU the
  simulation and each writing take (``record_*``);
- ``upb_decode_cpu_s``: ``FromString`` of every protobuf record (the decode of the same points),
  the median of three rounds (each in ``upb_decode_rounds_cpu_s``);
- the report (``build_report``, one process, the table's whole computation) from each file:
  its CPU, and the reading alone (``read_inputs``: the file into the report's columns), from the
  jobs processor's series (the default, report/series.py), and recomputed (``--recompute``: the
  GPU points replayed through the jobs logic) for comparison;
- ``report_json_read_dict_walk_cpu_s``: the JSON file read as the report read it before
  (``json.loads``, then a MetricPoint per point), for the reading's "before";
- the ratios to the decode, the GPU-windows per CPU-second, and from them a day of a 1,000-GPU
  fleet at 10 s (8.64 M GPU-windows) on one core, extrapolated (the report's cost grows with
  the GPU-windows: ``--windows`` more gives the same rate).

CPU is this process's user+system time (``time.process_time``).

    python benchmarks/report_scale.py --json                        # 1,000 GPUs, 30 windows
    python benchmarks/report_scale.py --gpus 1000 --windows 90 --json
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from otel_ofu.core.model import Batch  # noqa: E402
from otel_ofu.exporters.file import FileExporter, FileExporterConfig  # noqa: E402
from otel_ofu.jobs.config import JobsConfig  # noqa: E402
from otel_ofu.otlp import codec, files  # noqa: E402
from otel_ofu.pipeline.component import Context  # noqa: E402
from otel_ofu.processors.jobs import JobsProcessor  # noqa: E402
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig  # noqa: E402
from otel_ofu.receivers.sim import SimReceiverConfig, build_fleet, window_batch  # noqa: E402
from otel_ofu.report import series  # noqa: E402
from otel_ofu.report.build import ReadOptions, build_report, read_inputs  # noqa: E402

START = 1_800_000_000.0
DAY_GPU_WINDOWS = 1000 * 86400 // 10  # a day of a 1,000-GPU fleet at 10 s
TARGET_PROTO_RATIO, TARGET_JSON_RATIO, TARGET_DAY_S = 4.0, 10.0, 300.0
# The metrics the report reads with default settings (build_report's names)
REPORT_NAMES = {"gpu.ofu", "gpu.flops.achieved", "gpu.job.share", "gpu.ofu.loss", "training.mfu", "sim.gpu.mfu.true",
                "training.tflops_per_gpu", "megatron.training.throughput_tflops"}


def record(gpus: int, windows: int, directory: Path) -> dict:
    """The fleet's recording as JSON lines (the file exporter) and protobuf records; what each cost."""
    fleet = build_fleet(SimReceiverConfig(nodes=max(1, gpus // 8), gpus_per_node=min(gpus, 8)), START)
    ofu = OfuProcessor(OfuProcessorConfig(), Context("ofu"))
    jobs = JobsProcessor(JobsConfig(), Context("jobs"), clock=lambda: START + fleet.t)
    json_path, proto_path = directory / "fleet.jsonl", directory / "fleet.binpb"
    exporter = FileExporter(FileExporterConfig(path=str(json_path)), Context("file"))
    exporter.start()
    simulate = write_json = write_proto = 0.0
    with open(proto_path, "wb") as proto:

        def write(batch: Batch) -> None:
            nonlocal write_json, write_proto
            t0 = time.process_time()
            exporter.export(batch)
            t1 = time.process_time()
            for request in ([codec.to_request(batch.points)] if batch.points else []) + (
                    [codec.events_to_request(batch.events)] if batch.events else []):
                body = request.SerializeToString()
                proto.write(struct.pack(">I", len(body)) + body)
            write_json += t1 - t0
            write_proto += time.process_time() - t1

        for _ in range(windows):
            t0 = time.process_time()
            batch = jobs.process(ofu.process(window_batch(fleet.step_window(), True)))
            simulate += time.process_time() - t0
            write(batch)
        t0 = time.process_time()
        last = jobs.flush()
        simulate += time.process_time() - t0
        write(last)
    exporter.shutdown()
    return {"json_path": json_path, "proto_path": proto_path, "record_simulate_cpu_s": simulate,
            "record_json_write_cpu_s": write_json, "record_proto_write_cpu_s": write_proto,
            "json_bytes": json_path.stat().st_size, "proto_bytes": proto_path.stat().st_size}


def upb_decode(path: Path, rounds: int = 3) -> tuple[list[float], int, int]:
    """CPU of decoding every record of a protobuf recording with upb, each of ``rounds`` times (it
    varies by half between rounds: the first one's memory is new); records, data points."""
    records = [body for _, body in files.read_requests(path)]
    cpu = []
    for _ in range(rounds):
        t0 = time.process_time()
        decoded = [codec.from_proto_record(body) for body in records]  # type: ignore[arg-type]
        cpu.append(time.process_time() - t0)
        points = sum(codec.count_data_points(rm) for r in decoded for rm in getattr(r, "resource_metrics", ()))
        del decoded
    return cpu, len(records), points


def report_cpu(path: Path) -> tuple[float, float, int, float]:
    """CPU of the whole report of one file (from the jobs processor's series, the default), of its reading
    alone, its GPU-windows (gpu.ofu points), and the CPU of the report recomputed (``--recompute``: the replay)."""
    options = ReadOptions(processes=1)
    config = JobsConfig()
    t0 = time.process_time()
    report = build_report(str(path), config, options=options)
    total = time.process_time() - t0
    assert report.jobs_source == "series", report.jobs_source
    t0 = time.process_time()
    read_inputs([str(path)], series.names(), options, series.point_filter(config))
    read = time.process_time() - t0
    windows = sum(round(g.totals.gpu_seconds / 10) for g in report.gpus)
    t0 = time.process_time()
    build_report(str(path), config, recompute=True, options=options)
    replay = time.process_time() - t0
    return total, read, windows, replay


def dict_walk_read(path: Path) -> float:
    """CPU of reading the JSON file as the report did before its columns (issue 33): json.loads, then a
    MetricPoint per point from the dict walk (``metric_points``, kept as the tests' oracle), stored."""
    from otel_ofu.report.build import dict_walk_store

    t0 = time.process_time()
    dict_walk_store(path, REPORT_NAMES)
    return time.process_time() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--windows", type=int, default=30, help="10 s windows recorded")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    import numpy  # noqa: F401  (imported by the report on first use: not part of what is measured)
    import tqdm  # noqa: F401

    import otel_ofu.receivers.replay  # noqa: F401
    with tempfile.TemporaryDirectory() as tmp:
        rec = record(args.gpus, args.windows, Path(tmp))
        decode_rounds, records, points = upb_decode(rec["proto_path"])
        decode_s = sorted(decode_rounds)[len(decode_rounds) // 2]
        proto_s, proto_read_s, gpu_windows, proto_replay_s = report_cpu(rec["proto_path"])
        json_s, json_read_s, _, json_replay_s = report_cpu(rec["json_path"])
        dict_walk_s = dict_walk_read(rec["json_path"])
    out = {
        "gpus": args.gpus, "windows": args.windows, "gpu_windows": gpu_windows, "records": records,
        "data_points": points, "json_bytes": rec["json_bytes"], "proto_bytes": rec["proto_bytes"],
        "upb_decode_cpu_s": decode_s, "upb_decode_rounds_cpu_s": decode_rounds,
        "report_proto_cpu_s": proto_s, "report_proto_read_cpu_s": proto_read_s,
        "report_json_cpu_s": json_s, "report_json_read_cpu_s": json_read_s,
        "ratio_proto": proto_s / decode_s, "ratio_json": json_s / decode_s,
        "ratio_proto_read": proto_read_s / decode_s, "ratio_json_read": json_read_s / decode_s,
        "report_json_read_dict_walk_cpu_s": dict_walk_s, "ratio_json_read_dict_walk": dict_walk_s / decode_s,
        "report_proto_after_reading_cpu_s": proto_s - proto_read_s,
        "report_proto_recompute_cpu_s": proto_replay_s, "report_json_recompute_cpu_s": json_replay_s,
        "ratio_proto_recompute": proto_replay_s / decode_s, "ratio_json_recompute": json_replay_s / decode_s,
        "target_ratio_proto": TARGET_PROTO_RATIO, "target_ratio_json": TARGET_JSON_RATIO,
        "gpu_windows_per_cpu_s_proto": gpu_windows / proto_s, "gpu_windows_per_cpu_s_json": gpu_windows / json_s,
        "day_1000_gpus_proto_s": DAY_GPU_WINDOWS * proto_s / gpu_windows,
        "day_1000_gpus_json_s": DAY_GPU_WINDOWS * json_s / gpu_windows,
        "target_day_s": TARGET_DAY_S,
        "record_simulate_cpu_s": rec["record_simulate_cpu_s"],
        "record_json_write_cpu_s": rec["record_json_write_cpu_s"],
        "record_proto_write_cpu_s": rec["record_proto_write_cpu_s"],
        "day_1000_gpus_record_json_s": DAY_GPU_WINDOWS * (rec["record_simulate_cpu_s"] + rec["record_json_write_cpu_s"])
        / gpu_windows,
    }
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:32} {v:,.3f}" if isinstance(v, float) else f"{k:32} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
