"""Tile quantization: tensor work that 2MNK does not count, and the fleet correction factor.

A GEMM of shape M x N x K runs on tiles of (tile_m, tile_n, tile_k); every partial tile is
padded and executed in full. TPA counts the padded work, MFU only 2MNK, so raw OFU reads
above MFU by 1-3 pp on GEMMs (REFERENCE.md section 1).

In fleet mode we do not know the shapes, so a single factor per (architecture, precision)
scales raw OFU. The paper's own formula is not public; ours is the product of two parts:

- the FLOP-weighted tile efficiency of a reference set of transformer training GEMMs
  (``REFERENCE_GEMMS``: hidden sizes 4096-16384, FFN 4x and SwiGLU 8/3x, vocab projections
  with odd vocab sizes, micro-batch token counts 2048-16384 and ragged sequence packing) on
  the tile each architecture's cuBLAS/CUTLASS kernels favour for that precision. Large
  training GEMMs pad little: this part is 0.996-0.998.
- ``PIPE_EXCESS``: even tile-aligned GEMMs read 1-3 pp above MFU in the paper's controlled
  runs at 75-90 % utilization (pipe cycles counted active while the MMA issue rate is below
  peak: prologue, epilogue, barriers). We take the midpoint, 2 pp at 85 %, i.e. raw OFU
  2.35 % high, as an assumption to be replaced by a site's own fit.

:func:`default_corrections` recomputes the table and a test pins it. A site that calibrates
on its own GEMMs (``benchmarks/gemm_validation.py`` prints a fitted factor per precision)
overrides it in the ``ofu`` processor's ``tile_correction`` key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Tile:
    m: int
    n: int
    k: int


# Tiles the libraries favour for large training GEMMs (CUTLASS default configurations).
# TF32 uses half the K depth of FP16; FP8/FP4 double it.
ARCH_TILES: dict[str, dict[str, Tile]] = {
    "ampere": {"tf32": Tile(128, 128, 16), "fp16": Tile(128, 256, 32), "bf16": Tile(128, 256, 32),
               "int8": Tile(128, 256, 64), "fp64": Tile(64, 64, 16)},
    # Ada (sm_89) runs Ampere-style mma.sync kernels, with FP8.
    "ada": {"tf32": Tile(128, 128, 16), "fp16": Tile(128, 256, 32), "bf16": Tile(128, 256, 32),
            "fp8": Tile(128, 256, 64), "int8": Tile(128, 256, 64), "fp64": Tile(64, 64, 16)},
    "hopper": {"tf32": Tile(128, 128, 32), "fp16": Tile(128, 256, 64), "bf16": Tile(128, 256, 64),
               "fp8": Tile(128, 256, 128), "int8": Tile(128, 256, 128), "fp64": Tile(64, 64, 16)},
    "blackwell": {"tf32": Tile(256, 128, 32), "fp16": Tile(256, 256, 64), "bf16": Tile(256, 256, 64),
                  "fp8": Tile(256, 256, 128), "fp4": Tile(256, 256, 256), "int8": Tile(256, 256, 128),
                  "fp64": Tile(64, 64, 16)},
}


def padded(extent: int, tile: int) -> int:
    return math.ceil(extent / tile) * tile


def tile_efficiency(m: int, n: int, k: int, tile: Tile) -> float:
    """Useful over executed tensor FLOPs for one GEMM: MNK / (padded M x padded N x padded K)."""
    if min(m, n, k) <= 0:
        raise ValueError(f"GEMM dimensions must be positive, got M={m} N={n} K={k}")
    return (m * n * k) / (padded(m, tile.m) * padded(n, tile.n) * padded(k, tile.k))


def flops_weighted_efficiency(shapes: list[tuple[int, int, int]], tile: Tile) -> float:
    """Efficiency of a mix of GEMMs: total useful FLOPs over total executed FLOPs."""
    useful = sum(m * n * k for m, n, k in shapes)
    executed = sum(padded(m, tile.m) * padded(n, tile.n) * padded(k, tile.k) for m, n, k in shapes)
    return useful / executed


def _reference_gemms() -> list[tuple[int, int, int]]:
    """Forward GEMMs (M tokens x N out x K in) of dense transformer layers; see module doc."""
    shapes = []
    for hidden in (4096, 5120, 8192, 12288, 16384):
        ffn_swiglu = int(8 * hidden / 3)
        for tokens in (2048, 4096, 8192, 16384, 3000, 6100):  # the last two: packed, ragged
            shapes += [
                (tokens, 3 * hidden, hidden),  # fused QKV
                (tokens, hidden, hidden),  # attention output
                (tokens, 4 * hidden, hidden),  # FFN up (GELU)
                (tokens, ffn_swiglu, hidden),  # FFN up (SwiGLU), usually ragged
                (tokens, hidden, ffn_swiglu),  # FFN down (SwiGLU)
                (tokens, 50257, hidden),  # vocab projection, odd vocab
                (tokens, 128256, hidden),
            ]
    return shapes


REFERENCE_GEMMS: tuple[tuple[int, int, int], ...] = tuple(_reference_gemms())


#: Relative excess of raw OFU over MFU on tile-aligned GEMMs (see module doc): 2 pp at 85 %.
PIPE_EXCESS = 0.02 / 0.85


def default_corrections() -> dict[str, dict[str, float]]:
    """c_tile per architecture and precision (see module doc), rounded to 1e-3."""
    pipe = 1.0 / (1.0 + PIPE_EXCESS)
    return {
        arch: {prec: round(flops_weighted_efficiency(list(REFERENCE_GEMMS), tile) * pipe, 3)
               for prec, tile in tiles.items()}
        for arch, tiles in ARCH_TILES.items()
    }


DEFAULT_CORRECTIONS: dict[str, dict[str, float]] = default_corrections()


def job_correction(shapes: list[tuple[int, int, int]] | tuple[tuple[int, int, int], ...], architecture: str,
                   precision: str) -> float:
    """c_tile for one job from its own GEMM shapes (M tokens x N out x K in), rounded to 1e-3.

    For a job whose shapes pad far more than the fleet's reference mix (a ragged vocabulary,
    odd packed lengths): the ofu processor's ``tile_correction.jobs`` takes it, so the job's OFU
    is its MFU and the loss account's padding part shows what its shapes cost.
    """
    table = ARCH_TILES[architecture]
    tile = table.get(precision, table[FALLBACK_PRECISION])
    return round(flops_weighted_efficiency(list(shapes), tile) / (1.0 + PIPE_EXCESS), 3)

#: Used when the precision is unknown: the BF16 factor, the most common training precision.
FALLBACK_PRECISION = "bf16"


def correction_factor(architecture: str | None, precision: str,
                      overrides: dict[str, float] | None = None) -> float:
    """c_tile for a GPU architecture and precision; 1.0 for an unknown architecture.

    ``overrides`` keys are ``"arch/precision"``, ``"arch"`` or ``"*"``, most specific first.
    """
    arch = architecture or "unknown"
    if overrides:
        for key in (f"{arch}/{precision}", arch, "*"):
            if key in overrides:
                return overrides[key]
    table = DEFAULT_CORRECTIONS.get(arch)
    if table is None:
        return 1.0
    return table.get(precision, table.get(FALLBACK_PRECISION, 1.0))
