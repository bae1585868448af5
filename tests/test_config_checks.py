"""What ``otel-ofu validate`` and ``run`` tell an operator about a config: every problem at
once, the Collector's environment syntax, durations in the wrong unit, processors in the wrong
order; and ``exit_when_done`` for replays."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from otel_ofu.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
DMON = ROOT / "tests" / "data" / "replay" / "h100-dmon.txt"
RECORDED = ROOT / "tests" / "data" / "replay" / "sim-ofu.jsonl"


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def validate(capsys, path: Path) -> tuple[int, str]:
    code = main(["validate", "--config", str(path)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def pipeline(processors: str, receivers: str = "[sim]", extra: str = "") -> str:
    return f"""
receivers:
  sim: {{nodes: 1, gpus_per_node: 1}}
  replay: {{path: {RECORDED}}}
  selftelemetry: {{}}
processors:
  ofu: {{}}
  ofu/second: {{}}
  attribution: {{}}
  jobs: {{}}
exporters:
  file: {{path: out.jsonl}}
service:
  {extra}
  pipelines:
    metrics:
      receivers: {receivers}
      processors: {processors}
      exporters: [file]
"""


def test_every_problem_is_reported_at_once(tmp_path, capsys):
    path = write(tmp_path, """
receivers:
  sim: {nodes: 1, gpus_per_nodes: 8, seed: "x"}
processors:
  ofu: {tpa_tolerance: 0.9}
exporters:
  file: {}
service:
  pipelines:
    metrics:
      receivers: [sim]
      processors: [ofu]
      exporters: [file, console]
""")
    code, out = validate(capsys, path)
    assert code == 1
    assert "4 problems:" in out or "5 problems:" in out
    for words in ("receivers.sim: gpus_per_nodes: unknown key (did you mean 'gpus_per_node'?)",
                  "receivers.sim: seed: expected an integer", "processors.ofu: tpa_tolerance: must be within",
                  "exporters.file: path: required", "references 'console', which is not configured"):
        assert words in out, words


def test_every_problem_of_every_component_is_reported_in_one_run(tmp_path, capsys):
    """Before, a component's validate() stopped at its first problem and did not run at all beside a
    wrong type: 4 of these 12 problems were reported (jobs.windows: [] and
    prometheus.metric_expiration: 0s among those left out)."""
    path = write(tmp_path, """
receivers:
  sim: {nodes: 0, gpus_per_node: x, start_time: yesterday}
processors:
  ofu: {}
  jobs: {windows: [], resolution: abc, max_gap: 1s}
exporters:
  prometheus: {endpoint: "nohost", metric_expiration: 0s, namespace: "9bad"}
  file: {path: /nonexistent/x.jsonl, compression: lz4, rotation: {max_megabytes: 0}}
service:
  pipelines:
    metrics: {receivers: [sim], processors: [ofu, jobs], exporters: [prometheus, file]}
""")
    code, out = validate(capsys, path)
    reported = {tuple(line.split(": ")[1:3]) for line in out.splitlines() if line.startswith(f"  {path}: ")}
    assert code == 1 and reported == {
        ("receivers.sim", "nodes"), ("receivers.sim", "gpus_per_node"), ("receivers.sim", "start_time"),
        ("processors.jobs", "windows"), ("processors.jobs", "resolution"), ("processors.jobs", "max_gap"),
        ("exporters.prometheus", "endpoint"), ("exporters.prometheus", "metric_expiration"),
        ("exporters.prometheus", "namespace"),
        ("exporters.file", "path"), ("exporters.file", "compression"), ("exporters.file", "rotation.max_megabytes"),
    }, out
    assert "12 problems:" in out


def test_checks_on_a_key_of_the_wrong_type_are_not_run_on_its_default(tmp_path, capsys):
    """validate() runs on the defaults of keys whose value had the wrong type; what it finds about
    them (or from them: "at least resolution") is not reported, the type error is."""
    path = write(tmp_path, """
receivers:
  sim: {}
processors:
  ofu: {}
  jobs: {resolution: 1h, windows: [10s], job_timeout: [1]}
exporters:
  file: {path: out.jsonl}
service:
  pipelines:
    metrics: {receivers: [sim], processors: [ofu, jobs], exporters: [file]}
""")
    code, out = validate(capsys, path)
    assert code == 1 and "job_timeout: expected a duration" in out
    assert "windows[0]: must be at least resolution" in out  # about keys that were read: still checked
    assert "job_timeout: must be at least resolution" not in out and "silence_timeout" not in out, out


def test_bare_env_references_expand_as_in_the_collector(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DCGM_EXPORTER_URL", "http://gpu-node-01:9400/metrics")
    monkeypatch.setenv("SCRAPE_S", "15")
    path = write(tmp_path, """
receivers:
  dcgm_exporter: {endpoint: "${DCGM_EXPORTER_URL}", collection_interval: "${SCRAPE_S}", host_name: "$${HOST}"}
processors:
  ofu: {}
exporters:
  file: {path: out.jsonl}
service:
  pipelines:
    metrics: {receivers: [dcgm_exporter], processors: [ofu], exporters: [file]}
""")
    from otel_ofu.pipeline.service import load_config

    config = load_config(str(path))
    receiver = config.components["receivers"]["dcgm_exporter"]
    assert receiver.endpoint == "http://gpu-node-01:9400/metrics"
    assert receiver.collection_interval == 15.0
    assert receiver.host_name == "${HOST}"  # $$ is a literal $
    monkeypatch.delenv("DCGM_EXPORTER_URL")
    code, out = validate(capsys, path)
    assert code == 1 and "environment variable DCGM_EXPORTER_URL is not set" in out


@pytest.mark.parametrize(("value", "words"), [
    ("${DCGM_EXPORTER_URL:-http://localhost:9400}", "a default needs the env: prefix, as in the Collector"),
    ("${file:/etc/url}", "the 'file:' provider is not supported"),
    ("${1}", "is not an environment variable name"),
])
def test_env_references_the_collector_would_refuse_are_refused_at_validation(tmp_path, capsys, value, words):
    path = write(tmp_path, pipeline("[ofu]").replace("out.jsonl", f"'{value}'"))
    code, out = validate(capsys, path)
    assert code == 1 and words in out and "exporters.file.path" in out


def test_a_duration_that_looks_like_milliseconds_is_warned_about(tmp_path, capsys):
    path = write(tmp_path, pipeline("[ofu]").replace("gpus_per_node: 1}", "gpus_per_node: 1, collection_interval: "
                                                                        "30000}"))
    code, out = validate(capsys, path)
    assert code == 0
    assert "warning:" in out and "receivers.sim: collection_interval: 30000 is read as 30000 seconds (8.33h)" in out
    assert "write '30000ms' (30s)" in out
    quiet = write(tmp_path, pipeline("[ofu]").replace("gpus_per_node: 1}", "gpus_per_node: 1, collection_interval: "
                                                                         "30000ms}"), "quiet.yaml")
    code, out = validate(capsys, quiet)
    assert code == 0 and "warning" not in out


@pytest.mark.parametrize(("processors", "words"), [
    ("[]", "[] has no ofu processor: the GPU samples of sim become metrics only there"),
    ("[jobs, ofu]", "'jobs' reads the gpu.ofu points the ofu processor makes, but comes before any: list it after "
                    "'ofu'"),
    ("[ofu, attribution]", "'attribution' comes after 'ofu', which has already turned the GPU samples into metric "
                           "points"),
    ("[jobs]", "add the ofu processor before it"),
    ("[ofu, ofu]", "lists ofu more than once"),
])
def test_processor_order_is_checked(tmp_path, capsys, processors, words):
    code, out = validate(capsys, write(tmp_path, pipeline(processors)))
    assert code == 1 and "service.pipelines.metrics: processors:" in out and words in out


@pytest.mark.parametrize(("processors", "receivers"), [
    ("[attribution, ofu, jobs]", "[sim]"),
    ("[ofu, ofu/second]", "[sim]"),
    ("[]", "[replay]"),  # a recording of points: nothing to compute
    ("[jobs]", "[replay]"),
    ("[]", "[selftelemetry]"),
])
def test_orders_that_work_are_accepted(tmp_path, capsys, processors, receivers):
    assert validate(capsys, write(tmp_path, pipeline(processors, receivers)))[0] == 0


def run_cli(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "otel_ofu", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def test_a_max_speed_replay_exits_when_done_with_the_flag_or_the_setting(tmp_path):
    config = write(tmp_path, f"""
receivers:
  replay: {{path: {DMON}, speed: max, model: NVIDIA H100 80GB HBM3, host_name: node7}}
  selftelemetry: {{}}
processors:
  ofu: {{}}
exporters:
  file: {{path: {tmp_path / 'out.jsonl'}}}
service:
  pipelines:
    metrics: {{receivers: [replay, selftelemetry], processors: [ofu], exporters: [file]}}
""")
    done = run_cli("run", "--config", str(config), "--exit-when-done", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "every finite receiver is done (replay): stopping" in done.stderr
    points = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    hosts_gpus = {(a["value"]["stringValue"], b["value"]["stringValue"])
                  for doc in points for rm in doc.get("resourceMetrics", ())
                  for a in rm["resource"]["attributes"] if a["key"] == "host.name"
                  for b in rm["resource"]["attributes"] if b["key"] == "gpu.index"}
    assert hosts_gpus == {("node7", "0"), ("node7", "1")}
    setting = write(tmp_path, config.read_text().replace("  pipelines:", "  exit_when_done: true\n  pipelines:"),
                    "setting.yaml")
    assert run_cli("run", "--config", str(setting), cwd=tmp_path).returncode == 0


def test_a_replay_that_sends_nothing_exits_non_zero(tmp_path):
    bad = tmp_path / "bad.dmon"
    bad.write_text(DMON.read_text().replace("GPU 1     0.000        1980", "GPU 1     0.000", 1))
    config = write(tmp_path, pipeline("[ofu]", "[replay]", "exit_when_done: true").replace(str(RECORDED), str(bad)))
    done = run_cli("run", "--config", str(config), cwd=tmp_path)
    assert done.returncode == 1 and "replay sent nothing" in done.stderr and "bad.dmon:5" in done.stderr


# --- validate and run agree ---------------------------------------------------------------------

_SIM = "receivers: {sim: {nodes: 1, gpus_per_node: 1}}\n"
_PIPE = "service: {pipelines: {metrics: {receivers: [%s], processors: [%s], exporters: [%s]}}}\n"


def _kubeconfig(tmp_path: Path, context: str = "test") -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}}}]
users: [{{name: u, user: {{token: not-a-real-token}}}}]
contexts: [{{name: {context}, context: {{cluster: c, user: u}}}}]
current-context: {context}
""")
    return path


def _attribution(api: str) -> str:
    return _SIM + f"processors: {{attribution: {{kubernetes_api: {api}}}, ofu: {{}}}}\nexporters: {{console: {{}}}}\n" \
        + _PIPE % ("sim", "attribution, ofu", "console")


def _case(name: str, tmp_path: Path) -> tuple[str, dict[str, str]]:
    """(config text, environment) of each case: what `run` checks when it starts."""
    not_a_cert = tmp_path / "not-a-cert.pem"
    not_a_cert.write_text("not a certificate\n")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    node = {"K8S_NODE_NAME": "gpu-node-1"}
    cases = {
        "k8s_no_node_name": (_attribution(f"{{enabled: true, kubeconfig: {_kubeconfig(tmp_path)}}}"), {}),
        "k8s_kubeconfig_missing": (_attribution(f"{{enabled: true, kubeconfig: {tmp_path / 'nope'}}}"), node),
        "k8s_kubeconfig_unknown_context": (
            _attribution(f"{{enabled: true, kubeconfig: {_kubeconfig(tmp_path)}, context: other}}"), node),
        "file_path_is_a_directory": (
            _SIM + f"processors: {{ofu: {{}}}}\nexporters: {{file: {{path: {tmp_path}}}}}\n"
            + _PIPE % ("sim", "ofu", "file"), {}),
        "prometheus_tls_not_a_certificate": (
            _SIM + "processors: {ofu: {}}\nexporters: {prometheus: {endpoint: '127.0.0.1:0', "
            f"tls: {{cert_file: {not_a_cert}, key_file: {not_a_cert}}}}}}}\n"
            + _PIPE % ("sim", "ofu", "prometheus"), {}),
        "otlp_receiver_tls_not_a_certificate": (
            f"receivers: {{otlp: {{protocols: {{grpc: {{endpoint: '127.0.0.1:0', tls: {{cert_file: {not_a_cert}, "
            f"key_file: {not_a_cert}}}}}}}}}}}\nexporters: {{console: {{}}}}\n" + _PIPE % ("otlp", "", "console"), {}),
        "jobs_storage_under_a_file": (
            _SIM + f"processors: {{ofu: {{}}, jobs: {{storage: {a_file}/state}}}}\nexporters: {{console: {{}}}}\n"
            + _PIPE % ("sim", "ofu, jobs", "console"), {}),
        "queue_storage_under_a_file": (
            _SIM + "processors: {ofu: {}}\nexporters: {otlp: {endpoint: '127.0.0.1:1', tls: {insecure: true}, "
            f"sending_queue: {{storage: {a_file}/queue}}}}}}\n" + _PIPE % ("sim", "ofu", "otlp"), {}),
        "k8s_with_node_name_and_kubeconfig": (_attribution(f"{{enabled: true, kubeconfig: {_kubeconfig(tmp_path)}}}"),
                                              node),
        "plain": (_SIM + "processors: {ofu: {}}\nexporters: {console: {}}\n" + _PIPE % ("sim", "ofu", "console"), {}),
    }
    return cases[name]


def _cli(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("K8S_NODE_NAME", "KUBERNETES_SERVICE_HOST")}
    return subprocess.run([sys.executable, "-m", "otel_ofu", *args], cwd=tmp_path, env={**environ, **env},
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name, refused_key", [
    ("k8s_no_node_name", "processors.attribution: kubernetes_api.node_name"),
    ("k8s_kubeconfig_missing", "processors.attribution: kubernetes_api.kubeconfig"),
    ("k8s_kubeconfig_unknown_context", "processors.attribution: kubernetes_api.kubeconfig"),
    ("file_path_is_a_directory", "exporters.file: path"),
    ("prometheus_tls_not_a_certificate", "exporters.prometheus: tls.cert_file"),
    ("otlp_receiver_tls_not_a_certificate", "receivers.otlp: protocols.grpc.tls.cert_file"),
    ("jobs_storage_under_a_file", "processors.jobs: storage"),
    ("queue_storage_under_a_file", "exporters.otlp: sending_queue.storage"),
    ("k8s_with_node_name_and_kubeconfig", None),
    ("plain", None),
])
def test_validate_refuses_what_run_refuses_and_passes_what_run_starts(tmp_path, name, refused_key):
    """Each case is something `otel-ofu run` checks when its components start. Before, validate
    passed all of these and run refused the first eight (kubernetes_api without a node name,
    issue 23 item 9; the others with a traceback)."""
    text, env = _case(name, tmp_path)
    config = tmp_path / "config.yaml"
    config.write_text(text)
    validated = _cli(tmp_path, env, "validate", "--config", str(config))
    ran = _cli(tmp_path, env, "run", "--config", str(config), "--duration", "2")
    assert "Traceback" not in ran.stderr, ran.stderr[-3000:]
    if refused_key is None:
        assert (validated.returncode, ran.returncode) == (0, 0), validated.stderr + ran.stderr[-3000:]
    else:
        assert (validated.returncode, ran.returncode) == (1, 1), validated.stdout + ran.stderr[-3000:]
        assert f"{config}: {refused_key}:" in validated.stderr, validated.stderr
        assert f"{config}: {refused_key}:" in ran.stderr, ran.stderr[-3000:]


def test_outside_a_pod_validate_warns_that_the_in_cluster_config_is_missing(tmp_path):
    """The one start check that depends on where it runs, not on the config: the pod's service
    account. validate warns (a config for a pod is right), run refuses to start there."""
    config = tmp_path / "config.yaml"
    config.write_text(_attribution("{enabled: true}"))
    node = {"K8S_NODE_NAME": "gpu-node-1"}
    validated = _cli(tmp_path, node, "validate", "--config", str(config))
    ran = _cli(tmp_path, node, "run", "--config", str(config), "--duration", "2")
    assert validated.returncode == 0 and "warning:" in validated.stderr
    assert "kubernetes_api.kubeconfig: cannot load the in-cluster config" in validated.stderr, validated.stderr
    assert ran.returncode == 1 and "cannot load the in-cluster config" in ran.stderr, ran.stderr[-3000:]
