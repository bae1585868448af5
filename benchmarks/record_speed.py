"""Recording speed: a simulated fleet's windows written by the file exporter, JSON and proto (issue 33).

Why: ``json_format`` writing the file exporter's JSON lines was about half of a simulated
fleet's CPU. This measures, in one run on the same batches, what recording costs per format:

- the pipeline (the demo's: the ``sim`` receiver's fleet of ``--gpus`` GPUs at 10 s, every node
  running a job, the ``ofu`` and ``jobs`` processors) makes ``--windows`` windows; the batches
  the exporter would get are kept, and the pipeline's CPU is measured once;
- each variant of the file exporter writes those same batches to its own file, its CPU
  measured alone: ``json_format`` (the JSON lines as written before: protobuf objects and
  ``json_format``), ``json`` (the same bytes, from ``otel_ofu.otlp.wire_json``), ``json_zstd``,
  ``proto``, ``proto_zstd``. Each variant starts with every encoding cache emptied, so it meets
  each window's resources as the live pipeline does.

Reported per variant: the exporter's CPU per window, GPU-windows per CPU-second for the
exporter alone and for the whole simulated fleet (pipeline + exporter), the time to record a
day of the fleet (8.64 M GPU-windows for 1,000 GPUs at 10 s) on one core, and bytes per
GPU-window. CPU is this process's user+system time (``time.process_time``).

    python benchmarks/record_speed.py --json                  # 1,000 GPUs, 12 windows (2 warm-up)
    python benchmarks/record_speed.py --gpus 1000 --windows 32 --json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from otel_ofu.core.model import Batch  # noqa: E402
from otel_ofu.exporters.file import FACTORY, FileExporter  # noqa: E402
from otel_ofu.otlp import codec as otlp  # noqa: E402
from otel_ofu.pipeline import caches, registry  # noqa: E402
from otel_ofu.pipeline.component import Context  # noqa: E402
from otel_ofu.pipeline.config import build_config, load_document, parse_service_config  # noqa: E402
from otel_ofu.pipeline.service import Service  # noqa: E402
from otel_ofu.receivers import sim as sim_receiver  # noqa: E402

DAY_GPU_WINDOWS = 1000 * 8640  # a day of 1,000 GPUs at 10 s
VARIANTS = {
    "json_format": {},
    "json": {},
    "json_zstd": {"compression": "zstd"},
    "proto": {"format": "proto"},
    "proto_zstd": {"format": "proto", "compression": "zstd"},
}


class JsonFormatExporter(FileExporter):
    """The file exporter's JSON lines as written before wire_json: protobuf objects, then json_format."""

    def _encode(self, batch: Batch) -> tuple[bytes, int] | None:
        lines = []
        request = otlp.to_request(batch.points)
        request.resource_metrics.extend(otlp.passthrough_messages(batch.passthrough))
        if request.resource_metrics:
            for rm in request.resource_metrics:
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        if metric.name in self._described:
                            metric.description = ""
                        elif metric.description:
                            self._described.add(metric.name)
            lines.append(otlp.to_json_line(request))
        if batch.events:
            lines.append(otlp.to_json_line(otlp.events_to_request(batch.events)))
        if not lines:
            return None
        return self._compress(("\n".join(lines) + "\n").encode()), len(lines)


def fleet_batches(gpus: int, windows: int, out_dir: Path, truth: bool = False) -> tuple[list[Batch], float]:
    """The batches the demo's pipeline hands its exporters for ``windows`` windows, and the pipeline's CPU."""
    doc = load_document(ROOT / "collector-config" / "demo.yaml")
    sim = doc["receivers"]["sim"]
    sim["nodes"] = max(1, gpus // 8)
    sim["jobs"] = [{"id": f"train-{n}", "scenario": "steady", "gpus": 8, "node": n} for n in range(sim["nodes"])]
    sim.pop("throttled_nodes", None)
    sim["emit_truth"] = truth
    doc["receivers"] = {"sim": sim}
    doc["exporters"] = {"file": {"path": str(out_dir / "unused")}}  # the pipeline's processors are run here directly
    doc["service"]["pipelines"] = {"metrics": {**doc["service"]["pipelines"]["metrics"], "exporters": ["file"]}}
    service = Service(parse_service_config(doc, "demo.yaml", registry.factories()))
    for processor in service.processors:
        processor.start()
    config = service.config.components["receivers"]["sim"]
    fleet = sim_receiver.build_fleet(config, start_unix_s=1_767_225_600.0)
    out = []
    started = time.process_time()
    for _ in range(windows):
        batch = sim_receiver.window_batch(fleet.step_window(), config.emit_truth)
        for processor in service.processors:
            batch = processor.process(batch)
        out.append(batch)
    cpu = time.process_time() - started
    for processor in service.processors:
        processor.shutdown()
    return out, cpu


def measure(gpus: int, windows: int, warmup: int, out_dir: Path, truth: bool = False) -> dict:
    batches, pipeline_cpu = fleet_batches(gpus, windows, out_dir, truth)
    gpus = len({s.gpu_key() for s in batches[0].samples}) or gpus
    timed = windows - warmup
    pipeline_per_window = pipeline_cpu / windows
    result: dict = {"gpus": gpus, "windows": windows, "warmup_windows": warmup, "sim_truth": truth,
                    "points_per_window": batches[-1].point_count(),
                    "pipeline_cpu_s_per_window": round(pipeline_per_window, 4), "variants": {}}
    for name, extra in VARIANTS.items():
        caches.release_all()
        path = out_dir / f"{name}.out"
        config = build_config(FACTORY.config_type, {"path": str(path), **extra})
        made = (JsonFormatExporter if name == "json_format" else FileExporter)(config, Context("file"))
        made.start()
        for batch in batches[:warmup]:
            made.export(batch)
        size_before = path.stat().st_size
        started = time.process_time()
        for batch in batches[warmup:]:
            made.export(batch)
        cpu = time.process_time() - started
        made.shutdown()
        per_window = cpu / timed
        whole = per_window + pipeline_per_window
        result["variants"][name] = {
            "exporter_cpu_s_per_window": round(per_window, 4),
            "exporter_gpu_windows_per_cpu_s": round(gpus / per_window),
            "fleet_gpu_windows_per_cpu_s": round(gpus / whole),
            "exporter_share_of_fleet_cpu": round(per_window / whole, 3),
            "day_exporter_cpu_min": round(DAY_GPU_WINDOWS / (gpus / per_window) / 60, 1),
            "day_fleet_cpu_min": round(DAY_GPU_WINDOWS / (gpus / whole) / 60, 1),
            "bytes_per_gpu_window": round((path.stat().st_size - size_before) / (gpus * timed), 1),
        }
    before = result["variants"]["json_format"]["exporter_cpu_s_per_window"]
    for row in result["variants"].values():
        row["exporter_speedup_vs_json_format"] = round(before / row["exporter_cpu_s_per_window"], 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=1000, help="simulated GPUs (8 per node)")
    parser.add_argument("--windows", type=int, default=12, help="10 s windows made (the first --warmup not timed)")
    parser.add_argument("--warmup", type=int, default=2, help="windows each exporter writes before the clock starts")
    parser.add_argument("--truth", action="store_true",
                        help="with the simulator's truth series (sim.gpu.mfu.true, emit_truth: the demo's default)")
    parser.add_argument("--json", action="store_true", help="print the JSON object only")
    args = parser.parse_args()
    if args.windows <= args.warmup:
        parser.error("--windows must be more than --warmup")
    with tempfile.TemporaryDirectory() as tmp:
        result = measure(args.gpus, args.windows, args.warmup, Path(tmp), args.truth)
    if args.json:
        print(json.dumps(result))
        return
    print(f"{result['gpus']} GPUs, {result['windows'] - args.warmup} timed windows, {result['points_per_window']} "
          f"points a window; pipeline {result['pipeline_cpu_s_per_window']} CPU-s a window")
    for name, row in result["variants"].items():
        print(f"{name:12} exporter {row['exporter_cpu_s_per_window']:.4f} CPU-s/window "
              f"({row['exporter_gpu_windows_per_cpu_s']:,} GPU-windows/CPU-s, "
              f"x{row['exporter_speedup_vs_json_format']}), fleet {row['fleet_gpu_windows_per_cpu_s']:,} "
              f"GPU-windows/CPU-s, a day {row['day_fleet_cpu_min']} CPU-min, "
              f"{row['bytes_per_gpu_window']} B/GPU-window")


if __name__ == "__main__":
    main()
