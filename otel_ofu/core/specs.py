"""The one GPU spec table: dense tensor peaks and the clock each peak is quoted at.

OFU divides by f_ref, the SM clock at which the vendor's peak tensor FLOP/s is quoted. For
the H100 SXM that is 1830 MHz, not the 1980 MHz max clock DCGM reports: dividing by the max
reads OFU 7.6 % low (the "clock-domain" error). Sources are in REFERENCE.md section 5; the
table below keeps each number's provenance next to it. Sparse peaks are never used.

Per-SM dense tensor FLOP per clock at FP16/BF16: Ampere 2048, Hopper 4096, Blackwell 8192.
TF32 is half of FP16, FP8 and INT8 twice, FP4 four times (Blackwell only).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

PRECISIONS = ("tf32", "fp16", "bf16", "fp8", "fp4", "int8", "fp64")
UNKNOWN_PRECISION = "unknown"

# Spellings users and frameworks use, mapped to the table's keys.
_PRECISION_ALIASES = {
    "tf32": "tf32",
    "fp16": "fp16",
    "half": "fp16",
    "float16": "fp16",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp8": "fp8",
    "e4m3": "fp8",
    "e5m2": "fp8",
    "float8": "fp8",
    "fp4": "fp4",
    "nvfp4": "fp4",
    "mxfp4": "fp4",
    "int8": "int8",
    "fp64": "fp64",
    "float64": "fp64",
}


@functools.lru_cache(maxsize=256)
def normalize_precision(value: str | None) -> str:
    """Map a precision spelling to a table key, or ``"unknown"`` (cached: asked once or twice per sample)."""
    if not value:
        return UNKNOWN_PRECISION
    return _PRECISION_ALIASES.get(value.strip().lower().replace("-", "").replace("_", ""), UNKNOWN_PRECISION)


@dataclass(frozen=True)
class Peak:
    """A dense peak in FLOP/s (or OP/s for int8) and the SM clock it is quoted at, MHz."""

    flops: float
    clock_mhz: float


@dataclass(frozen=True)
class GpuSpec:
    key: str
    name: str
    architecture: str  # ampere | hopper | blackwell
    sm_count: int
    max_sm_clock_mhz: float
    tensor_ref_clock_mhz: float  # f_ref for tensor work: the clock the tensor peaks are quoted at
    peaks: dict[str, Peak]
    patterns: tuple[str, ...]  # regexes over the normalized model string
    board_power_w: float = 0.0  # TDP; the simulator's power model uses it
    source: str = ""
    _compiled: tuple[re.Pattern[str], ...] = field(default=(), compare=False, repr=False)

    def peak(self, precision: str) -> Peak | None:
        return self.peaks.get(precision)

    def ref_clock_mhz(self, precision: str) -> float:
        """f_ref for this precision; the tensor reference clock when precision is unknown."""
        peak = self.peaks.get(precision)
        return peak.clock_mhz if peak else self.tensor_ref_clock_mhz


def _tensor_peaks(sm_count: int, fp16_flop_per_sm_clk: int, ref_clock_mhz: float, *, fp8: bool, fp4: bool,
                  fp64_flops: float, fp64_clock_mhz: float) -> dict[str, Peak]:
    """Dense peaks derived from the per-SM rate; each must match the vendor's sheet (tested)."""
    fp16 = sm_count * fp16_flop_per_sm_clk * ref_clock_mhz * 1e6
    peaks = {
        "tf32": Peak(fp16 / 2, ref_clock_mhz),
        "fp16": Peak(fp16, ref_clock_mhz),
        "bf16": Peak(fp16, ref_clock_mhz),
        "int8": Peak(fp16 * 2, ref_clock_mhz),
        "fp64": Peak(fp64_flops, fp64_clock_mhz),
    }
    if fp8:
        peaks["fp8"] = Peak(fp16 * 2, ref_clock_mhz)
    if fp4:
        peaks["fp4"] = Peak(fp16 * 4, ref_clock_mhz)
    return peaks


def _spec(key: str, name: str, arch: str, sms: int, max_mhz: float, ref_mhz: float, per_sm: int,
          patterns: tuple[str, ...], fp64_flops: float, fp64_clock_mhz: float, power_w: float,
          source: str) -> GpuSpec:
    return GpuSpec(
        key=key, name=name, architecture=arch, sm_count=sms, max_sm_clock_mhz=max_mhz,
        tensor_ref_clock_mhz=ref_mhz,
        peaks=_tensor_peaks(sms, per_sm, ref_mhz, fp8=arch in ("hopper", "blackwell"), fp4=arch == "blackwell",
                            fp64_flops=fp64_flops, fp64_clock_mhz=fp64_clock_mhz),
        patterns=patterns, board_power_w=power_w, source=source,
        _compiled=tuple(re.compile(p) for p in patterns),
    )


# Order matters: the first spec whose pattern matches wins, so specific names come first.
GPU_SPECS: tuple[GpuSpec, ...] = (
    _spec("gb200", "NVIDIA GB200", "blackwell", 148, 2110, 2062, 8192, (r"\bgb200\b",),
          45e12, 2062, 1200, "NVIDIA GB200 NVL72 sheet: 2.5 PF dense FP16 per GPU; 148 SMs third-party; "
          "f_ref derived 2.5e15 / (148 x 8192)"),
    _spec("b200", "NVIDIA B200", "blackwell", 148, 1980, 1856, 8192, (r"\bb200\b",),
          40e12, 1856, 1000, "NVIDIA HGX B200 sheet: 2.25 PF dense FP16; f_ref derived 2.25e15 / (148 x 8192)"),
    _spec("h200_nvl", "NVIDIA H200 NVL", "hopper", 132, 1785, 1545, 4096, (r"\bh200\b.*\bnvl\b",),
          60e12, 1785, 600, "NVIDIA H200 NVL sheet: 1671 TF sparse BF16 -> 835.5 dense; f_ref derived"),
    _spec("h200_sxm", "NVIDIA H200 SXM", "hopper", 132, 1980, 1830, 4096, (r"\bh200\b",),
          67e12, 1980, 700, "same GH100 configuration as H100 SXM (989 TF dense FP16 at 1830 MHz)"),
    _spec("gh200", "NVIDIA GH200", "hopper", 132, 1980, 1830, 4096, (r"\bgh200\b",),
          67e12, 1980, 900, "GH200 Hopper GPU: H100 SXM configuration"),
    _spec("h100_nvl", "NVIDIA H100 NVL", "hopper", 132, 1785, 1545, 4096, (r"\bh100\b.*\bnvl\b",),
          60e12, 1785, 400, "NVIDIA H100 NVL sheet: 1671 TF sparse BF16 -> 835.5 dense; f_ref derived"),
    _spec("h100_pcie", "NVIDIA H100 PCIe", "hopper", 114, 1755, 1620, 4096, (r"\bh100\b.*\bpcie\b",),
          51e12, 1755, 350, "NVIDIA H100 white paper table 3: 756 TF dense FP16 at 1620 MHz"),
    _spec("h100_sxm", "NVIDIA H100 SXM", "hopper", 132, 1980, 1830, 4096, (r"\bh100\b",),
          67e12, 1980, 700, "NVIDIA: 989.4 TF dense FP16 = 132 x 4096 x 1.83 GHz; max clock 1980"),
    _spec("a100_pcie", "NVIDIA A100 PCIe", "ampere", 108, 1410, 1410, 2048, (r"\ba100\b.*\bpcie\b",),
          19.5e12, 1410, 300, "NVIDIA A100 sheet: 312 TF dense FP16 at 1410 MHz"),
    _spec("a100_sxm", "NVIDIA A100 SXM", "ampere", 108, 1410, 1410, 2048, (r"\ba100\b",),
          19.5e12, 1410, 400, "NVIDIA A100 sheet: 312 TF dense FP16 at 1410 MHz"),
)

SPECS_BY_KEY = {spec.key: spec for spec in GPU_SPECS}


def normalize_model(model: str) -> str:
    """Lowercase, punctuation to spaces: "NVIDIA A100-SXM4-80GB" -> "nvidia a100 sxm4 80gb"."""
    return " ".join(re.sub(r"[^0-9a-z]+", " ", model.lower()).split())


@functools.lru_cache(maxsize=256)
def find_spec(model: str | None) -> GpuSpec | None:
    """The spec for a model string as DCGM, NVML or dcgm-exporter print it, or None.

    Cached: every window asks again for the same few model strings, and the table is fixed
    (specs are frozen). Bounded, since the model string can come from any OTLP sender.
    """
    if not model:
        return None
    normalized = normalize_model(model)
    if normalized in SPECS_BY_KEY:  # a table key given directly in config ("h100_sxm")
        return SPECS_BY_KEY[normalized]
    if model in SPECS_BY_KEY:
        return SPECS_BY_KEY[model]
    for spec in GPU_SPECS:
        if any(pattern.search(normalized) for pattern in spec._compiled):
            return spec
    return None
