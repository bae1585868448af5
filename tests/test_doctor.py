"""``otel-ofu doctor`` and ``otel-ofu run`` without a config: on this bare machine and through fakes."""

from __future__ import annotations

import json

import pynvml
import pytest

from otel_ofu.cli import doctor
from otel_ofu.cli import main as cli
from otel_ofu.gpu import dcgm_api, nvml_api
from tests.fakes.clock import FakeClock
from tests.fakes.dcgm import FakeDcgmEngine, FakeDcgmGpu
from tests.fakes.nvml import FakeNvml, FakeNvmlGpu, MissingNvml

A100 = dict(name="NVIDIA A100-SXM4-80GB", arch=pynvml.NVML_DEVICE_ARCH_AMPERE, gpm=False)


def missing_dcgm(path):
    raise dcgm_api.DcgmError("dcgm_missing", dcgm_api.missing_message(path))


@pytest.fixture
def providers():
    """Install fake DCGM / NVML for code that asks the providers (cli commands); restore after."""
    installed = {}

    def install(dcgm=None, nvml=None):
        installed["dcgm"] = dcgm_api.set_loader(dcgm)
        installed["nvml"] = nvml_api.set_loader(nvml)

    yield install
    if installed:
        dcgm_api.set_loader(installed["dcgm"])
        nvml_api.set_loader(installed["nvml"])


def bare_machine() -> doctor.Report:
    report = doctor.diagnose()
    if report.best is not None or report.checks[0].status != "fail":
        pytest.skip("this machine has DCGM or a usable GPU source")
    return report


def test_doctor_on_a_machine_with_nothing_says_what_to_install(capsys):
    bare_machine()
    code = cli.main(["doctor"])
    out = capsys.readouterr().out
    assert code == 1
    assert "[FAIL] DCGM bindings" in out and "datacenter-gpu-manager-4" in out and "bindings_path" in out
    assert "[SKIP] DCGM host engine" in out
    assert "[FAIL] NVML" in out and ("libnvidia-ml.so.1" in out or "driver" in out)
    assert "collector-config/demo.yaml" in out


def test_doctor_json_on_a_machine_with_nothing(capsys):
    bare_machine()
    assert cli.main(["doctor", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["usable"] is False and report["best_source"] is None
    by_name = {c["name"]: c for c in report["checks"]}
    assert by_name["DCGM bindings"]["status"] == "fail"
    assert by_name["NVML"]["status"] == "fail" and by_name["NVML"]["fix"]


def test_run_without_config_and_no_gpu_exits_non_zero_with_the_demo_hint(capsys):
    bare_machine()
    code = cli.main(["run", "--duration", "1"])
    captured = capsys.readouterr()
    assert code != 0
    assert "otel-ofu run --config collector-config/demo.yaml" in captured.err
    assert captured.out == ""  # nothing simulated, no table


def test_dcgm_with_profiling_is_the_best_source(providers, capsys):
    engine = FakeDcgmEngine([FakeDcgmGpu(0), FakeDcgmGpu(1, name="NVIDIA H100 80GB HBM3")])
    providers(dcgm=engine.bindings, nvml=FakeNvml([FakeNvmlGpu(), FakeNvmlGpu()]))
    assert cli.main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["best_source"] == "dcgm" and report["dcgm_address"] == "localhost"
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses == {"DCGM bindings": "ok", "DCGM host engine": "ok", "DCGM profiling": "ok", "NVML": "ok",
                        "GPU 0": "ok", "GPU 1": "ok"}
    assert [g["usable"] for g in report["gpus"]] == [True, True]
    assert engine.watched == {}  # the doctor released its watches


def test_without_a_running_hostengine_the_doctor_tries_an_embedded_one():
    engine = FakeDcgmEngine([FakeDcgmGpu(0)])
    engine.running = False  # nothing listens on localhost:5555
    report = doctor.diagnose(dcgm_loader=engine.bindings, nvml_loader=MissingNvml())
    assert report.best == "dcgm" and report.dcgm_address == ""
    assert engine.addresses == ["localhost", None]
    assert "embedded host engine" in report.render()


def test_profiling_without_root_falls_back_to_gpm_and_says_why():
    engine = FakeDcgmEngine([FakeDcgmGpu(0)])
    engine.profiling = "no_permission"
    report = doctor.diagnose(dcgm_loader=engine.bindings, nvml_loader=FakeNvml([FakeNvmlGpu()]))
    assert report.best == "nvml"
    profiling = next(c for c in report.checks if c.name == "DCGM profiling")
    assert profiling.status == "fail" and "root" in profiling.fix
    assert "uses the nvml receiver" in report.render()


def test_an_a100_without_dcgm_has_no_source_and_the_doctor_says_why():
    api = FakeNvml([FakeNvmlGpu(**A100)])
    report = doctor.diagnose(dcgm_loader=missing_dcgm, nvml_loader=api)
    assert report.best is None
    gpu = next(c for c in report.checks if c.name == "GPU 0")
    assert gpu.status == "warn" and "Hopper" in gpu.fix and "dcgm receiver" in gpu.fix
    assert "Ampere" in gpu.detail
    assert report.to_dict()["gpus"][0]["gpm"] is False


def test_a_lost_gpu_is_named_and_the_others_still_count():
    api = FakeNvml([FakeNvmlGpu(), FakeNvmlGpu(lost=True)])
    report = doctor.diagnose(dcgm_loader=missing_dcgm, nvml_loader=api)
    assert report.best == "nvml"
    lost = next(c for c in report.checks if c.name == "GPU 1")
    assert lost.status == "fail" and "[gpu_lost]" in lost.detail and "Xid" in lost.fix


def test_run_without_config_uses_the_best_source_and_says_so(providers, capsys):
    api = FakeNvml([FakeNvmlGpu(tpa=0.5)], FakeClock())
    providers(dcgm=missing_dcgm, nvml=api)
    code = cli.main(["run", "--duration", "0.2"])
    err = capsys.readouterr().err
    assert code == 0
    assert "using the nvml receiver (NVML GPM)" in err
    assert api.calls.count("nvmlInit") >= 2  # the diagnosis, then the receiver itself


def test_the_built_in_pipeline_validates_for_each_source():
    from otel_ofu.pipeline import registry
    from otel_ofu.pipeline.config import parse_service_config

    for dcgm_usable, nvml_usable, receiver in ((True, True, "dcgm"), (False, True, "nvml")):
        report = doctor.Report("h", dcgm_usable=dcgm_usable, nvml_usable=nvml_usable)
        config = parse_service_config(doctor.auto_document(report), "<auto>", registry.factories())
        assert config.pipelines[0].receivers == [receiver]
        assert config.pipelines[0].processors == ["ofu"] and config.pipelines[0].exporters == ["console"]


def test_doctor_checks_a_dcgm_exporter_page_for_the_inputs_ofu_needs(capsys):
    """Issue 23 item 3: a served page without profiling fields fails the check, naming the field and the fix;
    a page with them passes."""
    from pathlib import Path

    from tests.e2e_util import PageServer

    real = Path(__file__).parent / "data" / "real" / "dcgm-exporter"
    pages = {"/bad/metrics": (real / "4.5.3-4.8.2_h100-pcie_no-profiling.prom").read_bytes(),
             "/good/metrics": (real / "4.5.3-4.8.2_h100_kubernetes.prom").read_bytes()}
    with PageServer(pages) as server:
        bad, good = f"{server.url}/bad/metrics", f"{server.url}/good/metrics"
        assert cli.main(["doctor", "--dcgm-exporter", bad, "--dcgm-exporter", good]) == 1
        text = capsys.readouterr().out
        assert cli.main(["doctor", "--json", "--dcgm-exporter", good]) == 0
        checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert f"[FAIL] dcgm-exporter {bad}: 1 GPU entities, but no DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" in text
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge" in text and "dcp-metrics-included.csv" in text
    assert f"[OK  ] dcgm-exporter {good}: 3 GPU entities" in text
    assert checks[f"dcgm-exporter {good}"]["status"] == "ok"
