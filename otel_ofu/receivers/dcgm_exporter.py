"""The ``dcgm_exporter`` receiver: scrapes NVIDIA dcgm-exporter ``/metrics`` endpoints.

dcgm-exporter serves Prometheus text. It exports no max SM clock, so f_ref comes from the
``modelName`` label through the spec table (the ``ofu`` processor does that). Its collect
interval (``-c``, default 30 s) is also its DCGM watch interval: TPA is a 30 s average, while
the SM clock is one point sample taken at collection time. So one scrape gives, per GPU, one
window of TPA and exactly one clock sample (``sm_clock_samples`` = 1): scrape at the
exporter's collect interval, since scraping faster only repeats values.

The ledger's counters on a page are read into the samples too, raw: the energy counter
(``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` in mJ, ``DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL`` in J, as mJ),
PCIe and NVLink bytes per second (``DCGM_FI_PROF_PCIE_TX_BYTES`` ... ``DCGM_FI_PROF_NVLINK_RX_BYTES``)
and the clock's event time per reason (``DCGM_FI_DEV_CLOCKS_EVENT_REASON_*_NS``, counters); a
counter's sample name with the parser's ``_total`` is the same field.

Labels are mapped by :mod:`otel_ofu.core.dcgm_fields` (both ``Hostname``/``hostname`` and
``UUID``/``uuid``, MIG, Kubernetes old and new names, ``hpc_job``). Values are kept raw:
a blank sentinel that leaks out of the exporter stays a sentinel and the ``ofu`` processor
reports it as a dropped window with its reason, never as 0. Each endpoint is scraped on its
own worker; one that fails (refused, timeout, HTTP error, bad body) is logged, counted in
``otel_ofu.scrape.errors`` and marked down in ``otel_ofu.scrape.up``; the others carry on.

An endpoint whose page has GPUs but none of them with an input the OFU needs (tensor pipe
activity, the SM clock) is said once per endpoint and field at WARNING, with the counters
CSV line and dcgm-exporter Helm value that enable it: profiling metrics missing from the
counters CSV is the most common misconfiguration, and otherwise only the drop counter
(``missing``) would show it. ``otel-ofu doctor`` lists the same (:meth:`missing_fields`).
"""

from __future__ import annotations

import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from otel_ofu.core import dcgm_fields
from otel_ofu.core.model import GPU_MIG_INSTANCE, Batch, GpuSample
from otel_ofu.gpu.missing_inputs import MissingInputs, how_to_enable
from otel_ofu.pipeline.component import Context, Factory, PollingReceiver
from otel_ofu.pipeline.config import Duration, require
from otel_ofu.scrape.client import (
    BasicAuthSettings,
    ScrapePool,
    TlsSettings,
    normalize_endpoint,  # noqa: F401 - re-exported (callers normalize endpoints the way this receiver does)
    parse_text,
    scrape_timeout,
    target_urls,
    validate_settings,
)

SOURCE = "dcgm_exporter"
K8S_POD_LABEL, K8S_NAMESPACE_LABEL = "k8s.pod.name", "k8s.namespace.name"  # dcgm_fields.identity_from_labels'

@dataclass
class DcgmExporterReceiverConfig:
    # One scrape URL, e.g. http://node:9400/metrics ("host:port" means http://host:port/metrics; a
    # URL without a path gets /metrics). Set exactly one of endpoint and endpoints.
    endpoint: str = ""
    endpoints: list[str] = field(default_factory=list)  # several URLs, scraped in parallel (8 at a time)
    # How often to scrape. Match dcgm-exporter's collect interval: scraping faster only repeats values.
    collection_interval: Duration = field(default_factory=lambda: Duration(30))
    # Limit for one whole scrape (connect, headers and body), at most collection_interval;
    # unset: 10s, or collection_interval when shorter.
    scrape_timeout: Duration | None = None
    # dcgm-exporter's own -c/--collect-interval, also its DCGM watch interval: the window its TPA
    # is averaged over, recorded on each sample.
    exporter_collect_interval: Duration = field(default_factory=lambda: Duration(30))
    tls: TlsSettings = field(default_factory=TlsSettings)
    basic_auth: BasicAuthSettings = field(default_factory=BasicAuthSettings)
    bearer_token: str = field(default="", repr=False)  # sent as Authorization: Bearer <token>
    # A file holding the token, read at every scrape (a rotated Kubernetes token is picked up).
    bearer_token_file: str = ""
    # host.name of every GPU; "" = the page's Hostname/hostname label, else the endpoint's host
    # (dcgm-exporter --no-hostname).
    host_name: str = ""

    def validate(self) -> None:
        validate_settings(self)
        require(self.exporter_collect_interval > 0, "exporter_collect_interval", "must be positive")

    def timeout(self) -> float:
        return scrape_timeout(self)

    def urls(self) -> list[str]:
        return target_urls(self)


def _field_of(metric_name: str) -> int | None:
    fid = dcgm_fields.FIELD_IDS_BY_NAME.get(metric_name)
    if fid is None and metric_name.endswith("_total"):  # the parser renames counters' samples
        fid = dcgm_fields.FIELD_IDS_BY_NAME.get(metric_name[:-6])
    return fid


def parse_metrics(text: str, *, time_unix_nano: int, window_s: float, host_override: str = "",
                  default_host: str = "") -> list[GpuSample]:
    """GPU samples from one dcgm-exporter page; raises ValueError when the text is not Prometheus.

    One sample per GPU entity: a GPU, or a MIG instance (same UUID, its own GPU_I_ID), or one
    pod's view of a shared GPU (dcgm-exporter repeats the series per pod; attribution counts the
    copies of one GPU once). Metrics that are not DCGM fields we read, and series without a GPU
    identity, are ignored. ``DCGM_FI_DEV_GPU_UTIL`` makes no sample of its own: on a shared GPU's
    per-pod copy it is that pod's use (:func:`_pod_uses`).
    """
    entities: dict[tuple, tuple[dict[str, Any], dict[int, object]]] = {}
    for family in parse_text(text):
        for sample in family.samples:
            fid = _field_of(sample.name)
            labels = sample.labels
            if fid is None or not (labels.get("gpu") or labels.get("UUID") or labels.get("uuid")):
                continue
            ident = dcgm_fields.identity_from_labels(labels)
            key = (ident["host"], ident["gpu_index"], ident["uuid"], tuple(sorted(ident["resource"].items())))
            entities.setdefault(key, (ident, {}))[1][fid] = sample.value  # raw: int, float, NaN or a sentinel
    uses = _pod_uses(entities)
    out = []
    for ident, fields in entities.values():
        if fields.keys() <= {dcgm_fields.GPU_UTIL}:
            continue  # a utilization row alone: no GPU window (see _pod_uses)
        index = ident["gpu_index"]
        out.append(dcgm_fields.sample_from_fields(
            fields, time_unix_nano=time_unix_nano, window_s=window_s,
            host=host_override or ident["host"] or default_host,
            gpu_index=int(index) if str(index).isdecimal() else index, uuid=ident["uuid"], model=ident["model"],
            source=SOURCE, job_id=ident["job_id"], resource=dict(ident["resource"]),
            holder_use=uses.get(_pod_of(ident)),
        ))
    return out


def _device_of(ident: dict[str, Any]) -> tuple:
    resource = ident["resource"]
    return ident["host"], ident["gpu_index"], ident["uuid"], resource.get(GPU_MIG_INSTANCE, "")


def _pod_of(ident: dict[str, Any]) -> tuple:
    resource = ident["resource"]
    return (*_device_of(ident), resource.get(K8S_NAMESPACE_LABEL, ""), resource.get(K8S_POD_LABEL, ""))


def _pod_uses(entities: dict[tuple, tuple[dict[str, Any], dict[int, object]]]) -> dict[tuple, object]:
    """Each pod's use of a shared GPU, from dcgm-exporter's per-process rows: with --kubernetes-virtual-gpus
    and per-process metrics (NVIDIA/dcgm-exporter#594, 4.5.3-4.8.2: internal/pkg/transformation/
    kubernetes.go createPerProcessMetrics), ``DCGM_FI_DEV_GPU_UTIL`` comes once for the device (no pod
    labels) and once per pod holding it, the sum of its processes' SM utilization (0 for an idle pod;
    those rows always carry ``pod_uid``, the other series only with --kubernetes-enable-pod-uid, so they
    may be rows of their own). Without the device's own row (older pages copy the device's value to every
    pod) nothing says a pod's own use."""
    devices = {_device_of(ident) for ident, fields in entities.values()
               if fields.keys() == {dcgm_fields.GPU_UTIL} and not ident["resource"].get(K8S_POD_LABEL)}
    if not devices:
        return {}
    return {_pod_of(ident): fields[dcgm_fields.GPU_UTIL] for ident, fields in entities.values()
            if dcgm_fields.GPU_UTIL in fields and ident["resource"].get(K8S_POD_LABEL)
            and _device_of(ident) in devices}


class DcgmExporterReceiver(PollingReceiver):
    def __init__(self, config: DcgmExporterReceiverConfig, context: Context, consumer):
        super().__init__(config, context, consumer)
        self.urls = config.urls()
        self.pool = ScrapePool(config, context, self.log, "GPU entities")
        self._poll_started = 0.0
        self._missing = MissingInputs()  # by endpoint; endpoints are parsed on the pool's workers

    def interval(self) -> float:
        # Keep a fixed scrape period, as Prometheus does: a slow scrape shortens the wait.
        elapsed = time.monotonic() - self._poll_started if self._poll_started else 0.0
        return max(0.0, float(self.config.collection_interval) - elapsed)

    def on_start(self) -> None:
        self.log.info("scraping %d dcgm-exporter endpoint(s) every %gs: %s", len(self.urls),
                      float(self.config.collection_interval), ", ".join(self.urls))

    def poll(self) -> Batch | None:
        self._poll_started = time.monotonic()
        samples = self.pool.scrape(self._parse)
        return Batch(samples=samples) if samples else None

    def _parse(self, url: str, text: str, time_unix_nano: int) -> list[GpuSample]:
        samples = parse_metrics(text, time_unix_nano=time_unix_nano,
                                window_s=float(self.config.exporter_collect_interval),
                                host_override=self.config.host_name,
                                default_host=urllib.parse.urlsplit(url).hostname or "")
        self._note_missing(url, samples)
        return samples

    def _note_missing(self, url: str, samples: list[GpuSample]) -> None:
        """Say once per endpoint and field that an input is missing, and again only after it came back."""
        missing, back = self._missing.note(url, samples)
        for name in missing:
            self.log.warning("dcgm-exporter at %s serves no %s for any of its %d GPU entities: they get no OFU "
                             "(each window is counted in gpu_ofu_dropped_total{ofu_drop_reason=\"missing\"}). "
                             "To enable it, %s.", url, name, len(samples), how_to_enable(name))
        for name in back:
            self.log.info("dcgm-exporter at %s now serves %s", url, name)

    def missing_fields(self) -> dict[str, list[str]]:
        """Endpoint -> the required inputs its last page lacked (``otel-ofu doctor`` shows them)."""
        return self._missing.fields()

    def on_stop(self) -> None:
        self.pool.close()

    def shutdown(self) -> None:
        super().shutdown()
        self.pool.close()


FACTORY = Factory("dcgm_exporter", DcgmExporterReceiverConfig, DcgmExporterReceiver,
                  "scrapes NVIDIA dcgm-exporter /metrics endpoints", output="samples")
