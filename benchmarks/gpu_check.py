"""GPU check: the nvml receiver's OFU next to a torch GEMM's measured MFU, on a real NVIDIA GPU.

    python benchmarks/gpu_check.py --seconds 60 --size 8192 --dtype bf16 --window 5

A square GEMM loop runs on GPU 0 (torch, imported lazily) while the ``nvml`` receiver reads
GPM tensor activity and SM clocks on its own thread; each receiver window is printed with
TPA, the mean SM clock, OFU (raw and tile-corrected) and the GEMM's MFU over the same window:
2*M*N*K per GEMM / CUDA-event time / the dense peak for the dtype from otel_ofu.core.specs.
Expect OFU a little above MFU (REFERENCE.md section 1: 1-3 pp raw, <= 2 pp corrected).

Without torch, CUDA or a GPU it says so and exits 0; on a GPU without GPM (before Hopper) it
prints the receiver's reason and exits 0.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from dataclasses import dataclass

from otel_ofu.core import specs
from otel_ofu.core.model import Batch
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import build_config
from otel_ofu.pipeline.telemetry import Telemetry
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig
from otel_ofu.receivers.nvml import NvmlReceiver, NvmlReceiverConfig

TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "tf32": "float32"}


@dataclass
class Chunk:
    done_s: float  # wall time the chunk finished
    flops: float
    gpu_s: float  # CUDA-event time of the chunk


def gemm_loop(torch, stop: threading.Event, size: int, dtype: str, chunks: list[Chunk], iters: int = 20) -> None:
    if dtype == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
    dt = getattr(torch, TORCH_DTYPES[dtype])
    a = torch.randn(size, size, device="cuda", dtype=dt)
    b = torch.randn(size, size, device="cuda", dtype=dt)
    c = torch.empty(size, size, device="cuda", dtype=dt)
    for _ in range(3):
        torch.mm(a, b, out=c)
    torch.cuda.synchronize()
    while not stop.is_set():
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            torch.mm(a, b, out=c)
        end.record()
        end.synchronize()
        chunks.append(Chunk(time.time(), iters * 2.0 * size**3, start.elapsed_time(end) / 1e3))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--size", type=int, default=8192, help="M = N = K")
    parser.add_argument("--dtype", choices=sorted(TORCH_DTYPES), default="bf16")
    parser.add_argument("--window", type=float, default=5.0, help="GPM window (collection_interval), seconds")
    parser.add_argument("--clock-interval", type=float, default=1.0, help="SM clock sampling, seconds")
    args = parser.parse_args(argv)

    try:
        import torch
    except ImportError:
        print("gpu_check: torch is not installed; nothing to compare (pip install torch on a GPU machine).")
        return 0
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU visible to torch; run this on a machine with an NVIDIA GPU.")
        return 0
    name = torch.cuda.get_device_name(0)
    spec = specs.find_spec(name)
    peak = spec.peak(args.dtype) if spec else None
    if peak is None:
        print(f"gpu_check: {name} is not in otel_ofu.specs (or has no {args.dtype} peak); MFU cannot be computed.")
        return 0

    rows: list[tuple] = []
    processor = OfuProcessor(OfuProcessorConfig(), Context("ofu"))

    def consume(batch: Batch) -> None:
        for sample in batch.samples:
            if sample.gpu_index != 0:
                continue
            sample.precision = args.dtype
            points = {p.name: p.value for p in processor.sample_points(sample)}
            rows.append((sample, points))

    config = build_config(NvmlReceiverConfig, {"collection_interval": args.window,
                                               "clock_sample_interval": args.clock_interval, "gpu_indices": [0]})
    receiver = NvmlReceiver(config, Context("nvml", Telemetry()), consume)
    chunks: list[Chunk] = []
    stop = threading.Event()
    receiver.start()
    print(f"gpu_check: {name}, {args.size}^3 {args.dtype} GEMMs for {args.seconds:.0f}s; dense peak "
          f"{peak.flops / 1e12:.1f} TFLOP/s at {peak.clock_mhz:.0f} MHz; window {args.window:g}s")
    timer = threading.Timer(args.seconds, stop.set)
    timer.start()
    try:
        gemm_loop(torch, stop, args.size, args.dtype, chunks)
    finally:
        stop.set()
        timer.cancel()
        receiver.shutdown()

    if receiver.status.state != "ok" or not rows:
        print(f"gpu_check: the nvml receiver produced no OFU: {receiver.status.state}: {receiver.status.message}")
        return 0
    print(f"{'window end':>10} {'TPA':>6} {'SM MHz':>7} {'n':>3} {'max':>5} {'OFU raw':>8} {'OFU':>6} "
          f"{'MFU':>6} {'OFU-MFU pp':>10}")
    diffs = []
    for sample, points in rows:
        end_s = sample.time_unix_nano / 1e9
        inside = [c for c in chunks if end_s - sample.window_s < c.done_s <= end_s]
        gpu_s = sum(c.gpu_s for c in inside)
        mfu = sum(c.flops for c in inside) / gpu_s / peak.flops if gpu_s else None
        ofu = points.get("gpu.ofu")
        diff = (ofu - mfu) * 100 if ofu is not None and mfu is not None else None
        if diff is not None:
            diffs.append(diff)
        print(f"{time.strftime('%H:%M:%S', time.localtime(end_s)):>10} {_f(points.get('gpu.tensor.activity'))} "
              f"{_f(sample.sm_clock_mhz, 7, 0)} {sample.sm_clock_samples:>3} {_f(sample.max_sm_clock_mhz, 5, 0)} "
              f"{_f(points.get('gpu.ofu.raw'), 8)} {_f(ofu)} {_f(mfu)} {_f(diff, 10, 2)}")
    steady = diffs[1:-1] or diffs
    if steady:
        print(f"mean OFU - MFU over {len(steady)} steady window(s): {sum(steady) / len(steady):+.2f} pp")
    return 0


def _f(value: object, width: int = 6, digits: int = 3) -> str:
    if not isinstance(value, (int, float)):
        return "-".rjust(width)
    return f"{value:>{width}.{digits}f}"


if __name__ == "__main__":
    sys.exit(main())
