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


# --- the GPUs of current fleets, as DCGM / NVML / dcgm-exporter name them (docs/gpus.md) -----------

@pytest.mark.parametrize(("model", "key"), [
    ("NVIDIA A800-SXM4-80GB", "a800_sxm"), ("NVIDIA A800 80GB PCIe", "a800_pcie"), ("NVIDIA H800", "h800_sxm"),
    ("NVIDIA H800 PCIe", "h800_pcie"), ("NVIDIA H20", "h20"), ("NVIDIA H20-3e", "h20"), ("NVIDIA A30", "a30"),
    ("NVIDIA A10", "a10"), ("NVIDIA L4", "l4"), ("NVIDIA L40", "l40"), ("NVIDIA L40S", "l40s"),
    ("NVIDIA H200", "h200_sxm"), ("NVIDIA GH200 480GB", "gh200"), ("NVIDIA B200", "b200"), ("NVIDIA GB200", "gb200"),
    ("NVIDIA B300 SXM6 AC", "b300"), ("NVIDIA GB300", "gb300"),
])
def test_current_fleet_models_match(model, key):
    assert specs.find_spec(model).key == key


@pytest.mark.parametrize("model", ["NVIDIA A10G", "NVIDIA A100-SXM4-40GB", "NVIDIA H200 NVL"])
def test_near_names_do_not_take_the_new_entries(model):
    spec = specs.find_spec(model)
    assert spec is None or spec.key not in ("a10", "h20", "l4")


@pytest.mark.parametrize(("key", "precision", "tflops"), [
    # The sheets' dense figures (sparse ones halved); docs/gpus.md cites each.
    ("a800_sxm", "bf16", 312), ("a30", "bf16", 165), ("a30", "tf32", 82), ("a30", "fp64", 10.3),
    ("a10", "bf16", 125), ("a10", "tf32", 62.5), ("l4", "bf16", 121), ("l4", "fp8", 242.5),
    ("l40", "bf16", 181.05), ("l40", "fp8", 362), ("l40s", "bf16", 366.5), ("l40s", "fp8", 733),
    ("h800_sxm", "bf16", 989.5), ("h800_sxm", "fp64", 1), ("h800_pcie", "bf16", 756), ("h20", "bf16", 148),
    ("h20", "fp8", 296), ("b300", "bf16", 2250), ("b300", "fp4", 13500), ("gb300", "fp4", 15000),
    ("gb300", "bf16", 2500),
])
def test_new_entries_match_their_sheets(key, precision, tflops):
    assert specs.SPECS_BY_KEY[key].peak(precision).flops == pytest.approx(tflops * 1e12, rel=0.008)  # sheets round


def test_derived_reference_clocks_are_the_peak_over_sms_times_the_per_sm_rate():
    for key, per_sm in (("b300", 8192), ("gb300", 8192), ("l4", 1024), ("l40s", 1024), ("a30", 2048), ("l40", 512)):
        spec = specs.SPECS_BY_KEY[key]
        assert spec.peak("bf16").flops == pytest.approx(spec.sm_count * per_sm * spec.tensor_ref_clock_mhz * 1e6,
                                                        rel=1e-4), key


@pytest.mark.parametrize(("text", "key"), [
    ("bf16-mixed", "bf16"), ("bf16-true", "bf16"), ("torch.bfloat16", "bf16"), ("jnp.bfloat16", "bf16"),
    ("dtype('bfloat16')", "bf16"), ("bf16_mixed", "bf16"), ("te.DType.kBFloat16", "bf16"),
    ("16-mixed", "fp16"), ("16", "fp16"), ("torch.float16", "fp16"), ("torch.half", "fp16"),
    ("fp8_e4m3", "fp8"), ("float8_e4m3fn", "fp8"), ("torch.float8_e5m2", "fp8"), ("float8_e4m3fnuz", "fp8"),
    ("jax.numpy.float8_e4m3b11fnuz", "fp8"), ("Format.HYBRID", "fp8"), ("hybrid", "fp8"),
    ("transformer-engine", "fp8"), ("transformer-engine-float16", "fp8"), ("bf16_with_fp8_mixed", "fp8"),
    ("MXFP8BlockScaling", "fp8"), ("DelayedScaling", "fp8"),
    ("torch.float4_e2m1fn_x2", "fp4"), ("float4_e2m1fn", "fp4"), ("NVFP4BlockScaling", "fp4"), ("MXFP4", "fp4"),
    ("64-true", "fp64"), ("torch.float64", "fp64"), ("torch.int8", "int8"), ("tensorfloat32", "tf32"),
    ("32-true", "unknown"), ("float32", "unknown"), ("torch.float32", "unknown"), ("32", "unknown"),
])
def test_framework_precision_spellings(text, key):
    assert specs.normalize_precision(text) == key


@pytest.mark.parametrize(("profile", "slices"), [
    ("1g.10gb", 1), ("1g.10gb+me", 1), ("1g.20gb", 1), ("3g.40gb", 3), ("7g.80gb", 7), ("MIG 2g.20gb", 2),
    ("1g.18gb", 1), ("7g.141gb", 7), ("1g.23gb", 1), ("4g.90gb", 4), ("1c.3g.40gb", 3), ("profile-0", None),
    ("", None), (None, None),
])
def test_mig_slices_from_profile_names(profile, slices):
    assert specs.mig_slices(profile) == slices


@pytest.mark.parametrize(("model", "attributes", "share"), [
    ("NVIDIA H100 80GB HBM3", {}, 1.0),
    ("NVIDIA H100 80GB HBM3", {"gpu.mig.instance_id": "7", "gpu.mig.profile": "1g.10gb"}, 1 / 7),
    ("NVIDIA H200", {"gpu.mig.instance_id": "1", "gpu.mig.profile": "3g.71gb"}, 3 / 7),
    ("NVIDIA B200", {"gpu.mig.instance_id": "1", "gpu.mig.profile": "1g.23gb"}, 1 / 7),
    ("NVIDIA A100-SXM4-80GB", {"gpu.mig.instance_id": "1", "gpu.mig.profile": "profile-9", "gpu.mig.slices": "2"},
     2 / 7),  # the dcgm receiver names profiles by id and gives the slices
    ("NVIDIA A30", {"gpu.mig.instance_id": "1", "gpu.mig.profile": "1g.6gb"}, 1 / 4),  # A30: 4 slices
    ("NVIDIA B300 SXM6 AC", {"gpu.mig.instance_id": "1", "gpu.mig.profile": "1g.34gb"}, 1 / 7),
    ("NVIDIA L4", {"gpu.mig.instance_id": "1", "gpu.mig.profile": "1g.6gb"}, None),  # no MIG on Ada
    ("NVIDIA H100 80GB HBM3", {"gpu.mig.instance_id": "1"}, None),  # a MIG instance of unknown size
    ("Mystery GPU", {"gpu.mig.instance_id": "1", "gpu.mig.profile": "1g.10gb"}, None),
])
def test_a_mig_instance_stands_for_its_slices_of_the_gpu(model, attributes, share):
    assert specs.instance_share(model, attributes) == share
