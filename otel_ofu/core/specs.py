"""The one GPU spec table: dense tensor peaks and the clock each peak is quoted at.

OFU divides by f_ref, the SM clock at which the vendor's peak tensor FLOP/s is quoted. For
the H100 SXM that is 1830 MHz, not the 1980 MHz max clock DCGM reports: dividing by the max
reads OFU 7.6 % low (the "clock-domain" error). Sources are in REFERENCE.md section 5; the
table below keeps each number's provenance next to it. Sparse peaks are never used.

Per-SM dense tensor FLOP per clock at FP16/BF16: GA100 2048, GA102 and Ada 1024 (L40: 512 with
FP32 accumulate), Hopper 4096, Blackwell 8192 (derived). TF32 is half of FP16, FP8 and INT8
twice, FP4 four times (Blackwell) or six times (Blackwell Ultra). docs/gpus.md lists every
entry with its sources.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from otel_ofu.core.model import GPU_MIG_INSTANCE, GPU_MIG_PROFILE, GPU_MIG_SLICES

PRECISIONS = ("tf32", "fp16", "bf16", "fp8", "fp4", "int8", "fp64")
UNKNOWN_PRECISION = "unknown"

# Spellings users and frameworks print, mapped to the table's keys. Keys are compared after
# :func:`_precision_token` (lowercase; module prefixes such as ``torch.``/``jnp.``, quotes and
# ``dtype(...)`` removed; ``-``, ``_``, ``.`` and spaces dropped; Lightning's ``-mixed`` /
# ``-true`` suffixes dropped). docs/gpus.md ("Precision spellings") lists where each comes from.
_PRECISION_ALIASES = {
    # TF32: the tensor-core path of FP32 GEMMs (PyTorch allow_tf32, JAX "tensorfloat32").
    "tf32": "tf32", "tensorfloat32": "tf32",
    # FP16: PyTorch float16/half, Lightning 16 / 16-mixed / 16-true, Accelerate/DeepSpeed fp16.
    "fp16": "fp16", "half": "fp16", "float16": "fp16", "f16": "fp16", "16": "fp16", "kfloat16": "fp16",
    "amp": "fp16",
    # BF16: bfloat16 everywhere, Lightning bf16-mixed / bf16-true, NeMo bf16_mixed, TE kBFloat16.
    "bf16": "bf16", "bfloat16": "bf16", "kbfloat16": "bf16",
    # FP8: torch/JAX float8_* dtypes, Transformer Engine formats (E4M3, E5M2, HYBRID) and recipes,
    # Megatron --fp8-format, Lightning transformer-engine[-float16], NeMo bf16_with_fp8_mixed.
    "fp8": "fp8", "float8": "fp8", "e4m3": "fp8", "e5m2": "fp8", "fp8e4m3": "fp8", "fp8e5m2": "fp8",
    "float8e4m3": "fp8", "float8e4m3fn": "fp8", "float8e4m3fnuz": "fp8", "float8e4m3b11fnuz": "fp8",
    "float8e5m2": "fp8", "float8e5m2fnuz": "fp8", "float8e3m4": "fp8", "hybrid": "fp8", "fp8hybrid": "fp8",
    "kfloat8e4m3": "fp8", "kfloat8e5m2": "fp8", "mxfp8": "fp8", "transformerengine": "fp8",
    "transformerenginefloat16": "fp8", "delayedscaling": "fp8", "float8currentscaling": "fp8",
    "float8blockscaling": "fp8", "mxfp8blockscaling": "fp8", "bf16withfp8": "fp8",
    "bf16withfp8currentscaling": "fp8", "bf16withmxfp8": "fp8", "fp16withfp8": "fp8",
    # FP4 (Blackwell): NVFP4 / MXFP4, torch float4_e2m1fn_x2, JAX float4_e2m1fn, TE kFloat4E2M1.
    "fp4": "fp4", "nvfp4": "fp4", "mxfp4": "fp4", "e2m1": "fp4", "float4e2m1fn": "fp4", "float4e2m1fnx2": "fp4",
    "kfloat4e2m1": "fp4", "nvfp4blockscaling": "fp4", "bf16withnvfp4": "fp4",
    # INT8 tensor math.
    "int8": "int8", "i8": "int8", "qint8": "int8",
    # FP64: float64/double, Lightning 64 / 64-true.
    "fp64": "fp64", "float64": "fp64", "f64": "fp64", "double": "fp64", "64": "fp64",
}

# Prefixes frameworks put before a dtype name when they print it.
_PRECISION_PREFIXES = ("torch", "jaxnumpy", "jnp", "numpy", "np", "mldtypes", "te", "transformerenginepytorch",
                       "dtype", "format", "recipe")


def _precision_token(value: str) -> str:
    text = value.strip().strip("'\"").lower()
    if text.startswith("dtype(") and text.endswith(")"):  # numpy/JAX repr: dtype('bfloat16')
        text = text[6:-1].strip("'\"")
    token = "".join(ch for ch in text if ch.isalnum())
    if "." in text:  # torch.bfloat16, jnp.float8_e4m3fn, Format.HYBRID, te.DType.kBFloat16
        last = text.rsplit(".", 1)[1]
        if "".join(ch for ch in text.rsplit(".", 1)[0] if ch.isalnum()).endswith(_PRECISION_PREFIXES):
            token = "".join(ch for ch in last if ch.isalnum())
    for suffix in ("mixed", "true"):  # Lightning: bf16-mixed, 16-true; NeMo: bf16_mixed
        if token.endswith(suffix) and len(token) > len(suffix):
            token = token[: -len(suffix)]
    return token


@functools.lru_cache(maxsize=256)
def normalize_precision(value: str | None) -> str:
    """Map a precision spelling to a table key, or ``"unknown"`` (cached: asked once or twice per sample).

    FP32 spellings (``32``, ``32-true``, ``float32``) are ``unknown`` on purpose: an FP32 GEMM
    runs on tensor cores only when TF32 is allowed, which the spelling does not say.
    """
    if not value:
        return UNKNOWN_PRECISION
    return _PRECISION_ALIASES.get(_precision_token(str(value)), UNKNOWN_PRECISION)


@dataclass(frozen=True)
class Peak:
    """A dense peak in FLOP/s (or OP/s for int8) and the SM clock it is quoted at, MHz."""

    flops: float
    clock_mhz: float


@dataclass(frozen=True)
class GpuSpec:
    key: str
    name: str
    architecture: str  # ampere | ada | hopper | blackwell
    sm_count: int
    max_sm_clock_mhz: float
    tensor_ref_clock_mhz: float  # f_ref for tensor work: the clock the tensor peaks are quoted at
    peaks: dict[str, Peak]
    patterns: tuple[str, ...]  # regexes over the normalized model string
    board_power_w: float = 0.0  # TDP; the simulator's power model uses it
    source: str = ""
    mig_slices: int = 7  # MIG compute slices of the whole GPU (7 from A100 to GB300; A30: 4; 0: no MIG)
    _compiled: tuple[re.Pattern[str], ...] = field(default=(), compare=False, repr=False)

    def peak(self, precision: str) -> Peak | None:
        return self.peaks.get(precision)

    def ref_clock_mhz(self, precision: str) -> float:
        """f_ref for this precision; the tensor reference clock when precision is unknown."""
        peak = self.peaks.get(precision)
        return peak.clock_mhz if peak else self.tensor_ref_clock_mhz


TF = 1e12


def rates(sm_count: int, fp16_flop_per_sm_clk: int, clock_mhz: float, *, fp8: bool = False,
          fp4_factor: float = 0.0) -> dict[str, float]:
    """Dense TFLOPS from a per-SM rate (the usual family: TF32 half, FP8/INT8 double, FP4 x factor).

    Used where the vendor's sheet numbers are exactly this product; each entry's source says so,
    and tests/test_specs.py holds the sheet's own figures next to them.
    """
    fp16 = sm_count * fp16_flop_per_sm_clk * clock_mhz * 1e6 / TF
    out = {"tf32": fp16 / 2, "fp16": fp16, "bf16": fp16, "int8": fp16 * 2}
    if fp8:
        out["fp8"] = fp16 * 2
    if fp4_factor:
        out["fp4"] = fp16 * fp4_factor
    return out


def _spec(key: str, name: str, arch: str, sms: int, max_mhz: float, ref_mhz: float, tflops: dict[str, float],
          patterns: tuple[str, ...], power_w: float, source: str,
          clocks: dict[str, float] | None = None, mig_slices: int = 7) -> GpuSpec:
    """One entry: dense peaks in TFLOPS (TOPS for int8) per precision, all quoted at ``ref_mhz``
    unless ``clocks`` names another clock for a precision (FP64 is often quoted at boost)."""
    clocks = clocks or {}
    return GpuSpec(
        key=key, name=name, architecture=arch, sm_count=sms, max_sm_clock_mhz=max_mhz,
        tensor_ref_clock_mhz=ref_mhz,
        peaks={p: Peak(v * TF, clocks.get(p, ref_mhz)) for p, v in tflops.items()},
        patterns=patterns, board_power_w=power_w, source=source, mig_slices=mig_slices,
        _compiled=tuple(re.compile(p) for p in patterns),
    )


# Order matters: the first spec whose pattern matches wins, so specific names come first.
# Each source names the vendor document the dense peaks come from (sparse figures halved) and
# says "derived" for a number that is our arithmetic (an f_ref from peak / (SMs x rate), or a
# dense figure from a sparse one). docs/gpus.md lists the same with links.
GPU_SPECS: tuple[GpuSpec, ...] = (
    # --- Blackwell Ultra: 160 SMs (NVIDIA blog "Inside NVIDIA Blackwell Ultra"); NVFP4 is 6x BF16 per SM.
    _spec("gb300", "NVIDIA GB300", "blackwell", 160, 1907.3, 1907.3,
          {**rates(160, 8192, 1907.3, fp8=True, fp4_factor=6), "int8": 333, "fp64": 1.39}, (r"\bgb300\b",),
          1400, "NVIDIA GB300 NVL72 sheet (72 GPUs, sparse): BF16 360 PF, FP8 720 PF, INT8 24 POPS, FP64 100 TF; "
          "NVFP4 15 PF dense per GPU (NVIDIA blog); f_ref derived 2.5e15 / (160 x 8192); max clock not published"),
    _spec("b300", "NVIDIA B300", "blackwell", 160, 1716.6, 1716.6,
          {**rates(160, 8192, 1716.6, fp8=True, fp4_factor=6), "int8": 375, "fp64": 1.25}, (r"\bb300\b",),
          1100, "NVIDIA HGX B300 sheet (8 GPUs): FP16/BF16 36 PF sparse -> 2.25 PF dense per GPU, FP8 72 PF "
          "sparse, FP4 108 PF dense, INT8 3 POPS, FP64 10 TF; f_ref derived 2.25e15 / (160 x 8192); max clock "
          "not published"),
    # --- Blackwell: 148 SMs (third party); per SM 8192 dense FP16 FLOP/clk (derived), FP4 4x.
    _spec("gb200", "NVIDIA GB200", "blackwell", 148, 2110, 2062,
          {**rates(148, 8192, 2062, fp8=True, fp4_factor=4), "fp64": 45}, (r"\bgb200\b",),
          1200, "NVIDIA GB200 NVL72 sheet: 2.5 PF dense FP16 per GPU; 148 SMs third-party; "
          "f_ref derived 2.5e15 / (148 x 8192)"),
    _spec("b200", "NVIDIA B200", "blackwell", 148, 1980, 1856,
          {**rates(148, 8192, 1856, fp8=True, fp4_factor=4), "fp64": 40}, (r"\bb200\b",),
          1000, "NVIDIA HGX B200 sheet: 2.25 PF dense FP16; f_ref derived 2.25e15 / (148 x 8192)"),
    # --- Hopper: 4096 dense FP16 FLOP/SM/clk.
    _spec("h200_nvl", "NVIDIA H200 NVL", "hopper", 132, 1785, 1545,
          {**rates(132, 4096, 1545, fp8=True), "fp64": 60}, (r"\bh200\b.*\bnvl\b",),
          600, "NVIDIA H200 NVL sheet: 1671 TF sparse BF16 -> 835.5 dense; f_ref derived",
          clocks={"fp64": 1785}),
    _spec("h200_sxm", "NVIDIA H200 SXM", "hopper", 132, 1980, 1830,
          {**rates(132, 4096, 1830, fp8=True), "fp64": 67}, (r"\bh200\b",),
          700, "NVIDIA H200 sheet: 1979 TF sparse BF16 -> 989.5 dense; same GH100 configuration as H100 SXM "
          "(132 SMs, 1830 MHz)", clocks={"fp64": 1980}),
    _spec("gh200", "NVIDIA GH200", "hopper", 132, 1980, 1830,
          {**rates(132, 4096, 1830, fp8=True), "fp64": 67}, (r"\bgh200\b",),
          900, "NVIDIA GH200 sheet: 1979 TF sparse BF16 -> 989.5 dense; H100 SXM configuration",
          clocks={"fp64": 1980}),
    _spec("h20", "NVIDIA H20", "hopper", 78, 1980, 1980,
          {"tf32": 74, "fp16": 148, "bf16": 148, "fp8": 296, "int8": 296, "fp64": 1}, (r"\bh20\b",),
          400, "NVIDIA H20 product brief: BF16/FP16 148 TF, FP8 296 TF, TF32 74 TF, FP64 1 TF (dense). Tensor "
          "rate is capped below 78 SMs x 4096 x clock: f_ref is the boost clock (third-party 1980 MHz), "
          "assuming TPA reads 1 at the capped peak (unverified on hardware)"),
    _spec("h800_pcie", "NVIDIA H800 PCIe", "hopper", 114, 1755, 1620,
          {**rates(114, 4096, 1620, fp8=True), "fp64": 0.8}, (r"\bh800\b.*\bpcie\b",),
          350, "NVIDIA H800 PCIe sheet: BF16 1513 TF sparse -> 756 dense, as H100 PCIe (1620 MHz); FP64 0.8 TF",
          clocks={"fp64": 1755}),
    _spec("h800_sxm", "NVIDIA H800 SXM", "hopper", 132, 1980, 1830,
          {**rates(132, 4096, 1830, fp8=True), "fp64": 1}, (r"\bh800\b",),
          700, "NVIDIA H800 SXM5 sheet: BF16 1979 TF sparse -> 989.5 dense, as H100 SXM (1830 MHz); FP64 1 TF",
          clocks={"fp64": 1980}),
    _spec("h100_nvl", "NVIDIA H100 NVL", "hopper", 132, 1785, 1545,
          {**rates(132, 4096, 1545, fp8=True), "fp64": 60}, (r"\bh100\b.*\bnvl\b",),
          400, "NVIDIA H100 NVL sheet: 1671 TF sparse BF16 -> 835.5 dense; f_ref derived",
          clocks={"fp64": 1785}),
    _spec("h100_pcie", "NVIDIA H100 PCIe", "hopper", 114, 1755, 1620,
          {**rates(114, 4096, 1620, fp8=True), "fp64": 51}, (r"\bh100\b.*\bpcie\b",),
          350, "NVIDIA H100 white paper table 3: 756 TF dense FP16 at 1620 MHz", clocks={"fp64": 1755}),
    _spec("h100_sxm", "NVIDIA H100 SXM", "hopper", 132, 1980, 1830,
          {**rates(132, 4096, 1830, fp8=True), "fp64": 67}, (r"\bh100\b",),
          700, "NVIDIA: 989.4 TF dense FP16 = 132 x 4096 x 1.83 GHz; max clock 1980", clocks={"fp64": 1980}),
    # --- Ada Lovelace: 1024 dense FP16 FLOP/SM/clk with FP32 accumulate on L4 and L40S, 512 on L40.
    _spec("l40s", "NVIDIA L40S", "ada", 142, 2520, 2520,
          {**rates(142, 1024, 2520, fp8=True), "fp64": 1.43}, (r"\bl40s\b",),
          350, "NVIDIA L40S sheet: BF16 733 TF sparse -> 366.5 dense (its dense column's 362 disagrees with "
          "142 x 1024 x 2.52 GHz), FP8 1466 sparse, TF32 366 sparse; f_ref = boost 2520 MHz (derived)",
          mig_slices=0),
    _spec("l40", "NVIDIA L40", "ada", 142, 2490, 2490,
          {**rates(142, 512, 2490, fp8=True), "fp64": 1.41}, (r"\bl40\b",),
          300, "NVIDIA L40 sheet: BF16 181.05 TF dense (FP32 accumulate), FP8 362, TF32 90.5; = 142 x 512 x "
          "2.49 GHz boost (derived)", mig_slices=0),
    _spec("l4", "NVIDIA L4", "ada", 58, 2040, 2040,
          {**rates(58, 1024, 2040, fp8=True), "fp64": 0.47}, (r"\bl4\b",),
          72, "NVIDIA L4 sheet: FP16/BF16 242 TF sparse -> 121 dense, FP8 485 sparse, TF32 120 sparse; "
          "= 58 x 1024 x 2.04 GHz boost (derived)", mig_slices=0),
    # --- Ampere: GA100 2048 dense FP16 FLOP/SM/clk, GA102 (A10) 1024.
    _spec("a10", "NVIDIA A10", "ampere", 72, 1695, 1695,
          {**rates(72, 1024, 1695), "fp64": 0.49}, (r"\ba10\b",),
          150, "NVIDIA A10 sheet: BF16 125 TF dense (250 sparse), TF32 62.5, INT8 250; = 72 x 1024 x 1.695 GHz "
          "boost (derived)", mig_slices=0),
    _spec("a30", "NVIDIA A30", "ampere", 56, 1440, 1440,
          {**rates(56, 2048, 1440), "fp64": 10.3}, (r"\ba30\b",),
          165, "NVIDIA A30 sheet: BF16 165 TF dense (330 sparse), TF32 82, INT8 330, FP64 Tensor 10.3; "
          "= 56 x 2048 x 1.44 GHz boost (derived)", mig_slices=4),
    _spec("a800_pcie", "NVIDIA A800 PCIe", "ampere", 108, 1410, 1410,
          {**rates(108, 2048, 1410), "fp64": 19.5}, (r"\ba800\b.*\bpcie\b",),
          300, "NVIDIA A800 PCIe sheet: BF16 312 TF dense, as A100 PCIe (1410 MHz)"),
    _spec("a800_sxm", "NVIDIA A800 SXM", "ampere", 108, 1410, 1410,
          {**rates(108, 2048, 1410), "fp64": 19.5}, (r"\ba800\b",),
          400, "NVIDIA A800 SXM4 sheet: BF16 312 TF dense, as A100 SXM (1410 MHz)"),
    _spec("a100_pcie", "NVIDIA A100 PCIe", "ampere", 108, 1410, 1410,
          {**rates(108, 2048, 1410), "fp64": 19.5}, (r"\ba100\b.*\bpcie\b",),
          300, "NVIDIA A100 sheet: 312 TF dense FP16 at 1410 MHz"),
    _spec("a100_sxm", "NVIDIA A100 SXM", "ampere", 108, 1410, 1410,
          {**rates(108, 2048, 1410), "fp64": 19.5}, (r"\ba100\b",),
          400, "NVIDIA A100 sheet: 312 TF dense FP16 at 1410 MHz"),
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


# --- MIG: an instance's share of its GPU ---------------------------------------------------------
#
# A MIG GPU instance owns ``Ng`` of the GPU's compute slices: NVIDIA's MIG user guide lists
# each profile's "fraction of SMs" as N/7 on A100, H100, H200 and B200 (N/4 on A30). TPA is
# measured per instance, so an instance's peak is the GPU's peak x N / 7: seven 1g instances
# at TPA 1 together do what the whole GPU does, not seven times it. Profile names:
# ``1g.10gb``, ``1g.10gb+me``, ``3g.40gb``, ``1g.18gb`` (H200), ``1g.23gb`` (B200), NVML's
# ``MIG 1g.10gb``, compute instances ``1c.3g.40gb`` (the GPU instance is 3 slices).

_MIG_PROFILE = re.compile(r"(?:^|[^0-9a-z])(\d+)g\.\d+gb", re.IGNORECASE)


def mig_slices(profile: object) -> int | None:
    """The GPU instance's compute slices from a MIG profile name (``3g.40gb`` -> 3), or None."""
    match = _MIG_PROFILE.search(str(profile or ""))
    return int(match.group(1)) if match else None


@functools.lru_cache(maxsize=1024)
def _share(model: str | None, instance: bool, profile: str, slices: str) -> float | None:
    if not instance and not profile and not slices:
        return 1.0  # the whole GPU
    spec = find_spec(model)
    count = int(slices) if slices.strip().isdecimal() else mig_slices(profile)
    if spec is None or not count or not spec.mig_slices:
        return None  # a MIG instance of unknown size: no FLOP figure rather than the whole GPU's
    return min(count, spec.mig_slices) / spec.mig_slices


def is_mig_instance(attributes: Mapping[str, Any]) -> bool:
    """Whether ``attributes`` (a resource) name a MIG instance rather than a whole GPU."""
    return any(attributes.get(key) is not None for key in (GPU_MIG_INSTANCE, GPU_MIG_PROFILE, GPU_MIG_SLICES))


def instance_share(model: str | None, attributes: Mapping[str, Any]) -> float | None:
    """The fraction of the GPU's peak a sample or point stands for: 1 for a whole GPU.

    A MIG instance (``gpu.mig.instance_id``, ``gpu.mig.profile`` or ``gpu.mig.slices`` in
    ``attributes``) stands for its slices over the GPU's; None when its size is unknown.
    """
    if not is_mig_instance(attributes):
        return 1.0
    instance, profile, slices = (attributes.get(GPU_MIG_INSTANCE), attributes.get(GPU_MIG_PROFILE),
                                 attributes.get(GPU_MIG_SLICES))
    return _share(model, instance is not None, str(profile or ""), str(slices or ""))
