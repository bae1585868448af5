"""The OFU math against hand-computed cases."""

import pytest

from otel_ofu.core import ofu, tiles
from otel_ofu.core.ofu import FREF_CONFIG, FREF_MAX_CLOCK, FREF_SPEC, OfuResult, compute_ofu
from otel_ofu.core.values import DCGM_FP64_BLANK, NoValue

H100 = "NVIDIA H100 80GB HBM3"


def test_h100_sxm_divides_by_the_tensor_reference_clock_not_the_max():
    result = compute_ofu(0.80, 1830, H100, "bf16", 1980, apply_correction=False)
    assert isinstance(result, OfuResult)
    assert result.raw == pytest.approx(0.80)  # at f_ref, OFU_raw == TPA
    assert result.fref_mhz == 1830 and result.fref_source == FREF_SPEC
    # The clock-domain error: dividing by the max clock would read 0.80 * 1830 / 1980 = 0.7394, 7.6 % low.
    wrong = ofu.ofu_raw(0.80, 1830, 1980)
    assert wrong == pytest.approx(0.739394, abs=1e-6)
    assert 1 - wrong / result.raw == pytest.approx(0.0758, abs=1e-4)


def test_h100_at_max_clock_reads_above_tpa():
    result = compute_ofu(0.5, 1980, H100, "bf16", apply_correction=False)
    assert result.raw == pytest.approx(0.5 * 1980 / 1830)


def test_a100_sanity_point_from_nvidia_docs():
    # TPA 0.929 at SM clock 1215 MHz on A100: 0.929 * 1215 / 1410 = 0.8005
    result = compute_ofu(0.929, 1215, "NVIDIA A100-SXM4-80GB", "fp16", apply_correction=False)
    assert result.raw == pytest.approx(0.80053, abs=1e-5)
    assert result.achieved_flops == pytest.approx(0.80053 * 312e12, rel=2e-3)  # 108 x 2048 x 1.41 GHz = 311.9 TF


def test_unknown_model_falls_back_to_reported_max_clock_and_says_so():
    result = compute_ofu(0.6, 1500, "NVIDIA Hypothetical X1", "bf16", 2000, apply_correction=True)
    assert result.fref_source == FREF_MAX_CLOCK and result.fref_mhz == 2000
    assert result.raw == pytest.approx(0.45)
    assert result.correction == 1.0  # no architecture, no correction
    assert result.achieved_flops is None  # no peak to multiply by


def test_unknown_model_without_max_clock_has_no_value():
    assert compute_ofu(0.6, 1500, "NVIDIA Hypothetical X1") is NoValue.NO_REFERENCE_CLOCK


def test_config_override_of_the_reference_clock():
    result = compute_ofu(0.6, 1500, "NVIDIA Hypothetical X1", fref_overrides={"NVIDIA Hypothetical X1": 1500.0})
    assert result.fref_source == FREF_CONFIG and result.raw == pytest.approx(0.6)


def test_correction_and_achieved_flops():
    result = compute_ofu(0.5, 1830, H100, "fp8")
    c = tiles.DEFAULT_CORRECTIONS["hopper"]["fp8"]
    assert result.correction == c
    assert result.corrected == pytest.approx(0.5 * c)
    assert result.achieved_flops == pytest.approx(0.5 * c * 1978.9e12, rel=1e-3)


def test_unknown_precision_uses_bf16_correction_and_no_achieved_flops():
    result = compute_ofu(0.5, 1830, H100, "unknown")
    assert result.correction == tiles.DEFAULT_CORRECTIONS["hopper"]["bf16"]
    assert result.achieved_flops is None


@pytest.mark.parametrize(
    ("tpa", "clock", "reason"),
    [
        (DCGM_FP64_BLANK, 1830, NoValue.BLANK),
        (float("nan"), 1830, NoValue.NAN),
        (-0.1, 1830, NoValue.NEGATIVE),
        (1.5, 1830, NoValue.OUT_OF_RANGE),
        (0.5, 0, NoValue.ZERO_CLOCK),
        (0.5, None, NoValue.MISSING),
        (None, 1830, NoValue.MISSING),
    ],
)
def test_bad_inputs_give_a_reason_not_a_number(tpa, clock, reason):
    assert compute_ofu(tpa, clock, H100) is reason


def test_tpa_overshoot_within_tolerance_is_clamped():
    assert compute_ofu(1.01, 1830, H100, apply_correction=False).raw == pytest.approx(1.0)


def test_mean_clock_averages_samples_inside_the_window_only():
    samples = [(0, 1000.0), (1, 1700.0), (2, 1800.0), (3, 0.0), (4, 1900.0), (5, 2000.0)]
    mean, n = ofu.mean_clock(samples, start_ns=0, end_ns=4)  # (0, 4]: 1700, 1800, [0 is invalid], 1900
    assert (mean, n) == (pytest.approx(1800.0), 3)
    assert ofu.mean_clock(samples, 5, 9) == (None, 0)
    assert ofu.mean_clock([(10, 1500.0)], 0, 10) == (1500.0, 1)
