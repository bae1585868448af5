"""Credentials in a URL never reach a log line or an error message (issue 31 item 8).

A scrape URL with credentials is refused, and the refusal names the URL with its password
masked (it printed it); the same for every other place a URL is printed: config errors that echo a
value (a wrong type, an environment variable's value), ``top``, ``doctor --dcgm-exporter``,
``doctor --backend`` (which sends them as basic auth, as Prometheus' clients do), the OTLP/HTTP
exporter's log lines (which sends them too, as requests does) and the OTLP/gRPC exporter (which
refuses them: gRPC has no place for them).
"""

from __future__ import annotations

import base64
import json
import logging
import subprocess
import sys

import pytest

from otel_ofu.cli import main as cli
from otel_ofu.core.model import Batch, MetricPoint, attrs
from otel_ofu.exporters import otlp as otlp_exporter
from otel_ofu.exporters import otlphttp as otlphttp_exporter
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import ConfigError, FieldError, build_config
from otel_ofu.pipeline.redact import redact_url, redact_urls
from otel_ofu.pipeline.telemetry import Telemetry
from tests.e2e_util import GetServer, wait_for
from tests.otlp_backends import HttpBackend
from tools.ports import free_ports

SECRET = "s3cret"
URL = f"http://user:{SECRET}@gpu-node-1:9400/metrics"
MASKED = "http://user:xxxxx@gpu-node-1:9400/metrics"
BASIC = "Basic " + base64.b64encode(f"user:{SECRET}".encode()).decode()  # what user:s3cret@ sends


def otel_ofu(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "otel_ofu", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def test_redaction_masks_the_password_and_a_lone_user_name_and_nothing_else():
    assert redact_url(URL) == MASKED
    assert redact_url("https://TOKEN@api.example.com/v1") == "https://xxxxx@api.example.com/v1"
    assert redact_url("http://u:p@ss@h:1/x") == "http://u:xxxxx@h:1/x"  # a password holding an @
    assert redact_urls(f"got ['{URL}', 'http://a:b@c']; mail me@example.com") == \
        f"got ['{MASKED}', 'http://a:xxxxx@c']; mail me@example.com"
    assert redact_url("http://h:1/x?next=a@b") == "http://h:1/x?next=a@b"


@pytest.mark.parametrize("receiver", ["dcgm_exporter: {endpoint: URL}", "prometheus: {endpoints: [URL]}"])
def test_a_scrape_url_with_credentials_is_refused_naming_it_without_its_password(tmp_path, receiver):
    """The refusal of issue 31 item 8: `validate` and `run` say where the credentials go, and print
    the URL with the password masked."""
    config = tmp_path / "c.yaml"
    config.write_text(f"""
receivers: {{{receiver.replace("URL", URL)}}}
processors: {{ofu: {{}}}}
exporters: {{file: {{path: {tmp_path / "out.jsonl"}}}}}
service: {{pipelines: {{metrics: {{receivers: [{receiver.split(":")[0]}], exporters: [file]}}}}}}
""")
    for command in ("validate", "run"):
        done = otel_ofu(command, "--config", str(config))
        assert done.returncode == 1, done.stderr
        assert f"'{MASKED}': put credentials under basic_auth (or bearer_token_file), not in the URL" in done.stderr
        assert SECRET not in done.stderr + done.stdout


def test_config_errors_that_echo_a_value_mask_its_credentials(tmp_path):
    """A URL in the wrong type of value, and one through an environment variable: the error echoes
    the value (and the variable's), masked."""
    config = tmp_path / "c.yaml"
    config.write_text(f"""
receivers:
  dcgm_exporter: {{endpoint: ["{URL}"]}}
  prometheus: {{endpoint: "${{env:JOB_METRICS_URL}}"}}
exporters: {{file: {{path: {tmp_path / "out.jsonl"}}}}}
service: {{pipelines: {{metrics: {{receivers: [dcgm_exporter, prometheus], exporters: [file]}}}}}}
""")
    done = otel_ofu("validate", "--config", str(config), env={"JOB_METRICS_URL": f"ftp://user:{SECRET}@trainer-0/x"})
    assert done.returncode == 1
    assert f"expected a string, got ['{MASKED}']" in done.stderr
    assert "ftp://user:xxxxx@trainer-0/x" in done.stderr and "the scheme must be http or https" in done.stderr
    assert SECRET not in done.stderr


def test_top_and_doctor_name_a_url_with_credentials_masked(capsys):
    done = otel_ofu("top", "--scrape", URL, "--duration", "1")
    assert done.returncode == 2 and MASKED in done.stderr and SECRET not in done.stderr + done.stdout
    assert cli.main(["doctor", "--dcgm-exporter", URL]) == 1
    out = capsys.readouterr().out
    assert f"[FAIL] dcgm-exporter {MASKED}: not a scrape URL: '{MASKED}': put credentials under basic_auth" in out
    assert SECRET not in out


class _QueryApi(GetServer):
    """A Prometheus query API behind basic auth (as a hosted Mimir or VictoriaMetrics): 401 without it."""

    def __init__(self) -> None:
        self.authorizations: list[str | None] = []

        def answer(path: str, headers) -> tuple[int, str, bytes]:
            self.authorizations.append(headers.get("Authorization"))
            ok = headers.get("Authorization") == BASIC
            body = json.dumps({"status": "success", "data": []} if ok else
                              {"status": "error", "errorType": "unauthorized", "error": "no"}).encode()
            return 200 if ok else 401, "application/json", body

        super().__init__(answer)


def test_doctor_backend_sends_url_credentials_as_basic_auth_and_prints_them_masked(capsys):
    api = _QueryApi()
    try:
        assert cli.main(["doctor", "--backend", f"http://user:{SECRET}@127.0.0.1:{api.port}"]) == 1
        out = capsys.readouterr().out
    finally:
        api.close()
    assert api.authorizations and set(api.authorizations) == {BASIC}
    assert f"what http://user:xxxxx@127.0.0.1:{api.port} holds" in out
    assert f"[OK  ] backend: http://127.0.0.1:{api.port} answers: 0 metric names" in out and SECRET not in out
    (closed,) = free_ports(1)
    assert cli.main(["doctor", "--json", "--backend", f"http://user:{SECRET}@127.0.0.1:{closed}"]) == 1
    out = capsys.readouterr().out
    assert json.loads(out)["backend"] == f"http://user:xxxxx@127.0.0.1:{closed}" and SECRET not in out


def _point() -> MetricPoint:
    return MetricPoint("gpu.ofu", 0.5, 1_700_000_000_000_000_000, attrs({"host.name": "h"}), attrs({}), "{ratio}")


def test_the_otlphttp_exporter_sends_url_credentials_and_logs_them_masked(caplog):
    """requests sends a URL's credentials as basic auth; every line the exporter logs masks them,
    its start line and the retries against a backend that is down."""
    caplog.set_level(logging.DEBUG, logger="otel_ofu")
    backend = HttpBackend().start()
    exporters = []
    try:
        for port in (backend.port, free_ports(1)[0]):
            cfg = build_config(otlphttp_exporter.FACTORY.config_type, {
                "endpoint": f"http://user:{SECRET}@127.0.0.1:{port}", "logs_endpoint": "none",
                "retry_on_failure": {"initial_interval": "20ms", "max_interval": "100ms"},
                "sending_queue": {"drain_timeout": "1s"}})
            exporter = otlphttp_exporter.FACTORY.create(cfg, Context("otlphttp/test", Telemetry()))
            exporter.start()
            exporters.append(exporter)
            exporter.export(Batch(points=[_point()]))
        wait_for("the backend to receive the point", lambda: backend.metrics, timeout=30)
        wait_for("a failed send to be logged", lambda: any("sending failed" in r.getMessage() for r in caplog.records),
                 timeout=30)
    finally:
        for exporter in exporters:
            exporter.shutdown()
        backend.stop()
    assert backend.headers[0]["authorization"] == BASIC
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert f"exporting to http://user:xxxxx@127.0.0.1:{backend.port}/v1/metrics" in text
    assert SECRET not in text


def test_the_otlp_grpc_exporter_refuses_url_credentials_without_printing_them():
    for endpoint in (f"http://user:{SECRET}@collector:4317", f"user:{SECRET}@collector:4317/x"):
        with pytest.raises((ConfigError, FieldError)) as caught:
            build_config(otlp_exporter.FACTORY.config_type, {"endpoint": endpoint})
        assert "credentials in the endpoint are not sent over gRPC" in str(caught.value)
        assert SECRET not in str(caught.value)

