"""The tile-quantization model and the fleet correction factors."""

import pytest

from otel_ofu.core import tiles
from otel_ofu.core.tiles import Tile, correction_factor, flops_weighted_efficiency, tile_efficiency

HOPPER_BF16 = tiles.ARCH_TILES["hopper"]["bf16"]  # 128 x 256 x 64


def test_aligned_shapes_waste_nothing():
    assert tile_efficiency(4096, 4096, 4096, HOPPER_BF16) == 1.0
    assert tile_efficiency(128, 256, 64, HOPPER_BF16) == 1.0


def test_ragged_shapes_hand_computed():
    # M=130 pads to 256 (2 tiles of 128): 130/256; N=256 and K=64 aligned.
    assert tile_efficiency(130, 256, 64, HOPPER_BF16) == pytest.approx(130 / 256)
    # 5000 x 3000 x 1000 on 128x256x64: 5000/5120 * 3000/3072 * 1000/1024
    assert tile_efficiency(5000, 3000, 1000, HOPPER_BF16) == pytest.approx(5000 / 5120 * 3000 / 3072 * 1000 / 1024)


def test_efficiency_is_flops_weighted_over_a_mix():
    tile = Tile(128, 128, 128)
    big, small = (1280, 1280, 1280), (64, 128, 128)
    eff = flops_weighted_efficiency([big, small], tile)
    useful = 1280**3 + 64 * 128 * 128
    executed = 1280**3 + 128 * 128 * 128
    assert eff == pytest.approx(useful / executed)


def test_invalid_shape_is_rejected_by_name():
    with pytest.raises(ValueError, match="M=0"):
        tile_efficiency(0, 1, 1, HOPPER_BF16)


def test_default_table_is_the_documented_computation():
    assert tiles.DEFAULT_CORRECTIONS == tiles.default_corrections()
    for arch, table in tiles.DEFAULT_CORRECTIONS.items():
        for precision, factor in table.items():
            # Raw OFU reads 1-3 pp above MFU (REFERENCE.md): the factor must shrink it by a few percent.
            assert 0.95 <= factor <= 0.99, (arch, precision, factor)


def test_override_precedence():
    overrides = {"hopper/fp8": 0.9, "hopper": 0.95, "*": 0.99}
    assert correction_factor("hopper", "fp8", overrides) == 0.9
    assert correction_factor("hopper", "bf16", overrides) == 0.95
    assert correction_factor("ampere", "bf16", overrides) == 0.99
    assert correction_factor("ampere", "bf16") == tiles.DEFAULT_CORRECTIONS["ampere"]["bf16"]
    assert correction_factor(None, "bf16") == 1.0
    assert correction_factor("hopper", "unknown") == tiles.DEFAULT_CORRECTIONS["hopper"]["bf16"]


def test_a_jobs_own_correction_from_its_shapes():
    # 2,050 tokens on Blackwell's 256-row BF16 tile pad to 2,304: 2050 / 2304 = 0.88976, then the
    # pipe excess of aligned GEMMs (2 pp at 85 %): 0.88976 / 1.023529 = 0.86931
    assert tiles.job_correction([(2050, 256, 256)], "blackwell", "bf16") == 0.869
    assert tiles.job_correction([(2048, 256, 256)], "blackwell", "bf16") == round(1 / (1 + 0.02 / 0.85), 3)
    assert tiles.job_correction([(2050, 256, 256)], "hopper", "fp4") == tiles.job_correction(
        [(2050, 256, 256)], "hopper", "bf16")  # a precision the architecture has no tile for: BF16's
