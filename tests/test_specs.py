"""The GPU spec table: model strings as tools print them, and peaks as vendors quote them."""

import pytest

from otel_ofu.core import specs


@pytest.mark.parametrize(
    ("model", "key"),
    [
        ("NVIDIA H100 80GB HBM3", "h100_sxm"),
        ("NVIDIA H100 SXM5 80GB", "h100_sxm"),
        ("NVIDIA H100 PCIe", "h100_pcie"),
        ("NVIDIA H100 NVL", "h100_nvl"),
        ("NVIDIA H200", "h200_sxm"),
        ("NVIDIA H200 NVL", "h200_nvl"),
        ("NVIDIA GH200 480GB", "gh200"),
        ("NVIDIA A100-SXM4-80GB", "a100_sxm"),
        ("NVIDIA A100-SXM4-40GB", "a100_sxm"),
        ("NVIDIA A100-PCIE-40GB", "a100_pcie"),
        ("NVIDIA A100 80GB PCIe", "a100_pcie"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA GB200", "gb200"),
        ("h100_sxm", "h100_sxm"),
    ],
)
def test_model_strings_match(model, key):
    spec = specs.find_spec(model)
    assert spec is not None and spec.key == key


@pytest.mark.parametrize("model", ["NVIDIA GeForce RTX 4090", "Tesla V100-SXM2-16GB", "", None])
def test_unknown_models_do_not_match(model):
    assert specs.find_spec(model) is None


@pytest.mark.parametrize(
    ("key", "precision", "flops", "clock"),
    [
        ("h100_sxm", "bf16", 989.4e12, 1830),  # 132 x 4096 x 1.83 GHz
        ("h100_sxm", "tf32", 494.7e12, 1830),
        ("h100_sxm", "fp8", 1978.9e12, 1830),
        ("h100_pcie", "fp16", 756e12, 1620),
        ("a100_sxm", "fp16", 312e12, 1410),
        ("a100_sxm", "tf32", 156e12, 1410),
        ("a100_sxm", "int8", 624e12, 1410),
        ("b200", "bf16", 2.25e15, 1856),
        ("b200", "fp4", 9e15, 1856),
        ("gb200", "bf16", 2.5e15, 2062),
        ("gb200", "fp8", 5e15, 2062),
        ("h100_nvl", "bf16", 835.5e12, 1545),
    ],
)
def test_dense_peaks_match_vendor_sheets(key, precision, flops, clock):
    peak = specs.SPECS_BY_KEY[key].peak(precision)
    assert peak is not None
    assert peak.flops == pytest.approx(flops, rel=0.002)
    assert peak.clock_mhz == clock


def test_tensor_reference_clock_is_not_the_max_clock_on_h100():
    spec = specs.SPECS_BY_KEY["h100_sxm"]
    assert (spec.tensor_ref_clock_mhz, spec.max_sm_clock_mhz) == (1830, 1980)


def test_fp8_and_fp4_only_where_the_hardware_has_them():
    assert specs.SPECS_BY_KEY["a100_sxm"].peak("fp8") is None
    assert specs.SPECS_BY_KEY["h100_sxm"].peak("fp4") is None
    assert specs.SPECS_BY_KEY["b200"].peak("fp4") is not None


def test_every_spec_has_every_core_precision_and_a_source():
    for spec in specs.GPU_SPECS:
        for precision in ("tf32", "fp16", "bf16", "int8", "fp64"):
            assert spec.peak(precision) is not None, (spec.key, precision)
        assert spec.source and spec.sm_count > 0 and spec.max_sm_clock_mhz >= spec.tensor_ref_clock_mhz


@pytest.mark.parametrize(("text", "key"), [("BF16", "bf16"), ("bfloat16", "bf16"), ("nvfp4", "fp4"),
                                           ("FP8", "fp8"), ("e4m3", "fp8"), ("fp-16", "fp16"), ("", "unknown"),
                                           (None, "unknown"), ("fp12", "unknown")])
def test_precision_spellings(text, key):
    assert specs.normalize_precision(text) == key
