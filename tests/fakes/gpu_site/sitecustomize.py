"""Puts a fake GPU under every Python started with this folder on PYTHONPATH (tests only).

``torch`` becomes tests.fakes.torch over a virtual NVIDIA H200 and ``pynvml`` a FakeNvml on
the system clock reporting the same TPA and SM clock, so benchmarks/device_run.sh and its
steps take their GPU paths end to end (tests/test_device_run.py). Settings, from the
environment: FAKE_GPU_TPA (0.8), FAKE_GPU_SM_CLOCK (1755), FAKE_GPU_EFFICIENCY (0.95: the
true MFU / raw OFU), FAKE_TORCH_SCALED_MM (1; 0 = a torch without torch._scaled_mm).
"""

import os
import sys
from pathlib import Path

_repo = str(Path(__file__).resolve().parents[3])
if _repo not in sys.path:
    sys.path.append(_repo)

from otel_ofu.gpu.clock import SYSTEM_CLOCK  # noqa: E402
from tests.fakes.nvml import FakeNvml, FakeNvmlGpu  # noqa: E402  (imports the real pynvml first)
from tests.fakes.torch import VirtualGpu, make_torch  # noqa: E402

_MODEL = "NVIDIA H200"
_tpa = float(os.environ.get("FAKE_GPU_TPA", "0.8"))
_clock = int(os.environ.get("FAKE_GPU_SM_CLOCK", "1755"))
_gpu = VirtualGpu(_MODEL, _tpa, _clock, float(os.environ.get("FAKE_GPU_EFFICIENCY", "0.95")))
sys.modules["torch"] = make_torch(_gpu, scaled_mm=os.environ.get("FAKE_TORCH_SCALED_MM", "1") == "1")
sys.modules["pynvml"] = FakeNvml([FakeNvmlGpu(name=_MODEL, tpa=_tpa, sm_clock=_clock, max_clock=1980)],
                                 clock=SYSTEM_CLOCK)
