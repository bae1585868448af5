"""Bytes the demo writes per GPU-window, by file exporter setting (BENCHMARKS.md, section File size).

Runs the demo's own pipeline (collector-config/demo.yaml: the sim fleet of 2 nodes x 8 GPUs,
the ofu and jobs processors) for a fixed number of 10 s windows, without wall-clock pacing,
into file exporters that differ only in their settings, and divides each file's size by the
GPU-windows written (GPUs x windows):

- ``before``: every line repeats every metric's description (the exporter before this change,
  ``repeat_descriptions: true``);
- ``after``: descriptions once per file (the default now);
- ``zstd`` / ``gzip``: ``after`` plus ``compression``.

    .venv/bin/python benchmarks/file_size.py [--windows 360] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from otel_ofu.pipeline import registry  # noqa: E402
from otel_ofu.pipeline.config import load_document, parse_service_config  # noqa: E402
from otel_ofu.pipeline.service import Service  # noqa: E402
from otel_ofu.receivers import sim as sim_receiver  # noqa: E402

VARIANTS = {
    "before": {"repeat_descriptions": True},
    "after": {},
    "zstd": {"compression": "zstd"},
    "gzip": {"compression": "gzip"},
}


def measure(windows: int, out_dir: Path) -> dict:
    doc = load_document(ROOT / "collector-config" / "demo.yaml")
    doc["exporters"] = {f"file/{name}": {"path": str(out_dir / f"{name}.jsonl"), **extra}
                        for name, extra in VARIANTS.items()}
    # The demo's GPU pipeline only: its self-telemetry pipeline (metrics/self) is not what is measured.
    doc["service"]["pipelines"] = {"metrics": {**doc["service"]["pipelines"]["metrics"],
                                               "exporters": list(doc["exporters"])}}
    doc["receivers"] = {"sim": doc["receivers"]["sim"]}
    service = Service(parse_service_config(doc, "demo.yaml", registry.factories()))
    for slot in service.exporters.values():
        slot.exporter.start()
    for processor in service.processors:
        processor.start()
    receiver_config = service.config.components["receivers"]["sim"]
    fleet = sim_receiver.build_fleet(receiver_config, start_unix_s=1_767_225_600.0)
    pipeline = service.pipelines[0]
    gpus = receiver_config.nodes * receiver_config.gpus_per_node
    for _ in range(windows):
        pipeline.consume(sim_receiver.window_batch(fleet.step_window(), receiver_config.emit_truth))
    pipeline.flush()
    for component in [*service.processors, *(s.exporter for s in service.exporters.values())]:
        component.shutdown()
    gpu_windows = gpus * windows
    # The demo runs time_acceleration x faster than the wall clock: windows per wall minute.
    per_minute = receiver_config.time_acceleration / float(receiver_config.collection_interval) * 60
    out = {"windows": windows, "gpus": gpus, "gpu_windows": gpu_windows, "variants": {}}
    for name in VARIANTS:
        size = (out_dir / f"{name}.jsonl").stat().st_size
        out["variants"][name] = {"bytes": size, "bytes_per_gpu_window": round(size / gpu_windows, 1),
                                 "demo_mb_per_wall_minute": round(size / windows * per_minute / 1e6, 2)}
    before = out["variants"]["before"]["bytes_per_gpu_window"]
    for row in out["variants"].values():
        row["vs_before"] = round(row["bytes_per_gpu_window"] / before, 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, default=360, help="10 s windows of fleet time (360 = 1 hour)")
    parser.add_argument("--json", action="store_true", help="print the JSON object only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = measure(args.windows, Path(tmp))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{result['gpus']} GPUs x {result['windows']} windows = {result['gpu_windows']} GPU-windows")
    print(f"{'variant':8} {'bytes':>12} {'B/GPU-window':>13} {'vs before':>10} {'demo MB/min':>12}")
    for name, row in result["variants"].items():
        print(f"{name:8} {row['bytes']:>12,} {row['bytes_per_gpu_window']:>13,.1f} {row['vs_before']:>10.3f} "
              f"{row['demo_mb_per_wall_minute']:>12.2f}")


if __name__ == "__main__":
    main()
