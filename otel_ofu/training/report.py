"""The reporter: a MeterProvider of its own, two observable gauges, a periodic OTLP export.

Why observable gauges fed from a buffer: each export carries the mean of the values reported
since the previous export, or nothing when none were. A synchronous gauge would repeat its
last value on every export (cumulative temporality), so a job that hung would go on
"reporting" its last MFU while its GPUs sat idle, and the audit would see a gap that is not
a formula's fault.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import socket
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from otel_ofu.core.metrics import MFU_REPORT_METRIC, TFLOPS_REPORT_METRICS

log = logging.getLogger("otel_ofu.training")

TFLOPS_METRIC = TFLOPS_REPORT_METRICS[0]
DEFAULT_SERVICE_NAME = "training"
# The otel-ofu node agent's OTLP ports: the Helm chart's agent.otlpReceiver (its node-local Service, and the
# node's IP with agent.otlpReceiver.hostPort).
AGENT_GRPC_PORT, AGENT_HTTP_PORT = 4317, 4318
NODE_IP_ENV = "K8S_NODE_IP"  # downward API status.hostIP, as the chart's own pods get it
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

# Environment variable -> resource attribute. The Kubernetes names are the ones the downward
# API is usually mapped to (and NVIDIA's nemo-lens reads); Slurm sets SLURM_* itself.
_ENV_ATTRIBUTES = (
    ("K8S_POD_NAME", "k8s.pod.name"),
    ("K8S_NAMESPACE", "k8s.namespace.name"),
    ("K8S_POD_UID", "k8s.pod.uid"),
    ("K8S_NODE_NAME", "k8s.node.name"),
    ("SLURM_JOB_ID", "slurm.job.id"),
    ("SLURM_JOBID", "slurm.job.id"),  # the old spelling
    ("SLURM_JOB_NAME", "slurm.job.name"),
)


def training_resource(environ: Mapping[str, str] | None = None,
                      namespace_file: Path = SERVICE_ACCOUNT_NAMESPACE) -> dict[str, Any]:
    """This process's identity as resource attributes: pod, Slurm job, host and pid.

    ``host.name`` and ``process.pid`` are always there (a bare-metal job is found through its
    pid on its node); the pod comes from ``K8S_POD_NAME`` / ``K8S_NAMESPACE`` (downward API;
    the namespace falls back to the service account's namespace file), the Slurm job from
    ``SLURM_JOB_ID``. ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME`` win over all of
    these (:func:`start_mfu_reporter` applies them).
    """
    env = os.environ if environ is None else environ
    out: dict[str, Any] = {"service.name": DEFAULT_SERVICE_NAME, "host.name": socket.gethostname(),
                           "process.pid": os.getpid()}
    for variable, attribute in _ENV_ATTRIBUTES:
        value = env.get(variable, "").strip()
        if value:
            out.setdefault(attribute, value)
    if "k8s.pod.name" in out and "k8s.namespace.name" not in out:
        try:
            out["k8s.namespace.name"] = namespace_file.read_text().strip()
        except OSError:
            pass
    if env.get("KUBERNETES_SERVICE_HOST") and "k8s.pod.name" not in out and "K8S_POD_NAME" not in env:
        log.warning("running in Kubernetes without K8S_POD_NAME: otel-ofu cannot tell which job's GPUs this "
                    "process uses. Set K8S_POD_NAME and K8S_NAMESPACE from the downward API "
                    "(fieldRef metadata.name, metadata.namespace).")
    return out


def _resource(extra: Mapping[str, Any] | None, environ: Mapping[str, str] | None) -> Resource:
    """Detected identity, under OTEL_RESOURCE_ATTRIBUTES / OTEL_SERVICE_NAME, under ``extra``."""
    detected = Resource(training_resource(environ))
    configured = Resource.create(dict(extra or {}))  # the SDK's environment detector and defaults
    attributes = dict(configured.attributes)
    if str(attributes.get("service.name", "")).startswith("unknown_service"):
        del attributes["service.name"]  # the SDK's placeholder: keep ours
    return detected.merge(Resource(attributes, configured.schema_url))


def default_endpoint(protocol: str, environ: Mapping[str, str] | None = None) -> str | None:
    """Where reports go when no endpoint is given.

    The standard ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT`` when
    set (None: the SDK reads them); else, with ``K8S_NODE_IP`` set, the otel-ofu agent on this
    node (``http://<node IP>:4317``, ``:4318`` for OTLP/HTTP: the Helm chart's host ports, with
    ``agent.otlpReceiver.hostPort``); else None, the SDK's ``localhost``.
    """
    env = os.environ if environ is None else environ
    if any(env.get(name, "").strip() for name in ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                                                   "OTEL_EXPORTER_OTLP_ENDPOINT")):
        return None
    node = env.get(NODE_IP_ENV, "").strip()
    if not node:
        return None
    host = f"[{node}]" if ":" in node else node  # an IPv6 node address
    return f"http://{host}:{AGENT_GRPC_PORT if protocol == 'grpc' else AGENT_HTTP_PORT}"


def _exporter(endpoint: str | None, protocol: str | None, headers: Mapping[str, str] | None,
              insecure: bool | None, environ: Mapping[str, str] | None = None) -> MetricExporter:
    protocol = (protocol or os.environ.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL")
                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc").strip().lower()
    if protocol not in ("grpc", "http/protobuf"):
        raise ValueError(f"protocol must be 'grpc' or 'http/protobuf', got {protocol!r}")
    endpoint = endpoint or default_endpoint(protocol, environ)
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter

        return GrpcExporter(endpoint=endpoint, insecure=insecure, headers=dict(headers) if headers else None)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter

    if endpoint and endpoint.rstrip("/").count("/") <= 2:  # scheme://host:port: the signal path is added
        endpoint = endpoint.rstrip("/") + "/v1/metrics"
    return HttpExporter(endpoint=endpoint, headers=dict(headers) if headers else None)


class _Mean:
    """Values reported since the last export; each export takes their mean once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sum = 0.0
        self._count = 0

    def add(self, value: float) -> None:
        with self._lock:
            self._sum += value
            self._count += 1

    def take(self) -> float | None:
        with self._lock:
            if not self._count:
                return None
            mean, self._sum, self._count = self._sum / self._count, 0.0, 0
            return mean


class MfuReporter:
    """Reports MFU (a fraction) and/or achieved TFLOP/s per GPU every ``every_n_steps`` steps."""

    def __init__(self, reader: MetricReader, resource: Resource, every_n_steps: int = 1):
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be at least 1, got {every_n_steps}")
        self.every_n_steps = every_n_steps
        self.resource = resource
        self._mfu, self._tflops = _Mean(), _Mean()
        self._warned: set[str] = set()
        self._provider = MeterProvider(resource=resource, metric_readers=[reader])
        meter = self._provider.get_meter("otel_ofu.training")
        meter.create_observable_gauge(MFU_REPORT_METRIC, [self._observe(self._mfu)], unit="{ratio}",
                                      description="MFU the training job computes for itself, a fraction")
        meter.create_observable_gauge(TFLOPS_METRIC, [self._observe(self._tflops)], unit="T{flop}/s",
                                      description="Achieved model TFLOP/s per GPU the training job computes")
        self._closed = False
        atexit.register(self.shutdown)

    @staticmethod
    def _observe(buffer: _Mean):
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            value = buffer.take()
            return [] if value is None else [Observation(value)]

        return callback

    def report(self, step: int | None = None, *, mfu: float | None = None,
               tflops_per_gpu: float | None = None) -> bool:
        """Record this step's MFU and/or TFLOP/s per GPU if ``step`` is a multiple of ``every_n_steps``.

        ``step=None`` always records. Returns whether anything was recorded. A value that is
        not a finite non-negative number is skipped with one warning (training carries on).
        MFU above 1 is kept: a FLOP formula that counts too much is what the audit is for.
        """
        if self._closed or (step is not None and step % self.every_n_steps):
            return False
        recorded = False
        for name, value, buffer in (("mfu", mfu, self._mfu), ("tflops_per_gpu", tflops_per_gpu, self._tflops)):
            if value is None:
                continue
            try:
                number = float(value)
            except (TypeError, ValueError):
                number = math.nan
            if not math.isfinite(number) or number < 0:
                if name not in self._warned:
                    self._warned.add(name)
                    log.warning("otel_ofu.training: %s=%r is not a finite non-negative number; not reported "
                                "(warned once)", name, value)
                continue
            buffer.add(number)
            recorded = True
        return recorded

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Export what was reported so far now (normally the periodic export does)."""
        return self._provider.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        """Export the last values and stop (also runs at interpreter exit)."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.shutdown)
        self._provider.shutdown()

    def __enter__(self) -> MfuReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def start_mfu_reporter(*, every_n_steps: int = 1, export_interval_s: float | None = None, endpoint: str | None = None,
                       protocol: str | None = None, headers: Mapping[str, str] | None = None,
                       insecure: bool | None = None, resource: Mapping[str, Any] | None = None,
                       environ: Mapping[str, str] | None = None) -> MfuReporter:
    """One call: a reporter exporting to otel-ofu's ``otlp`` receiver.

    ``endpoint``: by default the standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` (the Helm chart's
    node-local Service: docs/audit.md), else the otel-ofu agent on this node when ``K8S_NODE_IP``
    is set (``http://$K8S_NODE_IP:4317``, the chart's host port when it has one), else
    ``localhost:4317`` (:func:`default_endpoint`). ``headers``: by default the standard
    ``OTEL_EXPORTER_OTLP_HEADERS`` (the chart's token). ``protocol``: ``grpc``
    (default, or ``OTEL_EXPORTER_OTLP_PROTOCOL``) or ``http/protobuf``. ``export_interval_s``:
    how often values are sent (default ``OTEL_METRIC_EXPORT_INTERVAL``, else 30 s); each export
    carries the mean of the values reported since the last. ``resource``: extra attributes
    (e.g. ``{"ofu.job.id": "my-run"}`` to name the job by hand), over the detected ones.
    """
    if export_interval_s is None:
        millis = os.environ.get("OTEL_METRIC_EXPORT_INTERVAL", "").strip()
        export_interval_s = float(millis) / 1000 if millis else 30.0
    if export_interval_s <= 0:
        raise ValueError(f"export_interval_s must be positive, got {export_interval_s}")
    reader = PeriodicExportingMetricReader(_exporter(endpoint, protocol, headers, insecure, environ),
                                           export_interval_millis=export_interval_s * 1000)
    return MfuReporter(reader, _resource(resource, environ), every_n_steps)
