"""The config loader and `otel-ofu validate`: errors name the file, the component and the key."""

import subprocess
import sys
from pathlib import Path

import pytest

from otel_ofu.pipeline.config import ConfigError, Duration, FieldError, build_config, substitute_env
from otel_ofu.pipeline.service import load_config
from otel_ofu.receivers.sim import SimReceiverConfig

DATA = Path(__file__).parent / "data" / "configs"
ROOT = Path(__file__).parent.parent


@pytest.mark.parametrize(
    ("name", "component", "key", "words"),
    [
        ("unknown-component.yaml", "receivers.simm", None, "unknown receiver type 'simm'"),
        ("bad-key.yaml", "receivers.sim", "nodez", "did you mean 'nodes'"),
        ("bad-type.yaml", "receivers.sim", "nodes", "expected an integer"),
        ("missing-env.yaml", None, "exporters.file.path", "OFU_TEST_SURELY_UNSET is not set"),
        ("undefined-reference.yaml", "service.pipelines.metrics", "processors", "'ofu', which is not configured"),
        ("bad-duration.yaml", "receivers.sim", "collection_interval", "expected a duration"),
        ("bad-nested.yaml", "receivers.sim", "jobs[0].mfu", "within [0, 1]"),
        ("bad-yaml.yaml", None, None, "not valid YAML"),
    ],
)
def test_bad_configs_name_file_component_and_key(name, component, key, words):
    with pytest.raises(ConfigError) as info:
        load_config(str(DATA / name))
    err = info.value
    assert err.file == str(DATA / name)
    assert err.component == component
    assert err.key == key
    assert words in str(err)
    assert str(err).startswith(str(DATA / name))


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(str(tmp_path / "nope.yaml"))


def test_validate_cli_exit_codes_and_message():
    ok = subprocess.run([sys.executable, "-m", "otel_ofu", "validate", "--config", "collector-config/demo.yaml"],
                        cwd=ROOT, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "valid" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "otel_ofu", "validate", "--config", str(DATA / "bad-key.yaml")],
                         cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode != 0
    assert "bad-key.yaml: receivers.sim: nodez: unknown key (did you mean 'nodes'?)" in bad.stderr


def test_env_substitution_types_defaults_and_escapes():
    env = {"PORT": "4317", "HOST": "collector", "FLAG": "true"}
    doc = {"a": "${env:PORT}", "b": "${env:HOST}:${env:PORT}", "c": "${env:MISSING:-fallback}",
           "d": "$${env:HOST}", "e": ["${env:FLAG}"], "f": "${env:MISSING:-}"}
    out = substitute_env(doc, env)
    assert out == {"a": 4317, "b": "collector:4317", "c": "fallback", "d": "${env:HOST}", "e": [True], "f": ""}


def test_missing_env_var_names_the_variable_and_key():
    with pytest.raises(ConfigError) as info:
        substitute_env({"exporters": {"file": {"path": "${env:NOPE_X}"}}}, {})
    assert info.value.key == "exporters.file.path" and "NOPE_X" in str(info.value)


@pytest.mark.parametrize(("text", "seconds"), [("10s", 10), ("500ms", 0.5), ("1m30s", 90), ("2h", 7200), (3, 3),
                                               (0.25, 0.25)])
def test_durations(text, seconds):
    assert Duration.parse(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["10", "ten seconds", "10 s", "", True, None])
def test_bad_durations(text):
    with pytest.raises(ValueError):
        Duration.parse(text)


def test_defaults_fill_missing_keys():
    cfg = build_config(SimReceiverConfig, {"nodes": 3})
    assert cfg.nodes == 3 and cfg.gpus_per_node == 8 and cfg.collection_interval == 10.0
    assert len(cfg.job_specs()) >= 1 and sum(j.gpus for j in cfg.job_specs()) == 24


def test_too_many_gpus_for_the_fleet_is_rejected():
    with pytest.raises(FieldError) as info:
        build_config(SimReceiverConfig, {"nodes": 1, "gpus_per_node": 2, "jobs": [{"scenario": "steady", "gpus": 3}]})
    assert info.value.key == "jobs"


@pytest.mark.parametrize("path", sorted((ROOT / "collector-config").glob("*.yaml")))
def test_every_shipped_otel_ofu_config_is_valid(path, monkeypatch):
    if path.name.startswith("otelcol-"):
        pytest.skip("a Collector config: checked by `otelcol validate` in test_collector_e2e")
    load_config(str(path))


@pytest.mark.parametrize("path", sorted((ROOT / "collector-config").glob("otelcol-*.yaml")), ids=lambda p: p.name)
def test_validate_says_a_collector_config_is_one_and_how_to_check_it(path):
    """Before, the shipped Collector configs failed `otel-ofu validate` with unknown types and unset
    variables, and nothing said they are the Collector's."""
    done = subprocess.run([sys.executable, "-m", "otel_ofu", "validate", "--config", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "this is an OpenTelemetry Collector config" in done.stderr, done.stderr
    assert f"otelcol validate --config {path}" in done.stderr and "collector/validate-configs.sh" in done.stderr
    assert "environment variable" not in done.stderr and "unknown" not in done.stderr  # nothing else to fix


def test_collector_only_types_are_not_otel_ofu_types():
    from otel_ofu.pipeline import registry
    from otel_ofu.pipeline.config import COLLECTOR_ONLY_TYPES

    for section, types in COLLECTOR_ONLY_TYPES.items():
        assert not types & set(registry.factories()[section]), section


def test_optional_nested_config_reports_the_inner_key():
    from dataclasses import dataclass

    @dataclass
    class Inner:
        size: int = 1

    @dataclass
    class Outer:
        inner: Inner | None = None

    assert build_config(Outer, {"inner": None}).inner is None
    assert build_config(Outer, {"inner": {"size": 3}}).inner == Inner(3)
    with pytest.raises(FieldError) as info:
        build_config(Outer, {"inner": {"size": "big"}})
    assert info.value.key == "inner.size" and "expected an integer" in info.value.message


# --- a value from the environment: read in its owner's unit, and named when it is wrong ------------

QUICK_PATH = Path(__file__).resolve().parent.parent / "collector-config" / "dcgm-exporter.yaml"


def quick_path_config(monkeypatch, **env: str):
    for name in ("DCGM_EXPORTER_INTERVAL", "OFU_DCGM_EXPORTER_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return load_config(QUICK_PATH)


def test_dcgm_exporter_interval_is_read_in_milliseconds_as_dcgm_exporter_reads_it(monkeypatch):
    """DCGM_EXPORTER_INTERVAL=10000 is what a user copies from dcgm-exporter's -c: 10 s."""
    config = quick_path_config(monkeypatch, DCGM_EXPORTER_INTERVAL="10000")
    receiver = config.components["receivers"]["dcgm_exporter"]
    assert (receiver.collection_interval, receiver.exporter_collect_interval) == (10.0, 10.0)
    assert config.components["processors"]["jobs"].default_interval == 10.0
    assert not config.warnings
    unset = quick_path_config(monkeypatch)
    assert unset.components["receivers"]["dcgm_exporter"].collection_interval == 30.0  # dcgm-exporter's default


def test_a_bad_value_from_the_environment_names_the_variable(monkeypatch):
    with pytest.raises(ConfigError) as caught:
        quick_path_config(monkeypatch, DCGM_EXPORTER_INTERVAL="10s")
    message = str(caught.value)
    assert "receivers.dcgm_exporter: collection_interval:" in message
    assert "DCGM_EXPORTER_INTERVAL='10s'" in message and "${env:DCGM_EXPORTER_INTERVAL:-30000}ms" in message


def test_an_interval_longer_than_max_gap_is_named_where_it_is_written(tmp_path, monkeypatch):
    path = tmp_path / "c.yaml"
    path.write_text("receivers: {sim: {}}\nprocessors: {ofu: {}, jobs: {default_interval: '${env:OFU_T_IVL}'}}\n"
                    "exporters: {file: {path: x.jsonl}}\n"
                    "service: {pipelines: {metrics: {receivers: [sim], processors: [ofu, jobs], exporters: [file]}}}\n")
    monkeypatch.setenv("OFU_T_IVL", "10000")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert "processors.jobs: default_interval: default_interval (10000s) is longer than max_gap (120s)" in message
    assert "OFU_T_IVL='10000'" in message
    assert "max_gap:" not in message  # not in the file: never the key named at fault
