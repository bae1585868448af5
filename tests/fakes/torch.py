"""A fake ``torch``: the CUDA calls benchmarks/gpu_check.py and gemm_validation.py make, in real time.

Why: the hardware run (benchmarks/device_run.sh) gets one short try on a real GPU; its GPU
code paths must have run before that. This fake runs every GEMM on a virtual GPU at
``efficiency x TPA x f_SM / f_ref x peak(dtype)`` FLOP/s (the spec table's peak for the fake
GPU's model), so MFU = efficiency x raw OFU exactly, while a :class:`tests.fakes.nvml.FakeNvml`
on the system clock reports that TPA and clock. Work is queued as on a real stream: a GEMM
returns at once; ``synchronize`` and ``Event.synchronize`` sleep until the queue drains;
events are stamped with the time the queue reaches them.

The surface is the one the benchmarks use (torch.cuda.*, Event, randn/empty/tensor, matmul,
mm, _scaled_mm, dtypes); anything else raises AttributeError.
"""

from __future__ import annotations

import threading
import time
import types
from dataclasses import dataclass

from otel_ofu.core import specs


@dataclass(frozen=True)
class FakeDtype:
    name: str
    precision: str  # the otel_ofu.specs key whose peak applies

    def __repr__(self) -> str:
        return f"torch.{self.name}"


bfloat16 = FakeDtype("bfloat16", "bf16")
float16 = FakeDtype("float16", "fp16")
float32 = FakeDtype("float32", "tf32")  # only ever used for TF32 GEMMs here
float8_e4m3fn = FakeDtype("float8_e4m3fn", "fp8")


class FakeTensor:
    def __init__(self, shape: tuple[int, ...], dtype: FakeDtype):
        self.shape, self.dtype = tuple(shape), dtype

    def to(self, dtype: FakeDtype) -> FakeTensor:
        return FakeTensor(self.shape, dtype)

    def t(self) -> FakeTensor:
        return FakeTensor(self.shape[::-1], self.dtype)


class VirtualGpu:
    """A stream: when queued work finishes, at what rate it runs."""

    def __init__(self, model: str, tpa: float, sm_clock_mhz: float, efficiency: float, sm_count: int = 132):
        self.model, self.tpa, self.clock = model, tpa, sm_clock_mhz
        self.efficiency, self.sm_count = efficiency, sm_count
        self.spec = specs.find_spec(model)
        self.busy_until = time.monotonic()
        self.gemms = 0
        self._lock = threading.Lock()

    def rate(self, precision: str) -> float:
        peak = self.spec.peak(precision)
        return self.efficiency * self.tpa * self.clock / peak.clock_mhz * peak.flops

    def gemm(self, m: int, n: int, k: int, precision: str) -> None:
        with self._lock:
            start = max(time.monotonic(), self.busy_until)
            self.busy_until = start + 2.0 * m * n * k / self.rate(precision)
            self.gemms += 1

    def stamp(self) -> float:
        with self._lock:
            return max(time.monotonic(), self.busy_until)

    @staticmethod
    def wait_until(t: float) -> None:
        delay = t - time.monotonic()
        if delay > 0:
            time.sleep(delay)


def make_torch(gpu: VirtualGpu | None, *, scaled_mm: bool = True, version: str = "2.11.0+fake") -> types.ModuleType:
    """A module object to put in ``sys.modules["torch"]``; ``gpu=None``: CUDA not available."""
    torch = types.ModuleType("torch")
    torch.__version__ = version
    torch.version = types.SimpleNamespace(cuda="13.0")
    torch.bfloat16, torch.float16, torch.float32 = bfloat16, float16, float32
    torch.float8_e4m3fn = float8_e4m3fn
    torch.backends = types.SimpleNamespace(cuda=types.SimpleNamespace(matmul=types.SimpleNamespace(allow_tf32=False)))

    def precision_of(dtype: FakeDtype) -> str:
        if dtype is float32 and not torch.backends.cuda.matmul.allow_tf32:
            raise NotImplementedError("the fake runs FP32 GEMMs only as TF32 (set allow_tf32)")
        return dtype.precision

    def randn(*shape: int, device: str = "cpu", dtype: FakeDtype = float32) -> FakeTensor:
        return FakeTensor(shape, dtype)

    def matmul(a: FakeTensor, b: FakeTensor, out: FakeTensor | None = None) -> FakeTensor:
        if a.shape[1] != b.shape[0]:
            raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({a.shape} and {b.shape})")
        gpu.gemm(a.shape[0], b.shape[1], a.shape[1], precision_of(a.dtype))
        return out or FakeTensor((a.shape[0], b.shape[1]), a.dtype)

    def _scaled_mm(a: FakeTensor, b: FakeTensor, *, scale_a: FakeTensor, scale_b: FakeTensor,
                   out_dtype: FakeDtype) -> FakeTensor:
        if any(d % 16 for d in (*a.shape, *b.shape)):
            raise RuntimeError("_scaled_mm: dimensions must be divisible by 16")
        gpu.gemm(a.shape[0], b.shape[1], a.shape[1], "fp8")
        return FakeTensor((a.shape[0], b.shape[1]), out_dtype)

    class Event:
        def __init__(self, enable_timing: bool = False):
            self.t: float | None = None

        def record(self) -> None:
            self.t = gpu.stamp()

        def synchronize(self) -> None:
            gpu.wait_until(self.t)

        def elapsed_time(self, end: Event) -> float:
            return (end.t - self.t) * 1e3  # ms, as torch reports

    torch.randn = randn
    torch.empty = randn
    torch.tensor = lambda value, device="cpu": FakeTensor((), float32)
    torch.matmul = matmul
    torch.mm = matmul
    if scaled_mm:
        torch._scaled_mm = _scaled_mm
    torch.cuda = types.SimpleNamespace(
        is_available=lambda: gpu is not None,
        device_count=lambda: 1 if gpu else 0,
        get_device_name=lambda index=0: gpu.model,
        get_device_capability=lambda index=0: (9, 0),
        get_device_properties=lambda index=0: types.SimpleNamespace(multi_processor_count=gpu.sm_count,
                                                                      name=gpu.model),
        set_device=lambda index: None,
        synchronize=lambda: gpu.wait_until(gpu.stamp()),
        Event=Event,
    )
    return torch
