"""``otel-ofu doctor`` and ``otel-ofu run`` without a config: on this bare machine and through fakes."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pynvml
import pytest

from otel_ofu.cli import doctor
from otel_ofu.cli import main as cli
from otel_ofu.gpu import dcgm_api, nvml_api
from tests.e2e_util import PageServer
from tests.fakes.clock import FakeClock
from tests.fakes.dcgm import FakeDcgmEngine, FakeDcgmGpu
from tests.fakes.nvml import FakeNvml, FakeNvmlGpu, MissingNvml
from tools.ports import free_ports

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


# --- doctor --dcgm-exporter: the common mistakes, and models otel-ofu does not know (issue 31 items 11, 12) ----

REAL_EXPORTER = Path(__file__).parent / "data" / "real" / "dcgm-exporter"
UNKNOWN_MODEL = "NVIDIA RTX PRO 6000 Blackwell Server Edition"  # nvidia-smi's name; not in core/specs.py


def with_model(capture: str, model: str) -> bytes:
    """A real dcgm-exporter page (tests/data/real/dcgm-exporter) with every GPU's modelName replaced."""
    return re.sub(rb'modelName="[^"]*"', f'modelName="{model}"'.encode(), (REAL_EXPORTER / capture).read_bytes())


def test_doctor_on_a_closed_port_says_nothing_listens_there_and_exits_1(capsys):
    """The most common mistake: the wrong port, or dcgm-exporter not running. Once an AttributeError."""
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}/metrics"
    assert cli.main(["doctor", "--dcgm-exporter", url]) == 1
    out = capsys.readouterr().out
    assert f"[FAIL] dcgm-exporter {url}: cannot scrape it: connection refused [connection_refused]" in out
    assert "fix: nothing listens there: check the host and port (dcgm-exporter's default is 9400)" in out
    assert cli.main(["doctor", "--json", "--dcgm-exporter", f"127.0.0.1:{port}"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["usable"] is False and [c["status"] for c in report["checks"]] == ["fail"]


def test_doctor_on_a_page_that_is_not_dcgm_exporters_says_what_it_got(capsys):
    """A 404, a login page (not Prometheus text), a JSON API: one failed check each, naming the URL."""
    pages = {"/login": b"<html><head><title>Grafana</title></head><body>Sign in</body></html>\n",
             "/api/v1/query": b'{"status":"success","data":{}}\n'}
    with PageServer(pages) as server:
        urls = [f"{server.url}/metrics", f"{server.url}/login", f"{server.url}/api/v1/query"]
        assert cli.main(["doctor", *(a for u in urls for a in ("--dcgm-exporter", u))]) == 1
    out = capsys.readouterr().out
    assert f"[FAIL] dcgm-exporter {urls[0]}: cannot scrape it: HTTP 404 Not Found [http_404]" in out
    assert "fix: the server answers but has no page there: dcgm-exporter serves /metrics" in out
    assert f"[FAIL] dcgm-exporter {urls[1]}: not Prometheus text: invalid metric name" in out
    assert f"[FAIL] dcgm-exporter {urls[2]}: not Prometheus text: Invalid labels" in out
    assert "Traceback" not in out


def test_doctor_on_a_host_that_never_answers_times_out_with_a_fix():
    """A port that accepts connections and never answers (a wrong service, a stuck exporter)."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/metrics"
        report = doctor.Report("h", exporter_pages=[url])
        doctor.check_dcgm_exporter(report, url, timeout=0.5)
    (check,) = report.checks
    assert (check.status, check.detail) == ("fail", "cannot scrape it: timed out [timeout]")
    assert "firewalls or a NetworkPolicy" in check.fix


def test_doctor_says_a_gpu_model_it_does_not_know_gets_no_ofu_and_gives_the_reference_clocks_fix(capsys):
    """A page (the H100 capture's) naming a model missing from the spec table and no max SM clock: `run`
    computes no OFU for it (tests/test_unknown_models.py), so the doctor fails it with the setting `run`
    logs. With DCGM_FI_DEV_SM_MAX_CLOCK_HERTZ (the B200 base-unit capture's), OFU divides by the reported
    max clock: a warning with the same fix, exit 0. Only the pages are the question: no local verdict."""
    pages = {"/none/metrics": with_model("4.5.3-4.8.2_h100_kubernetes.prom", UNKNOWN_MODEL),
             "/max/metrics": with_model("go-dcgm-4.6.1_b200_base-unit-fields.prom", UNKNOWN_MODEL),
             "/known/metrics": (REAL_EXPORTER / "4.5.3-4.8.2_h100_kubernetes.prom").read_bytes()}
    fix = (f"fix: set reference_clocks: {{'{UNKNOWN_MODEL}': <MHz at which its dense tensor peak is quoted>}} on "
           "the ofu processor (docs/gpus.md)")
    with PageServer(pages) as server:
        none, max_clock, known = (f"{server.url}/{p}/metrics" for p in ("none", "max", "known"))
        assert cli.main(["doctor", "--dcgm-exporter", none]) == 1
        out_none = capsys.readouterr().out
        assert cli.main(["doctor", "--dcgm-exporter", max_clock, "--dcgm-exporter", known]) == 0
        out_max = capsys.readouterr().out
    assert (f"[FAIL] dcgm-exporter {none}: 3 GPU entities of model '{UNKNOWN_MODEL}', which otel-ofu does not know "
            "(not in its spec table, docs/gpus.md), and the page has no DCGM_FI_DEV_MAX_SM_CLOCK: no OFU for them"
            ) in out_none
    assert f"[OK  ] dcgm-exporter {none}: 3 GPU entities with tensor activity and SM clock" in out_none
    assert fix in out_none and "Not every page gives OFU" in out_none
    assert (f"[WARN] dcgm-exporter {max_clock}: 2 GPU entities of model '{UNKNOWN_MODEL}', which otel-ofu does not "
            "know (not in its spec table, docs/gpus.md): OFU divides by its reported max SM clock (1965 MHz)"
            ) in out_max
    assert fix in out_max and "Usable: every page carries what OFU needs" in out_max
    assert f"dcgm-exporter {known}: 3 GPU entities" in out_max and out_max.count("[WARN]") == 1
    for out in (out_none, out_max):
        assert "No real GPU source is usable here" not in out and "DCGM bindings" not in out


def test_doctor_warns_about_a_local_gpu_model_it_does_not_know(capsys):
    """This machine's GPUs: NVML names a model the spec table lacks; `run` uses its max SM clock."""
    api = FakeNvml([FakeNvmlGpu(name=UNKNOWN_MODEL, tpa=0.5)], FakeClock())
    report = doctor.diagnose(dcgm_loader=missing_dcgm, nvml_loader=api)
    assert report.best == "nvml"
    (check,) = [c for c in report.checks if c.name == "GPU models"]
    assert check.status == "warn" and UNKNOWN_MODEL in check.detail and "max SM clock" in check.detail
    assert check.fix.startswith(f"set reference_clocks: {{'{UNKNOWN_MODEL}'")
