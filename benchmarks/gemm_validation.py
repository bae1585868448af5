"""The paper's controlled experiment: torch GEMMs vs OFU read from the GPU, and a fitted c_tile.

Why: the tile correction (``otel_ofu.core.tiles``) rests on an assumed pipe excess; only a real
GPU can check it. For each dtype (bf16, fp16, tf32, fp8 where the GPU has it) and GEMM shape
(aligned and ragged) this runs back-to-back GEMMs for several OFU windows and compares

- MFU = 2MNK x iterations / CUDA-event time / peak(dtype) (``otel_ofu.core.specs``), with
- OFU read meanwhile: through the ``nvml`` receiver (GPM), through NVML GPM directly
  (ANY_TENSOR_UTIL per window, SM clock every 100 ms: also gives the one-sample "point"
  clock column), and through the ``dcgm`` receiver (or the DCGM bindings' DcgmReader) when
  DCGM is installed. The fit uses the first source that produced rows, in that order.

It prints a table (MFU, raw OFU, corrected OFU, gaps in pp) and one fitted factor per
precision (least squares through the origin, MFU ~ c x OFU_raw) in the form the ``ofu``
processor's ``tile_correction.factors`` takes.

Without a GPU or torch (and with ``--dry-run``) it says so and checks its own plumbing on
synthetic numbers from the simulator: the fit must recover a known factor and the printed
factors must pass the processor's config validation. Exit 0 on success.

    python benchmarks/gemm_validation.py                 # on a machine with an NVIDIA GPU and torch
    python benchmarks/gemm_validation.py --quick         # fewer shapes, shorter (about 2 minutes)
    python benchmarks/gemm_validation.py --dry-run --json
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import logging
import math
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from otel_ofu.core import specs, tiles
from otel_ofu.core.ofu import OfuResult, compute_ofu
from otel_ofu.pipeline.config import build_config
from otel_ofu.sim import fleet as sim

ALIGNED: tuple[tuple[int, int, int], ...] = ((4096, 4096, 4096), (8192, 8192, 8192), (16384, 8192, 4096),
                                             (8192, 28672, 8192))
RAGGED: tuple[tuple[int, int, int], ...] = ((6100, 10922, 4096), (8192, 50257, 4096), (5000, 5000, 5000),
                                            (2050, 8192, 8192))
DTYPES = ("bf16", "fp16", "tf32", "fp8")
DCGM_BINDINGS = ("/usr/share/datacenter-gpu-manager-4/bindings/python3", "/usr/local/dcgm/bindings/python3")


@dataclass
class Row:
    """One (source, dtype, shape) case: the measured MFU and what OFU read over the same run."""

    source: str  # gpm | nvml-receiver | dcgm | sim
    precision: str
    shape: tuple[int, int, int]
    ragged: bool
    mfu: float
    raw: float  # mean raw OFU over the windows inside the run (averaged clock)
    corrected: float  # with the default fleet factor
    windows: int
    raw_point: float | None = None  # raw OFU with one clock sample per window (the paper's method)


# --- fitting and reporting (shared by the GPU run and the dry run) -----------------------------


def fit_factor(pairs: list[tuple[float, float]]) -> float:
    """Least squares through the origin for mfu ~ c x raw: c = sum(mfu raw) / sum(raw^2)."""
    den = sum(raw * raw for _, raw in pairs)
    if den <= 0:
        raise ValueError("no OFU to fit")
    return sum(mfu * raw for mfu, raw in pairs) / den


# Two-sided 95 % Student t quantiles for 1-30 degrees of freedom (stdlib has no t distribution).
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t95(dof: int) -> float:
    """The two-sided 95 % t quantile: the table to 30 degrees of freedom, then 1.96 + 2.5/dof (within 0.003)."""
    if dof < 1:
        raise ValueError("a fit needs at least one degree of freedom")
    return _T95[dof - 1] if dof <= len(_T95) else 1.96 + 2.5 / dof


@dataclass
class Fit:
    """c in MFU ~ c x OFU_raw with its standard error and 95 % half-width (None from one point)."""

    factor: float
    n: int
    se: float | None
    ci95: float | None


def fit_with_uncertainty(pairs: list[tuple[float, float]]) -> Fit:
    """Through-origin least squares; se = sqrt(residual variance / sum(raw^2)), n - 1 degrees of freedom."""
    c = fit_factor(pairs)
    n = len(pairs)
    if n < 2:
        return Fit(c, n, None, None)
    residual = sum((mfu - c * raw) ** 2 for mfu, raw in pairs) / (n - 1)
    se = math.sqrt(residual / sum(raw * raw for _, raw in pairs))
    return Fit(c, n, se, se * t95(n - 1))


def _pairs_by_precision(rows: list[Row]) -> dict[str, list[tuple[float, float]]]:
    by_precision: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        if row.raw > 0:
            by_precision.setdefault(row.precision, []).append((row.mfu, row.raw))
    return dict(sorted(by_precision.items()))


def fit_factors(rows: list[Row], arch: str) -> dict[str, float]:
    """One factor per precision, keyed as ``tile_correction.factors`` takes them ("hopper/bf16")."""
    return {f"{arch}/{p}": round(fit_factor(pairs), 4) for p, pairs in _pairs_by_precision(rows).items()}


def fit_details(rows: list[Row], arch: str) -> dict[str, dict[str, Any]]:
    """Per precision: the fitted factor, its uncertainty, and the table's factor it would replace."""
    out = {}
    for precision, pairs in _pairs_by_precision(rows).items():
        fit = fit_with_uncertainty(pairs)
        out[f"{arch}/{precision}"] = {**dataclasses.asdict(fit),
                                      "table_factor": tiles.correction_factor(arch, precision)}
    return out


def config_snippet(factors: dict[str, float]) -> str:
    lines = ["processors:", "  ofu:", "    tile_correction:", "      factors:"]
    lines += [f'        "{key}": {value:.4f}' for key, value in factors.items()]
    return "\n".join(lines)


def check_factors_config(factors: dict[str, float]) -> None:
    """The printed factors must load as the ``ofu`` processor's config (raises FieldError if not)."""
    from otel_ofu.processors.ofu import OfuProcessorConfig

    build_config(OfuProcessorConfig, {"tile_correction": {"enabled": True, "factors": dict(factors)}})


def table(rows: list[Row]) -> str:
    head = (f"{'source':<13} {'dtype':<5} {'M x N x K':<18} {'kind':<7} {'MFU%':>6} {'raw%':>6} {'corr%':>6} "
            f"{'raw-MFU':>8} {'corr-MFU':>8} {'point%':>7} {'win':>4}")
    out = [head, "-" * len(head)]
    for r in rows:
        point = f"{100 * r.raw_point:7.2f}" if r.raw_point is not None else f"{'-':>7}"
        out.append(f"{r.source:<13} {r.precision:<5} {'x'.join(map(str, r.shape)):<18} "
                   f"{'ragged' if r.ragged else 'aligned':<7} {100 * r.mfu:6.2f} {100 * r.raw:6.2f} "
                   f"{100 * r.corrected:6.2f} {100 * (r.raw - r.mfu):+8.2f} {100 * (r.corrected - r.mfu):+8.2f} "
                   f"{point} {r.windows:4d}")
    return "\n".join(out)


def gap_summary(rows: list[Row]) -> dict[str, float]:
    raw = [abs(r.raw - r.mfu) * 100 for r in rows]
    cor = [abs(r.corrected - r.mfu) * 100 for r in rows]
    return {"raw_gap_pp_median": statistics.median(raw), "raw_gap_pp_max": max(raw),
            "corrected_gap_pp_median": statistics.median(cor), "corrected_gap_pp_max": max(cor),
            "corrected_within_1pp": sum(c <= 1 for c in cor) / len(cor),
            "corrected_within_2pp": sum(c <= 2 for c in cor) / len(cor)}


# --- dry run: synthetic numbers from the simulator --------------------------------------------

DRY_MODEL = "NVIDIA H100 80GB HBM3"
DRY_KNOWN = {"bf16": 0.962, "fp16": 0.958, "tf32": 0.951, "fp8": 0.944}  # known "true" c per precision


def dry_rows(seconds: float = 60.0, window_s: float = 5.0, seed: int = 3) -> list[Row]:
    """Rows made by the GPU run's own code (windows -> ``_rows_from``) from sim counters.

    Each simulated job's efficiency is the known factor, so MFU = c x raw OFU up to clock noise.
    """
    spec = specs.find_spec(DRY_MODEL)
    assert spec is not None
    shapes = [(s, False) for s in ALIGNED[:2]] + [(s, True) for s in RAGGED[:2]]
    rows = []
    for p_i, (precision, known) in enumerate(DRY_KNOWN.items()):
        jobs = [sim.JobSpec(id=f"gemm-{i}", scenario="steady", mfu=0.55 + 0.08 * i, precision=precision,
                            efficiency=known) for i in range(len(shapes))]
        fleet = sim.Fleet(nodes=1, gpus_per_node=len(jobs), models=[DRY_MODEL], jobs=jobs, seed=seed + p_i,
                          window_s=window_s, clock_sample_s=1.0, start_unix_s=1.7e9)
        fleet.step_window()  # warm-up window, as the GPU run discards its warm-up
        samplers = [_ListSampler() for _ in jobs]
        truths: list[list[float]] = [[] for _ in jobs]
        for _ in range(round(seconds / window_s)):
            for i, (sample, truth) in enumerate(fleet.step_window()):
                end = sample.time_unix_nano / 1e9
                samplers[i].windows.append(Window(end - sample.window_s, end, float(sample.tensor_active),
                                                  [float(sample.sm_clock_mhz)]))
                truths[i].append(truth.true_mfu)
        for (shape, ragged), sampler, truth_mfu in zip(shapes, samplers, truths):
            result = GemmResult(precision, shape, ragged, statistics.fmean(truth_mfu), sampler.windows[0].start,
                                sampler.windows[-1].end, len(truth_mfu))
            row = _rows_from(sampler, result, sample.model, spec.max_sm_clock_mhz)
            assert row is not None and row.windows == len(truth_mfu), row
            rows.append(row)
    return rows


class _ListSampler:
    """A sampler stand-in holding windows made from sim samples (dry run)."""

    name = "sim"
    samples_clock = False  # one (window-mean) clock per window, like the receivers

    def __init__(self) -> None:
        self.windows: list[Window] = []


def dry_run(as_json: bool, reason: str) -> int:
    """Check the fitting, table and config plumbing on sim numbers with a known factor."""
    rows = dry_rows()
    factors = fit_factors(rows, "hopper")
    errors = {p: factors[f"hopper/{p}"] - known for p, known in DRY_KNOWN.items()}
    recovered = all(abs(e) < 0.003 for e in errors.values())
    config_ok, config_error = True, ""
    try:
        check_factors_config(factors)
    except Exception as exc:  # noqa: BLE001 - reported, not raised: the dry run's verdict
        config_ok, config_error = False, str(exc)
    gpm_ok = _gpm_structs_ok()
    receivers = _receivers_constructible()
    ok = recovered and config_ok and gpm_ok and all(v in ("ok", "absent") for v in receivers.values())
    if as_json:
        json.dump({"dry_run": True, "reason": reason, "ok": ok, "fitted_factors": factors, "known_factors":
                   {f"hopper/{p}": v for p, v in DRY_KNOWN.items()}, "fit_errors": errors,
                   "fit": fit_details(rows, "hopper"),
                   "config_ok": config_ok, "gpm_structs_ok": gpm_ok, "receivers": receivers, "rows": len(rows),
                   **gap_summary(rows)},
                  sys.stdout)
        print()
    else:
        print(f"gemm_validation: DRY RUN ({reason}); no GPU measurement was made.")
        print("Checking the plumbing on synthetic sim numbers (job efficiency = a known factor):\n")
        print(table(rows))
        print("\nfitted vs known factor:")
        for p, known in DRY_KNOWN.items():
            print(f"  hopper/{p:<5} fitted {factors[f'hopper/{p}']:.4f}  known {known:.4f}  "
                  f"error {errors[p]:+.4f}")
        print("\nas the ofu processor's config:\n" + config_snippet(factors))
        print(f"\nfactor recovered within 0.003: {recovered}; config loads: {config_ok} {config_error}; "
              f"pynvml GPM structures present: {gpm_ok}; receivers built (not started): {receivers}")
        print("dry run " + ("OK" if ok else "FAILED"))
    return 0 if ok else 1


def _receivers_constructible() -> dict[str, str]:
    """The nvml and dcgm receivers accept the config this script gives them (built, never started)."""
    out = {}
    for receiver_type in ("nvml", "dcgm"):
        try:
            ReceiverSampler(receiver_type, 0, 1.0)
            out[receiver_type] = "ok"
        except ImportError:
            out[receiver_type] = "absent"
        except Exception as exc:  # noqa: BLE001 - the dry run's verdict
            out[receiver_type] = f"{type(exc).__name__}: {exc}"
    return out


def _gpm_structs_ok() -> bool:
    """The GPM calls this script makes exist in the installed pynvml (no NVML call is made)."""
    try:
        import pynvml as nv
    except ImportError:
        return False
    mg = nv.c_nvmlGpmMetricsGet_t()
    mg.version = nv.NVML_GPM_METRICS_GET_VERSION
    mg.numMetrics = 1
    mg.metrics[0].metricId = nv.NVML_GPM_METRIC_ANY_TENSOR_UTIL
    return all(hasattr(nv, name) for name in ("nvmlGpmSampleAlloc", "nvmlGpmSampleGet", "nvmlGpmMetricsGet",
                                              "nvmlGpmQueryDeviceSupport", "nvmlGpmSampleFree"))


# --- GPU run ------------------------------------------------------------------------------------


@dataclass
class Window:
    """One OFU window read from the GPU: wall times (time.time()), TPA, clock samples."""

    start: float
    end: float
    tpa: float
    clocks: list[float]


class GpmSampler:
    """NVML GPM read directly: ANY_TENSOR_UTIL per window, SM clock every ``clock_period``."""

    name = "gpm"
    samples_clock = True  # every clock sample of the window is kept: point and averaged columns

    def __init__(self, index: int, window_s: float, clock_period: float = 0.1):
        import pynvml as nv

        self.nv = nv
        nv.nvmlInit()
        self.handle = nv.nvmlDeviceGetHandleByIndex(index)
        if not nv.nvmlGpmQueryDeviceSupport(self.handle).isSupportedDevice:
            raise RuntimeError("NVML GPM is not supported on this GPU (Hopper or newer is needed)")
        self.window_s = window_s
        self.clock_period = clock_period
        self.windows: list[Window] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpm-sampler", daemon=True)
        self.error: str | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _tpa(self, s1: Any, s2: Any) -> float:
        nv = self.nv
        mg = nv.c_nvmlGpmMetricsGet_t()
        mg.version = nv.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = 1
        mg.sample1 = s1
        mg.sample2 = s2
        mg.metrics[0].metricId = nv.NVML_GPM_METRIC_ANY_TENSOR_UTIL
        nv.nvmlGpmMetricsGet(mg)
        if mg.metrics[0].nvmlReturn != nv.NVML_SUCCESS:
            raise RuntimeError(f"GPM ANY_TENSOR_UTIL returned NVML error {mg.metrics[0].nvmlReturn}")
        return mg.metrics[0].value / 100.0

    def _run(self) -> None:
        nv = self.nv
        samples = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
        try:
            nv.nvmlGpmSampleGet(self.handle, samples[0])
            start = time.time()
            clocks: list[float] = []
            while not self._stop.is_set():
                self._stop.wait(self.clock_period)
                clocks.append(float(nv.nvmlDeviceGetClockInfo(self.handle, nv.NVML_CLOCK_SM)))
                now = time.time()
                if now - start >= self.window_s:
                    nv.nvmlGpmSampleGet(self.handle, samples[1])
                    self.windows.append(Window(start, now, self._tpa(samples[0], samples[1]), clocks))
                    samples.reverse()
                    start, clocks = now, []
        except Exception as exc:  # noqa: BLE001 - recorded and reported with the results
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            for s in samples:
                nv.nvmlGpmSampleFree(s)


class DcgmSampler:
    """DCGM through its Python bindings: field 1004 (TPA, watch-interval average) and 100 (clock)."""

    name = "dcgm"
    samples_clock = False  # the latest clock value per window

    def __init__(self, index: int, window_s: float):
        for path in DCGM_BINDINGS:
            if path not in sys.path and glob.glob(path):
                sys.path.append(path)
        from DcgmReader import DcgmReader  # type: ignore[import-not-found]

        self.index = index
        self.window_s = window_s
        self.reader = DcgmReader(fieldIds=[1004, 100], updateFrequency=int(window_s * 1e6), maxKeepAge=600.0,
                                 gpuIds=[index])
        self.windows: list[Window] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dcgm-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        try:
            self.reader.Shutdown()
        except Exception:  # noqa: BLE001 - best effort
            pass

    def _run(self) -> None:
        try:
            start = time.time()
            while not self._stop.wait(self.window_s):
                values = self.reader.GetLatestGpuValuesAsFieldIdDict().get(self.index, {})
                now = time.time()
                tpa, clock = values.get(1004), values.get(100)
                if isinstance(tpa, (int, float)) and isinstance(clock, (int, float)):
                    self.windows.append(Window(start, now, float(tpa), [float(clock)]))
                start = now
        except Exception as exc:  # noqa: BLE001 - recorded and reported with the results
            self.error = f"{type(exc).__name__}: {exc}"


class ReceiverSampler:
    """One of the project's receivers (``nvml``: GPM; ``dcgm``: DCGM fields), driven through its Factory."""

    samples_clock = False  # the receiver hands over the window's mean clock only

    def __init__(self, receiver_type: str, index: int, window_s: float):
        import importlib

        from otel_ofu.pipeline.component import Context

        module = importlib.import_module(f"otel_ofu.receivers.{receiver_type}")  # absent -> caller falls back
        factory = module.FACTORY
        names = {f.name for f in dataclasses.fields(factory.config_type)}
        wanted: dict[str, Any] = {"collection_interval": window_s, "clock_sample_interval": 0.1,
                                  "gpu_indices": [index], "gpu_ids": [index], "mig": False,
                                  "report_processes": False}
        data = {k: v for k, v in wanted.items() if k in names}
        self.name = f"{receiver_type}-receiver"
        self.index = index
        self.windows: list[Window] = []
        self.error: str | None = None
        self.receiver = factory.create(build_config(factory.config_type, data),
                                       Context(f"{receiver_type}/gemm_validation"), consumer=self._consume)

    def _consume(self, batch: Any) -> None:
        for s in batch.samples:
            if str(s.gpu_index) != str(self.index) or not isinstance(s.tensor_active, (int, float)):
                continue
            end = s.time_unix_nano / 1e9
            clock = s.sm_clock_mhz if isinstance(s.sm_clock_mhz, (int, float)) else float("nan")
            self.windows.append(Window(end - float(s.window_s), end, float(s.tensor_active), [float(clock)]))

    def start(self) -> None:
        self.receiver.start()

    def stop(self) -> None:
        self.receiver.shutdown()


@dataclass
class GemmResult:
    precision: str
    shape: tuple[int, int, int]
    ragged: bool
    mfu: float
    start: float
    end: float
    iterations: int
    skipped: str = ""
    rows: list[Row] = field(default_factory=list)
    gpu_s: float = 0.0  # CUDA-event time of the timed loop
    interrupted: bool = False  # stopped early (SIGTERM or the time budget): fewer windows than asked


#: Set by SIGTERM (``timeout``, the device run's step limit): finish the case in hand, report, exit.
STOP = threading.Event()


def fp8_unavailable(torch: Any) -> str | None:
    """Why fp8 GEMMs cannot run with this torch, or None (``torch._scaled_mm`` is private and comes and goes)."""
    if not hasattr(torch, "_scaled_mm"):
        return f"torch {torch.__version__} has no torch._scaled_mm"
    if not hasattr(torch, "float8_e4m3fn"):
        return f"torch {torch.__version__} has no torch.float8_e4m3fn"
    return None


def _make_gemm(torch: Any, precision: str, m: int, n: int, k: int) -> Callable[[], Any]:
    dev = "cuda"
    if precision == "fp8":
        a = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
        one = torch.tensor(1.0, device=dev)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32}[precision]
    a = torch.randn(m, k, device=dev, dtype=dtype)
    b = torch.randn(k, n, device=dev, dtype=dtype)
    out = torch.empty(m, n, device=dev, dtype=dtype)
    return lambda: torch.matmul(a, b, out=out)


def _run_gemm(torch: Any, precision: str, shape: tuple[int, int, int], ragged: bool, seconds: float,
              peak: float, warmup: float = 2.0) -> GemmResult:
    m, n, k = shape
    if precision == "fp8":  # torch._scaled_mm needs dimensions divisible by 16
        m, n, k = ((d + 15) // 16 * 16 for d in shape)
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    gemm = _make_gemm(torch, precision, m, n, k)
    t0 = time.perf_counter()
    warm = 0
    while time.perf_counter() - t0 < warmup or warm < 3:  # warm-up: the clock settles, cuBLAS picks its kernel
        gemm()
        warm += 1
        torch.cuda.synchronize()
    per_iter = (time.perf_counter() - t0) / warm
    chunk = max(1, int(0.05 / per_iter))
    start_ev, end_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    wall_start = time.time()
    start_ev.record()
    iters = 0
    pending = None  # two chunks in flight: the GPU never idles between them (a gap would count against MFU only)
    while time.time() - wall_start < seconds and not STOP.is_set():
        for _ in range(chunk):
            gemm()
        iters += chunk
        mark = torch.cuda.Event()
        mark.record()
        if pending is not None:
            pending.synchronize()
        pending = mark
    end_ev.record()
    end_ev.synchronize()
    wall_end = time.time()
    elapsed = start_ev.elapsed_time(end_ev) / 1e3
    mfu = 2.0 * m * n * k * iters / elapsed / peak
    return GemmResult(precision, (m, n, k), ragged, mfu, wall_start, wall_end, iters, gpu_s=elapsed,
                      interrupted=STOP.is_set())


def _rows_from(sampler: Any, result: GemmResult, model: str, max_clock: float) -> Row | None:
    """OFU over the sampler's windows that lie inside the GEMM run."""
    inside = [w for w in sampler.windows if w.start >= result.start - 0.05 and w.end <= result.end + 0.05]
    raws: list[float] = []
    points: list[float] = []
    cors: list[float] = []
    for w in inside:
        clocks = [c for c in w.clocks if c == c]
        if not clocks:
            continue
        avg = compute_ofu(w.tpa, statistics.fmean(clocks), model, result.precision, max_clock)
        point = compute_ofu(w.tpa, clocks[-1], model, result.precision, max_clock)
        if isinstance(avg, OfuResult) and isinstance(point, OfuResult):
            raws.append(avg.raw)
            cors.append(avg.corrected)
            points.append(point.raw)
    if not raws:
        return None
    point = statistics.fmean(points) if getattr(sampler, "samples_clock", False) else None
    return Row(sampler.name, result.precision, result.shape, result.ragged, result.mfu, statistics.fmean(raws),
               statistics.fmean(cors), len(raws), point)


def result_document(rows: list[Row], architecture: str, dtypes: list[str], *, notes: list[str],
                    device: dict[str, Any], gemms: list[GemmResult], interrupted: str = "",
                    source_order: list[str] | None = None) -> dict[str, Any]:
    """The GPU run's JSON: every row, the fit (from the first source in ``source_order`` with rows), the gaps.

    One function so the report (``benchmarks/device_report.py``) and its tests read what a GPU run writes.
    """
    order = source_order or list(dict.fromkeys(r.source for r in rows))
    primary = next((name for name in order if any(r.source == name for r in rows)), None)
    fit_rows = [r for r in rows if r.source == primary]
    factors = fit_factors(fit_rows, architecture) if fit_rows else {}
    if factors:
        try:
            check_factors_config(factors)
        except Exception as exc:  # noqa: BLE001 - reported: a factor outside [0.5, 1] says something is off
            notes.append(f"fitted factors do not pass the ofu processor's config validation: {exc}")
    return {"dry_run": False, "device": device, "notes": notes, "interrupted": interrupted,
            "gemms": [{"precision": g.precision, "shape": list(g.shape), "ragged": g.ragged, "mfu": g.mfu,
                       "iterations": g.iterations, "seconds": g.gpu_s, "interrupted": g.interrupted}
                      for g in gemms],
            "rows": [dataclasses.asdict(r) for r in rows], "fitted_from": primary, "fitted_factors": factors,
            "fit": fit_details(fit_rows, architecture),
            "default_factors": {f"{architecture}/{p}": tiles.correction_factor(architecture, p) for p in dtypes},
            **(gap_summary(fit_rows) if fit_rows else {})}


def _device_info(nv: Any, handle: Any, torch: Any, index: int) -> dict[str, Any]:
    def text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    props = torch.cuda.get_device_properties(index)
    return {"index": index, "name": text(nv.nvmlDeviceGetName(handle)), "driver": text(nv.nvmlSystemGetDriverVersion()),
            "max_sm_clock_mhz": float(nv.nvmlDeviceGetMaxClockInfo(handle, nv.NVML_CLOCK_SM)),
            "sm_count": int(props.multi_processor_count), "torch": str(torch.__version__),
            "cuda": str(torch.version.cuda)}


def _sampler_makers(args: argparse.Namespace) -> list[tuple[str, Callable[[], Any]]]:
    return [
        ("nvml receiver", lambda: ReceiverSampler("nvml", args.device, args.window)),
        ("GPM direct", lambda: GpmSampler(args.device, args.window)),  # also gives the point-clock column
        ("dcgm receiver", lambda: ReceiverSampler("dcgm", args.device, args.window)),
    ]


def gpu_run(args: argparse.Namespace, torch: Any) -> int:
    """The measurement on a real GPU; see the module doc."""
    import pynvml as nv

    started = time.monotonic()
    nv.nvmlInit()
    handle = nv.nvmlDeviceGetHandleByIndex(args.device)
    torch.cuda.set_device(args.device)
    device = _device_info(nv, handle, torch, args.device)
    model, max_clock = device["name"], device["max_sm_clock_mhz"]
    spec = specs.find_spec(model)
    if spec is None:
        print(f"gemm_validation: {model!r} is not in the spec table; cannot compute MFU", file=sys.stderr)
        if args.json:
            print(json.dumps({"dry_run": False, "device": device, "notes": [f"{model!r} is not in otel_ofu.core.specs"],
                              "rows": [], "gemms": [], "fitted_factors": {}, "fit": {}}))
        return 2
    device["spec"] = spec.key
    notes = [f"GPU {args.device}: {model} (spec {spec.key}, {spec.architecture}), max SM clock {max_clock:.0f} MHz, "
             f"torch {device['torch']}, CUDA {device['cuda']}, driver {device['driver']}"]
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)  # the receivers' own warnings
    samplers: list[Any] = []
    for label, make in _sampler_makers(args):
        try:
            samplers.append(make())
        except Exception as exc:  # noqa: BLE001 - each source is optional; say why it is missing
            notes.append(f"{label} unavailable: {type(exc).__name__}: {exc}")
            if label == "dcgm receiver" and isinstance(exc, ImportError):
                try:
                    samplers.append(DcgmSampler(args.device, args.window))
                except Exception as exc2:  # noqa: BLE001
                    notes.append(f"DCGM bindings unavailable: {type(exc2).__name__}: {exc2}")
    if not samplers:  # the GEMMs still run: MFU per dtype checks the spec's peaks
        notes.append("no OFU source (GPM refused and no DCGM): MFU only, nothing to compare")
    for sampler in samplers:
        sampler.start()
    shapes = [(s, False) for s in (ALIGNED[:2] if args.quick else ALIGNED)] + \
             [(s, True) for s in (RAGGED[:2] if args.quick else RAGGED)]
    seconds = args.windows * args.window + args.window  # several whole windows inside the run
    case_s = args.warmup + 0.5 + seconds + args.window * 0.2  # warm-up, the timed loop, the pause after it
    results: list[GemmResult] = []
    interrupted = ""
    try:
        for precision in args.dtypes:
            peak = spec.peak(precision)
            if peak is None:
                notes.append(f"{precision}: no peak for {spec.key}; skipped")
                continue
            if precision == "fp8" and (why := fp8_unavailable(torch)):
                notes.append(f"fp8: skipped ({why})")
                continue
            for shape, ragged in shapes:
                if STOP.is_set():
                    interrupted = interrupted or "SIGTERM"
                    break
                if args.max_seconds and time.monotonic() - started + case_s + args.window > args.max_seconds:
                    interrupted = f"time budget ({args.max_seconds:g} s) reached"
                    break
                try:
                    result = _run_gemm(torch, precision, shape, ragged, seconds, peak.flops, args.warmup)
                except Exception as exc:  # noqa: BLE001 - e.g. fp8 unsupported: record and go on
                    notes.append(f"{precision} {shape}: skipped ({type(exc).__name__}: {exc})")
                    break
                results.append(result)
                print(f"  {precision:<5} {'x'.join(map(str, result.shape)):<18} MFU {100 * result.mfu:6.2f} %",
                      file=sys.stderr, flush=True)
                time.sleep(args.window * 0.2)
            if interrupted:
                notes.append(f"stopped early: {interrupted}; later cases not run")
                break
    finally:
        time.sleep(args.window)  # let the last windows close
        for sampler in samplers:
            sampler.stop()
    if STOP.is_set() and not interrupted:  # during the last case, or after it
        interrupted = "SIGTERM"
        notes.append("stopped early: SIGTERM")
    for sampler in samplers:
        if getattr(sampler, "error", None):
            notes.append(f"{sampler.name}: {sampler.error}")
    rows = [row for r in results for s in samplers if (row := _rows_from(s, r, model, max_clock)) is not None]
    out = result_document(rows, spec.architecture, args.dtypes, notes=notes, device=device, gemms=results,
                          interrupted=interrupted, source_order=[s.name for s in samplers])  # nvml receiver first
    if args.json:
        json.dump(out, sys.stdout)
        print()
    else:
        print("\n".join(notes))
        print()
        print(table(rows))
        if out["fitted_factors"]:
            primary = out["fitted_from"]
            print(f"\ngaps ({primary}): " + ", ".join(f"{k} {v:.3f}" for k, v in gap_summary(
                [r for r in rows if r.source == primary]).items()))
            print(f"\nfitted from {primary} (default factors: {out['default_factors']}):\n"
                  + config_snippet(out["fitted_factors"]))
    return 0 if rows else 3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="check the plumbing on sim numbers; no GPU")
    parser.add_argument("--quick", action="store_true", help="2 aligned + 2 ragged shapes instead of 4 + 4 (GPU run)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--window", type=float, default=1.0, help="OFU window, seconds (default 1)")
    parser.add_argument("--windows", type=int, default=5, help="whole windows per GEMM case (default 5)")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of GEMMs before each timed run")
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    parser.add_argument("--max-seconds", type=float, default=0.0,
                        help="start no GEMM case that would end after this many seconds; report what ran")
    args = parser.parse_args(argv)
    if args.dry_run:
        return dry_run(args.json, "--dry-run")
    try:
        import torch
    except ImportError:
        return dry_run(args.json, "no GPU: torch is not installed")
    if not torch.cuda.is_available():
        return dry_run(args.json, "no GPU: no CUDA GPU visible to torch")
    previous = signal.signal(signal.SIGTERM, lambda *_: STOP.set())  # finish the case in hand, report what ran
    try:
        return gpu_run(args, torch)
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
