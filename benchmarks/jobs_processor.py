"""The jobs processor alone, in one process: its CPU per GPU window, in memory or with its state on disk.

Why: a jobs-tier instance's CPU (benchmarks/fleet.py) is the otlp receiver's decoding, the ``jobs``
processor and the export together, and on a shared machine its run-to-run spread hides a change of
a tenth in the processor. This feeds the processor alone what a directly fed instance gets (one
batch per node and 10 s window: its 8 GPUs' ``gpu.ofu``, ``gpu.flops.achieved`` and ``gpu.ofu.loss``
points as the ``ofu`` processor makes them, jobs of 16 nodes, one GPU in ten without a job), made
before the clock starts, and times every window after the first two (``time.process_time``). Each
batch is marked exported, as the service does after its exporters took it (the journal's mark, a
checkpoint when due).

The measured part runs inside ``functools.reduce``, so callgrind can count its instructions alone,
noise-free where CPU time on a shared machine is not:

    python benchmarks/jobs_processor.py --json                        # 2,000 GPUs, 12 windows (2 bins close)
    python benchmarks/jobs_processor.py --storage --json              # with the state on disk (journal)
    valgrind --tool=callgrind --toggle-collect=functools_reduce \\
        python benchmarks/jobs_processor.py --gpus 512 --windows 12   # instructions per GPU window
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from otel_ofu.core.model import Batch, GpuSample, MetricPoint  # noqa: E402
from otel_ofu.jobs.config import JobsConfig  # noqa: E402
from otel_ofu.pipeline.component import Context  # noqa: E402
from otel_ofu.pipeline.config import build_config  # noqa: E402
from otel_ofu.processors.jobs import JobsProcessor  # noqa: E402
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig  # noqa: E402

GPUS_PER_NODE = 8
NODES_PER_JOB = 16
INTERVAL_S = 10
T0 = 1_767_225_600
READ = frozenset({"gpu.ofu", "gpu.flops.achieved", "gpu.ofu.loss"})  # what a jobs instance decodes
WARM_WINDOWS = 2  # every GPU and job new: not timed


def batches(gpus: int, windows: int) -> list[list[MetricPoint]]:
    """Per window and node, the points the jobs processor reads of its GPUs (as fleet.py's node agents)."""
    ofu = OfuProcessor(OfuProcessorConfig(), Context("ofu"))
    out = []
    for w in range(windows):
        for node in range(max(1, gpus // GPUS_PER_NODE)):
            samples = []
            for g in range(GPUS_PER_NODE):
                idle = (node * GPUS_PER_NODE + g) % 10 == 9
                samples.append(GpuSample(
                    (T0 + INTERVAL_S * (w + 1)) * 10**9, float(INTERVAL_S), f"gpu-node-{node:05d}", g,
                    f"GPU-{node:05d}-{g}", "NVIDIA H100 80GB HBM3", 0.40 + 0.01 * ((node + g + w) % 10), 1755.0, 10,
                    1980.0, 610.0, 0, 0.93, source="dcgm", job_id=None if idle else f"job-{node // NODES_PER_JOB:05d}",
                    precision=None if idle else "bf16",
                    resource={"k8s.namespace.name": "llm", "k8s.pod.name": f"train-{node // NODES_PER_JOB}-{node}"}))
            out.append([p for p in ofu.process(Batch(samples=samples)).points if p.name in READ])
    return out


def run(gpus: int, windows: int, storage: bool) -> dict:
    work = batches(gpus, windows)
    with tempfile.TemporaryDirectory(prefix="ofu-jobs-") as tmp:
        settings = {"default_interval": f"{INTERVAL_S}s", **({"storage": tmp} if storage else {})}
        now = [float(T0)]
        proc = JobsProcessor(build_config(JobsConfig, settings), Context("jobs"), clock=lambda: now[0])
        proc.start()

        def one(_: None, points: list[MetricPoint]) -> None:
            now[0] = points[0].time_unix_nano / 1e9 + 1  # the processor's clock: just after the window
            proc.process(Batch(points=points))
            proc.exported()

        warm = WARM_WINDOWS * max(1, gpus // GPUS_PER_NODE)
        for points in work[:warm]:  # not in reduce: callgrind counts the timed part alone
            one(None, points)
        started = time.process_time()
        functools.reduce(one, work[warm:], None)
        spent = time.process_time() - started
        proc.shutdown()
    timed = (windows - WARM_WINDOWS) * max(1, gpus // GPUS_PER_NODE) * GPUS_PER_NODE
    return {"gpus": gpus, "windows": windows, "storage": storage, "gpu_windows": timed, "cpu_s": spent,
            "us_per_gpu_window": spent * 1e6 / timed if timed else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=2000)
    parser.add_argument("--windows", type=int, default=12, help="10 s windows (the first two not timed; default 12)")
    parser.add_argument("--storage", action="store_true", help="the state on disk (jobs storage: the journal)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.windows <= WARM_WINDOWS:
        parser.error(f"--windows must be more than {WARM_WINDOWS}")
    out = run(args.gpus, args.windows, args.storage)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"jobs processor: {out['us_per_gpu_window']:.1f} us CPU per GPU window ({out['gpu_windows']:,} GPU "
              f"windows, storage {'on' if args.storage else 'off'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
