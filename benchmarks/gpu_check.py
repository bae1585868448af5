"""GPU check: the nvml receiver's OFU next to a torch GEMM's measured MFU, on a real NVIDIA GPU.

    python benchmarks/gpu_check.py --seconds 60 --size 8192 --dtype bf16 --window 5
    python benchmarks/gpu_check.py --json          # one JSON object (what benchmarks/device_run.sh keeps)

A square GEMM loop runs on one GPU (torch, imported lazily) while the ``nvml`` receiver reads
GPM tensor activity and SM clocks on its own thread, and a second thread reads the SM clock
every 100 ms straight from NVML. Per receiver window it records TPA, the receiver's averaged
clock, the 100 ms clocks (mean, min, max, and the last one before the window ends: the
paper's one-sample "point" clock), raw OFU from the averaged and from the point clock,
corrected OFU, and the GEMM's MFU over the same window (2*M*N*K per GEMM / CUDA-event time /
the dense peak for the dtype from ``otel_ofu.core.specs``). Expect OFU a little above MFU
(REFERENCE.md section 1: 1-3 pp raw, <= 2 pp corrected).

To check the spec table's entry for the GPU it also records what NVML says about clocks
(max SM clock, max customer boost, default application clock, power limit), every clock seen
under the long GEMM, and the per-SM dense rate the measurement implies (achieved FLOP/s /
(TPA x mean clock x SMs), next to the table's per-SM rate).

Without torch, CUDA or a GPU it says so ("no GPU: ...") and exits 0; with a GPU whose OFU
cannot be read (no GPM before Hopper, or GPM refused) it reports MFU and clocks, says why
there is no OFU and exits 3; SIGTERM ends the GEMM loop early and reports what it has.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from otel_ofu.core import specs
from otel_ofu.core.model import Batch, GpuSample
from otel_ofu.core.ofu import OfuResult, compute_ofu
from otel_ofu.gpu import nvml_api
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


@dataclass
class ClockReading:
    t: float  # wall time, seconds
    mhz: float | None
    reasons: int | None  # clock event reasons bitmask
    power_w: float | None


def gemm_loop(torch: Any, stop: threading.Event, size: int, dtype: str, chunks: list[Chunk], iters: int = 20) -> None:
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    dt = getattr(torch, TORCH_DTYPES[dtype])
    a = torch.randn(size, size, device="cuda", dtype=dt)
    b = torch.randn(size, size, device="cuda", dtype=dt)
    c = torch.empty(size, size, device="cuda", dtype=dt)
    for _ in range(3):
        torch.mm(a, b, out=c)
    torch.cuda.synchronize()
    # Two chunks in flight: the next one is queued before waiting on the last, so the GPU never idles
    # between chunks (an idle gap would lower TPA but not the chunks' event-timed MFU).
    pending: tuple[Any, Any] | None = None
    while not stop.is_set():
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            torch.mm(a, b, out=c)
        end.record()
        if pending:
            _finish(pending, chunks, iters * 2.0 * size**3)
        pending = (start, end)
    if pending:
        _finish(pending, chunks, iters * 2.0 * size**3)


def _finish(events: tuple[Any, Any], chunks: list[Chunk], flops: float) -> None:
    start, end = events
    end.synchronize()
    chunks.append(Chunk(time.time(), flops, start.elapsed_time(end) / 1e3))


def _try(api: Any, function: str, *args: Any) -> Any:
    """A reading that is nice to have: None when this NVML (or driver, or pynvml) does not offer it."""
    try:
        value = getattr(api, function)(*args)
    except Exception:  # noqa: BLE001 - NVMLError, or a function this pynvml lacks
        return None
    return value.decode() if isinstance(value, bytes) else value


class ClockSampler:
    """The SM clock (and clock event reasons, power) every ``period`` seconds, straight from NVML."""

    def __init__(self, api: Any, handle: Any, period: float):
        self.api, self.handle, self.period = api, handle, period
        self.readings: list[ClockReading] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="clock-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        api, handle = self.api, self.handle
        names = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")  # new, old
        reasons_call = next((name for name in names if hasattr(api, name)), None)
        try:
            while not self._stop.wait(self.period):
                mhz = api.nvmlDeviceGetClockInfo(handle, api.NVML_CLOCK_SM)
                reasons = _try(api, reasons_call, handle) if reasons_call else None
                power_mw = _try(api, "nvmlDeviceGetPowerUsage", handle)
                self.readings.append(ClockReading(time.time(), float(mhz), reasons,
                                                  power_mw / 1e3 if isinstance(power_mw, (int, float)) else None))
        except Exception as exc:  # noqa: BLE001 - reported with the results
            self.error = f"{type(exc).__name__}: {exc}"


def device_info(api: Any, handle: Any, torch: Any, index: int) -> dict[str, Any]:
    """What NVML and torch say about the GPU: identity and every clock figure the spec table has."""
    props = torch.cuda.get_device_properties(index)
    sm_clock = api.NVML_CLOCK_SM
    power_limit = _try(api, "nvmlDeviceGetEnforcedPowerLimit", handle)
    mem_clocks = _try(api, "nvmlDeviceGetSupportedMemoryClocks", handle) or []
    graphics = _try(api, "nvmlDeviceGetSupportedGraphicsClocks", handle, max(mem_clocks)) if mem_clocks else None
    return {
        "index": index, "name": _try(api, "nvmlDeviceGetName", handle), "uuid": _try(api, "nvmlDeviceGetUUID", handle),
        "driver": _try(api, "nvmlSystemGetDriverVersion"), "torch": str(torch.__version__),
        "cuda": str(torch.version.cuda), "sm_count": int(props.multi_processor_count),
        "max_sm_clock_mhz": _try(api, "nvmlDeviceGetMaxClockInfo", handle, sm_clock),
        "max_customer_boost_mhz": _try(api, "nvmlDeviceGetMaxCustomerBoostClock", handle, sm_clock),
        "default_application_sm_clock_mhz": _try(api, "nvmlDeviceGetDefaultApplicationsClock", handle, sm_clock),
        "application_sm_clock_mhz": _try(api, "nvmlDeviceGetApplicationsClock", handle, sm_clock),
        "supported_sm_clocks_max_mhz": max(graphics) if graphics else None,
        "power_limit_w": power_limit / 1e3 if isinstance(power_limit, (int, float)) else None,
    }


def window_rows(samples: list[tuple[GpuSample, dict[str, float]]], readings: list[ClockReading],
                chunks: list[Chunk], model: str, dtype: str, peak_flops: float) -> list[dict[str, Any]]:
    """One row per receiver window: TPA, clocks (receiver mean, 100 ms mean, point, min, max), OFU, MFU, gaps."""
    rows = []
    for sample, points in samples:
        end_s = sample.time_unix_nano / 1e9
        start_s = end_s - float(sample.window_s)
        inside = [c for c in chunks if start_s < c.done_s <= end_s]
        gpu_s = sum(c.gpu_s for c in inside)
        achieved = sum(c.flops for c in inside) / gpu_s if gpu_s else None
        mfu = achieved / peak_flops if achieved is not None else None
        clocks = [r.mhz for r in readings if start_s < r.t <= end_s and r.mhz is not None]
        before = [r.mhz for r in readings if r.t <= end_s and r.mhz is not None]
        point = before[-1] if before else None
        reasons = 0
        for r in readings:
            if start_s < r.t <= end_s and isinstance(r.reasons, int):
                reasons |= r.reasons
        tpa = points.get("gpu.tensor.activity")
        raw = points.get("gpu.ofu.raw")
        corrected = points.get("gpu.ofu")
        raw_point = _raw(tpa, point, model, dtype, sample.max_sm_clock_mhz)
        raw_100ms = _raw(tpa, statistics.fmean(clocks) if clocks else None, model, dtype, sample.max_sm_clock_mhz)
        rows.append({
            "end_unix_s": end_s, "window_s": float(sample.window_s), "tpa": tpa,
            "clock_receiver_mhz": _num(sample.sm_clock_mhz), "clock_receiver_samples": sample.sm_clock_samples,
            "clock_100ms_mean_mhz": statistics.fmean(clocks) if clocks else None,
            "clock_point_mhz": point, "clock_min_mhz": min(clocks) if clocks else None,
            "clock_max_mhz": max(clocks) if clocks else None, "clock_samples": len(clocks),
            "clock_event_reasons": reasons, "ofu_raw": raw, "ofu_raw_point": raw_point, "ofu_raw_100ms": raw_100ms,
            "ofu_corrected": corrected, "mfu": mfu, "achieved_tflops": achieved / 1e12 if achieved else None,
            "gap_raw_pp": _pp(raw, mfu), "gap_corrected_pp": _pp(corrected, mfu),
        })
    return rows


def summarize(rows: list[dict[str, Any]], readings: list[ClockReading], spec: specs.GpuSpec, dtype: str,
              device: dict[str, Any]) -> dict[str, Any]:
    """Steady windows (first and last left out when there are three or more): means, clocks, spec check."""
    steady = rows[1:-1] if len(rows) >= 3 else rows
    full = [r for r in steady if r["mfu"] is not None and r["ofu_raw"] is not None]
    out: dict[str, Any] = {"windows": len(rows), "steady_windows": len(steady), "windows_with_ofu": len(full)}
    if steady:
        lo, hi = steady[0]["end_unix_s"] - steady[0]["window_s"], steady[-1]["end_unix_s"]
        under = [r.mhz for r in readings if lo < r.t <= hi and r.mhz is not None]
    else:
        under = []
    if under:
        counts: dict[float, int] = {}
        for mhz in under:
            counts[mhz] = counts.get(mhz, 0) + 1
        out["clocks_under_gemm"] = {
            "samples": len(under), "min_mhz": min(under), "max_mhz": max(under), "mean_mhz": statistics.fmean(under),
            "median_mhz": statistics.median(under),
            "most_seen": [[mhz, n] for mhz, n in sorted(counts.items(), key=lambda kv: -kv[1])[:5]]}
    mfus = [r["mfu"] for r in steady if r["mfu"] is not None]
    if mfus:
        out["mfu_mean"] = statistics.fmean(mfus)
        out["achieved_tflops_mean"] = statistics.fmean(r["achieved_tflops"] for r in steady if r["achieved_tflops"])
    if full:
        for key in ("ofu_raw", "ofu_corrected", "gap_raw_pp", "gap_corrected_pp"):
            out[f"{key}_mean"] = statistics.fmean(r[key] for r in full)
        out["implied_factor"] = sum(r["mfu"] * r["ofu_raw"] for r in full) / sum(r["ofu_raw"] ** 2 for r in full)
        point = [(r["ofu_raw_point"] - r["ofu_raw"]) * 100 for r in full if r["ofu_raw_point"] is not None]
        fine = [(r["ofu_raw_100ms"] - r["ofu_raw"]) * 100 for r in full if r["ofu_raw_100ms"] is not None]
        out["point_vs_averaged"] = {
            "windows": len(point),
            "point_minus_averaged_pp_mean": statistics.fmean(point) if point else None,
            "point_minus_averaged_pp_std": statistics.stdev(point) if len(point) > 1 else None,
            "point_minus_averaged_pp_max_abs": max(map(abs, point)) if point else None,
            "averaged_100ms_minus_receiver_pp_mean": statistics.fmean(fine) if fine else None}
        per_sm = [r["achieved_tflops"] * 1e12 / (r["tpa"] * r["clock_receiver_mhz"] * 1e6 * device["sm_count"])
                  for r in full if r["tpa"] and r["clock_receiver_mhz"] and r["achieved_tflops"]]
        if per_sm:
            out["implied_flop_per_sm_clock"] = statistics.fmean(per_sm)
    peak = spec.peak(dtype)
    out["spec_check"] = {
        "spec": spec.key, "spec_max_sm_clock_mhz": spec.max_sm_clock_mhz,
        "nvml_max_sm_clock_mhz": device.get("max_sm_clock_mhz"),
        "max_clock_matches": device.get("max_sm_clock_mhz") == spec.max_sm_clock_mhz,
        "spec_tensor_ref_clock_mhz": spec.tensor_ref_clock_mhz, "spec_sm_count": spec.sm_count,
        "torch_sm_count": device.get("sm_count"), "sm_count_matches": device.get("sm_count") == spec.sm_count,
        "spec_peak_tflops": peak.flops / 1e12 if peak else None,
        "spec_flop_per_sm_clock": peak.flops / (spec.sm_count * peak.clock_mhz * 1e6) if peak else None,
        # MFU x f_ref / mean clock: the share of the peak at the clock actually run; above 1 means the peak is low
        "mfu_at_run_clock": (out["mfu_mean"] * spec.ref_clock_mhz(dtype) / out["clocks_under_gemm"]["mean_mhz"]
                             if mfus and under else None),
    }
    return out


def _raw(tpa: object, clock: object, model: str, dtype: str, max_clock: object) -> float | None:
    result = compute_ofu(tpa, clock, model, dtype, max_clock) if tpa is not None and clock is not None else None
    return result.raw if isinstance(result, OfuResult) else None


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and value == value else None


def _pp(a: float | None, b: float | None) -> float | None:
    return (a - b) * 100 if a is not None and b is not None else None


def _no_gpu(reason: str, as_json: bool) -> int:
    if as_json:
        print(json.dumps({"gpu": False, "reason": reason}))
    else:
        print(f"gpu_check: {reason}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--size", type=int, default=8192, help="M = N = K")
    parser.add_argument("--dtype", choices=sorted(TORCH_DTYPES), default="bf16")
    parser.add_argument("--window", type=float, default=5.0, help="GPM window (collection_interval), seconds")
    parser.add_argument("--clock-interval", type=float, default=1.0, help="the receiver's SM clock sampling, seconds")
    parser.add_argument("--point-interval", type=float, default=0.1, help="this script's own clock sampling, seconds")
    parser.add_argument("--device", type=int, default=0, help="NVML / CUDA index")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)

    try:
        import torch
    except ImportError:
        return _no_gpu("no GPU: torch is not installed; nothing to compare (run this on a machine with an NVIDIA "
                       "GPU and torch)", args.json)
    if not torch.cuda.is_available():
        return _no_gpu("no GPU: no CUDA GPU visible to torch; run this on a machine with an NVIDIA GPU", args.json)
    torch.cuda.set_device(args.device)
    api = nvml_api.get_loader()()
    api.nvmlInit()
    handle = api.nvmlDeviceGetHandleByIndex(args.device)
    device = device_info(api, handle, torch, args.device)
    name = device["name"] or torch.cuda.get_device_name(args.device)
    spec = specs.find_spec(name)
    peak = spec.peak(args.dtype) if spec else None
    result: dict[str, Any] = {"gpu": True, "device": device, "dtype": args.dtype, "size": args.size,
                              "seconds": args.seconds, "window_s": args.window,
                              "clock_interval_s": args.clock_interval, "point_interval_s": args.point_interval}
    if spec is None or peak is None:
        result["error"] = f"{name} is not in otel_ofu.core.specs (or has no {args.dtype} peak); MFU cannot be computed"
        print(json.dumps(result) if args.json else f"gpu_check: {result['error']}")
        return 2
    result["spec"] = spec.key

    samples: list[tuple[GpuSample, dict[str, float]]] = []
    processor = OfuProcessor(OfuProcessorConfig(), Context("ofu"))

    def consume(batch: Batch) -> None:
        for sample in batch.samples:
            if sample.gpu_index != args.device:
                continue
            sample.precision = args.dtype
            samples.append((sample, {p.name: p.value for p in processor.sample_points(sample)}))

    config = build_config(NvmlReceiverConfig, {"collection_interval": args.window,
                                               "clock_sample_interval": args.clock_interval,
                                               "gpu_indices": [args.device]})
    receiver = NvmlReceiver(config, Context("nvml", Telemetry()), consume)
    clocks = ClockSampler(api, handle, args.point_interval)
    chunks: list[Chunk] = []
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())  # report what ran so far
    if not args.json:
        print(f"gpu_check: {name}, {args.size}^3 {args.dtype} GEMMs for {args.seconds:.0f}s; dense peak "
              f"{peak.flops / 1e12:.1f} TFLOP/s at {peak.clock_mhz:.0f} MHz; window {args.window:g}s")
    clocks.start()
    receiver.start()
    timer = threading.Timer(args.seconds, stop.set)
    timer.start()
    try:
        gemm_loop(torch, stop, args.size, args.dtype, chunks)
    finally:
        interrupted = not timer.finished.is_set()
        stop.set()
        timer.cancel()
        clocks.stop()
        receiver.shutdown()
        signal.signal(signal.SIGTERM, previous)

    rows = window_rows(samples, clocks.readings, chunks, name, args.dtype, peak.flops)
    result.update({"interrupted": interrupted, "receiver_state": receiver.status.state,
                   "receiver_message": receiver.status.message, "clock_sampler_error": clocks.error,
                   "windows": rows, "summary": summarize(rows, clocks.readings, spec, args.dtype, device),
                   "clock_readings": [asdict(r) for r in clocks.readings]})
    has_ofu = any(r["ofu_raw"] is not None for r in rows)
    if not has_ofu:
        result["error"] = (f"the nvml receiver produced no OFU: {receiver.status.state}: "
                           f"{receiver.status.message}")
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)
    return 0 if has_ofu else 3


def print_table(result: dict[str, Any]) -> None:
    if result.get("error"):
        print(f"gpu_check: {result['error']}")
    print(f"{'window end':>10} {'TPA':>6} {'SM MHz':>7} {'point':>6} {'min':>5} {'max':>5} {'OFU raw':>8} "
          f"{'pt raw':>7} {'OFU':>6} {'MFU':>6} {'OFU-MFU pp':>10}")
    for r in result["windows"]:
        print(f"{time.strftime('%H:%M:%S', time.localtime(r['end_unix_s'])):>10} {_f(r['tpa'])} "
              f"{_f(r['clock_receiver_mhz'], 7, 0)} {_f(r['clock_point_mhz'], 6, 0)} {_f(r['clock_min_mhz'], 5, 0)} "
              f"{_f(r['clock_max_mhz'], 5, 0)} {_f(r['ofu_raw'], 8)} {_f(r['ofu_raw_point'], 7)} "
              f"{_f(r['ofu_corrected'])} {_f(r['mfu'])} {_f(r['gap_corrected_pp'], 10, 2)}")
    summary = result["summary"]
    if "gap_corrected_pp_mean" in summary:
        print(f"mean OFU - MFU over {summary['windows_with_ofu']} steady window(s): "
              f"{summary['gap_corrected_pp_mean']:+.2f} pp (raw {summary['gap_raw_pp_mean']:+.2f} pp)")
    print("spec check: " + json.dumps(summary["spec_check"]))
    if "clocks_under_gemm" in summary:
        print("clocks under the GEMM: " + json.dumps(summary["clocks_under_gemm"]))


def _f(value: object, width: int = 6, digits: int = 3) -> str:
    if not isinstance(value, (int, float)):
        return "-".rjust(width)
    return f"{value:>{width}.{digits}f}"


if __name__ == "__main__":
    sys.exit(main())
