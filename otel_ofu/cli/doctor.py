"""``otel-ofu doctor``: can this machine give OFU, from which source, and if not, why not.

It tries what the receivers would do (import DCGM's bindings, reach or start a host engine,
watch the profiling fields; initialise NVML, ask each GPU for GPM and take a GPM sample) and
reports each step with a fix an admin can act on. ``otel-ofu run`` without ``--config``
uses the same diagnosis to pick the best source (DCGM when its profiling fields can be
watched, else NVML GPM) and runs a built-in pipeline on it; with none, it points at the demo
instead of simulating anything.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from otel_ofu.cli import backend_check
from otel_ofu.cli.checks import FAIL, OK, SKIP, WARN, Check
from otel_ofu.cli.logs import configure_logging
from otel_ofu.core import dcgm_fields, specs
from otel_ofu.core.ofu import FREF_MAX_CLOCK, reference_clock
from otel_ofu.core.values import NoValue, clean_clock
from otel_ofu.gpu import dcgm_api, nvml_api
from otel_ofu.gpu.dcgm_api import DcgmError, DcgmSession
from otel_ofu.gpu.nvml_api import NvmlError
from otel_ofu.pipeline.redact import redact_url

DEMO_HINT = ("To see the pipeline work without a GPU, run the demo:\n"
             "  otel-ofu run --config collector-config/demo.yaml --duration 60")
LOCAL_HOSTENGINE = "localhost"  # nv-hostengine's default port 5555 is implied



@dataclass
class GpuInfo:
    index: int
    name: str
    uuid: str
    arch: str = ""
    gpm: bool = False
    gpm_detail: str = ""
    mig_instances: int = 0
    usable: bool = False


@dataclass
class Report:
    host: str
    checks: list[Check] = field(default_factory=list)
    gpus: list[GpuInfo] = field(default_factory=list)
    dcgm_usable: bool = False
    dcgm_address: str = ""  # "" = embedded host engine
    nvml_usable: bool = False
    # GPU model -> its reported max SM clock (MHz; None when not reported), from DCGM or NVML
    models: dict[str, float | None] = field(default_factory=dict)
    # The dcgm-exporter pages asked about (--dcgm-exporter): then they alone are checked and decide.
    exporter_pages: list[str] = field(default_factory=list)

    @property
    def best(self) -> str | None:
        """The source ``otel-ofu run`` would use: DCGM profiling first, then NVML GPM."""
        return "dcgm" if self.dcgm_usable else "nvml" if self.nvml_usable else None

    def add(self, name: str, status: str, detail: str, fix: str = "") -> None:
        self.checks.append(Check(name, status, detail, fix))

    def add_error(self, name: str, error: DcgmError | NvmlError, prefix: str = "") -> None:
        """A failed check from a classified error: what happened [state], then the fix."""
        what, _, fix = error.message.partition(": ")
        if not fix:
            what, fix = "", error.message
        self.add(name, FAIL, f"{prefix}{what} [{error.state}]".strip(), fix)

    @property
    def pages_ok(self) -> bool:
        """Every dcgm-exporter page asked about gives OFU (a warning: it does, approximately)."""
        return all(c.status != FAIL for c in self.checks if c.name.startswith("dcgm-exporter "))

    def to_dict(self) -> dict[str, Any]:
        checks = [asdict(c) for c in self.checks]
        if self.exporter_pages:
            return {"host": self.host, "usable": self.pages_ok, "dcgm_exporters": self.exporter_pages,
                    "checks": checks}
        return {"host": self.host, "usable": self.best is not None, "best_source": self.best,
                "dcgm_address": self.dcgm_address if self.dcgm_usable else None,
                "checks": checks, "gpus": [asdict(g) for g in self.gpus]}

    def render(self) -> str:
        if self.exporter_pages:
            return self._render_pages()
        lines = [f"otel-ofu doctor: GPU sources on {self.host}", "", *self._checks_text(), ""]
        if self.best == "dcgm":
            lines.append("Usable: DCGM profiling fields. `otel-ofu run` (no --config) uses the dcgm receiver; "
                         "see collector-config/dcgm.yaml.")
        elif self.best == "nvml":
            lines.append("Usable: NVML GPM. `otel-ofu run` (no --config) uses the nvml receiver; see "
                         "collector-config/nvml.yaml.")
        else:
            lines.append("No real GPU source is usable here. " + DEMO_HINT)
        return "\n".join(lines)

    def _checks_text(self) -> list[str]:
        lines = []
        for check in self.checks:
            lines.append(f"  [{check.status.upper():4}] {check.name}: {check.detail}")
            if check.fix:
                lines.append(f"         fix: {check.fix}")
        return lines

    def _render_pages(self) -> str:
        """--dcgm-exporter: the pages' checks and their verdict (this machine's GPUs are not the question)."""
        lines = ["otel-ofu doctor: dcgm-exporter pages", "", *self._checks_text(), ""]
        if self.pages_ok:
            lines.append("Usable: every page carries what OFU needs. Scrape them with the dcgm_exporter receiver "
                         "(collector-config/dcgm-exporter.yaml), or watch them: otel-ofu top --scrape URL.")
        else:
            lines.append("Not every page gives OFU: see each fix above.")
        return "\n".join(lines)


# --- DCGM ------------------------------------------------------------------------------------


def _check_dcgm(report: Report, loader: dcgm_api.BindingsLoader, bindings_path: str | None, address: str) -> None:
    try:
        bindings = loader(bindings_path)
    except DcgmError as exc:
        report.add_error("DCGM bindings", exc)
        report.add("DCGM host engine", SKIP, "needs the DCGM bindings")
        return
    report.add("DCGM bindings", OK, f"pydcgm found in {bindings.path or 'the Python path'}")
    addresses = [address] if address else [LOCAL_HOSTENGINE, ""]
    session, errors = None, []
    for candidate in addresses:
        attempt = DcgmSession(bindings, candidate, 1.0, 1.0)
        try:
            attempt.open()
        except DcgmError as exc:
            errors.append(exc)
            continue
        session = attempt
        break
    if session is None:
        report.add_error("DCGM host engine", errors[-1])
        return
    where = f"nv-hostengine at {session.address}" if session.address else "embedded host engine (started here)"
    names = sorted({e.model for e in session.entities})
    for name in names:
        report.models.setdefault(name, None)
    report.add("DCGM host engine", OK, f"{where}; {len(session.entities)} GPU(s)/MIG instance(s): {', '.join(names)}")
    try:
        fields = session.watch_profiling()
    except DcgmError as exc:
        report.add_error("DCGM profiling", exc)
    else:
        exact = "with" if set(dcgm_api.COUNTER_FIELDS) <= set(fields) else "without"
        report.add("DCGM profiling", OK, f"fields {', '.join(map(str, fields))} watchable ({exact} the exact cycle "
                   "counters 1084/1086)")
        report.dcgm_usable = True
        report.dcgm_address = session.address
    finally:
        session.close()


# --- NVML ------------------------------------------------------------------------------------


def _check_nvml(report: Report, loader: nvml_api.NvmlLoader) -> None:
    try:
        api = loader()
        try:
            api.nvmlInit()
        except api.NVMLError as exc:
            raise nvml_api.classify_init_error(api, exc) from None
    except NvmlError as exc:
        report.add_error("NVML", exc)
        return
    try:
        count = int(api.nvmlDeviceGetCount())
        try:
            driver = api.nvmlSystemGetDriverVersion()
        except Exception:  # a driver that will not say is still usable
            driver = "unknown"
        report.add("NVML", OK if count else FAIL, f"driver {driver}, {count} GPU(s)",
                   "" if count else "NVML sees no GPU: check nvidia-smi -L (and --gpus in a container)")
        for index in range(count):
            _check_gpu(report, api, index)
    finally:
        try:
            api.nvmlShutdown()
        except Exception:  # nothing left to release
            pass
    report.nvml_usable = any(g.usable for g in report.gpus)


def _check_gpu(report: Report, api: Any, index: int) -> None:
    name = f"GPU {index}"
    try:
        gpu = nvml_api.describe_gpu(api, index)
    except api.NVMLError as exc:
        report.add_error(name, nvml_api.classify_gpu_error(api, exc))
        return
    info = GpuInfo(index, gpu.name, gpu.uuid, gpu.arch, gpu.gpm, gpu.gpm_reason, len(gpu.mig))
    report.gpus.append(info)
    report.models[gpu.name] = report.models.get(gpu.name) or gpu.max_clock_mhz
    label = f"{gpu.name} ({gpu.arch}, {gpu.uuid}" + (f", MIG: {len(gpu.mig)} GPU instance(s)" if gpu.mig else "") + ")"
    if not gpu.gpm:
        report.add(name, WARN, f"{label}: no NVML GPM", gpu.gpm_reason)
        return
    sample = api.nvmlGpmSampleAlloc()
    try:  # permission and a live GPU show on the first GPM sample
        if gpu.mig:
            api.nvmlGpmMigSampleGet(gpu.handle, gpu.mig[0].gpu_instance_id, sample)
        else:
            api.nvmlGpmSampleGet(gpu.handle, sample)
    except api.NVMLError as exc:
        report.add_error(name, nvml_api.classify_gpu_error(api, exc), f"{label}: GPM sample failed: ")
        return
    finally:
        api.nvmlGpmSampleFree(sample)
    info.usable = True
    report.add(name, OK, f"{label}: NVML GPM works (tensor activity without the DCGM profiling lock)")


# --- dcgm-exporter ---------------------------------------------------------------------------


# What to do about a page that cannot be scraped, by the scrape's failure reason.
_SCRAPE_FIXES = {
    "connection_refused": "nothing listens there: check the host and port (dcgm-exporter's default is 9400) and that "
                          "dcgm-exporter runs on that node",
    "timeout": "the host does not answer in time: check the address, and firewalls or a NetworkPolicy between here "
               "and the node",
    "dns": "check the host name (from here, as the scraper would resolve it)",
    "tls": "an https:// page: check its certificate; dcgm-exporter serves plain http:// unless its web config sets TLS",
    "http_404": "the server answers but has no page there: dcgm-exporter serves /metrics",
    "http_401": "the page needs credentials: give them under basic_auth or bearer_token_file in the receiver's config",
    "http_403": "the page refuses these credentials: check basic_auth or bearer_token_file in the receiver's config",
}


def check_dcgm_exporter(report: Report, endpoint: str, timeout: float | None = None) -> None:
    """Scrape one dcgm-exporter page and say whether it carries every input OFU needs and names GPU models
    otel-ofu knows, and how to fix it. A page that cannot be read is a failed check, never a crash."""
    from otel_ofu.gpu.missing_inputs import how_to_enable, missing_inputs
    from otel_ofu.pipeline.config import Duration
    from otel_ofu.receivers.dcgm_exporter import DcgmExporterReceiverConfig, parse_metrics
    from otel_ofu.scrape.client import ScrapeError, Scraper

    config = DcgmExporterReceiverConfig(endpoint=endpoint,
                                        scrape_timeout=None if timeout is None else Duration(timeout))
    try:
        (url,) = config.urls()
    except ValueError as exc:
        report.add(f"dcgm-exporter {redact_url(endpoint)}", FAIL, f"not a scrape URL: {exc}",
                   "give dcgm-exporter's page, e.g. http://NODE:9400/metrics (credentials go under basic_auth in "
                   "the receiver's config, never in the URL)")
        return
    name = f"dcgm-exporter {url}"
    try:
        text = Scraper(config).fetch(url, None)
    except ScrapeError as exc:
        report.add(name, FAIL, f"cannot scrape it: {exc} [{exc.reason}]",
                   _SCRAPE_FIXES.get(exc.reason, "check the address and that dcgm-exporter runs (its default port is "
                                                 "9400)"))
        return
    try:
        samples = parse_metrics(text, time_unix_nano=0, window_s=30.0)
    except ValueError as exc:
        report.add(name, FAIL, f"not Prometheus text: {str(exc)[:200]}", "point it at dcgm-exporter's /metrics")
        return
    if not samples:
        report.add(name, FAIL, "the page has no GPU series (no gpu or UUID label on any DCGM field)",
                   "point it at dcgm-exporter's /metrics on a node with GPUs")
        return
    missing = missing_inputs(samples)
    if missing:
        report.add(name, FAIL, f"{len(samples)} GPU entities, but no {' and no '.join(missing)}: no OFU",
                   "; ".join(how_to_enable(field) for field in missing))
    else:
        report.add(name, OK, f"{len(samples)} GPU entities with tensor activity and SM clock")
    models: dict[str, float | None] = {}
    for sample in samples:
        max_clock, _ = clean_clock(sample.max_sm_clock_mhz)
        models[sample.model or ""] = models.get(sample.model or "") or max_clock
    counts = Counter(sample.model or "" for sample in samples)
    max_clock_name = dcgm_fields.FIELD_NAMES[dcgm_fields.MAX_SM_CLOCK][0]
    _check_models(report, name, models, counts, f"the page has no {max_clock_name}")


def _check_models(report: Report, name: str, models: dict[str, float | None], counts: Counter[str] | None = None,
                  no_max_clock: str = "") -> None:
    """A check per GPU model ``run`` would compute no OFU for, or an approximate one (f_ref is then the
    reported max SM clock), with the ``reference_clocks`` setting that fixes it, as ``run`` logs it.

    ``models``: model -> its max SM clock as the source reports it; ``no_max_clock`` says why a model
    has none (a page without the field). Empty: the source reads it itself (the dcgm and nvml receivers).
    """
    from otel_ofu.processors.ofu import reference_clock_fix

    for model, max_clock in sorted(models.items()):
        ref = reference_clock(model or None, specs.UNKNOWN_PRECISION, max_clock)
        if ref is not None and ref.source != FREF_MAX_CLOCK:
            continue
        gpus = f"{counts[model]} GPU entities" if counts else "its GPUs"
        what = (f"{gpus} without a model name (no modelName label)" if not model else
                f"{gpus} of model {model!r}, which otel-ofu does not know (not in its spec table, docs/gpus.md)")
        if ref is None and no_max_clock:
            report.add(name, FAIL, f"{what}, and {no_max_clock}: no OFU for them (`run` counts their windows in "
                       f"gpu.ofu.dropped{{ofu.drop.reason={NoValue.NO_REFERENCE_CLOCK.value}}})",
                       reference_clock_fix(model))
        else:
            clock = f" ({ref.mhz:.0f} MHz)" if ref is not None else ""
            report.add(name, WARN, f"{what}: OFU divides by its reported max SM clock{clock}, not the clock its "
                       "tensor peak is quoted at: approximate", reference_clock_fix(model))


def diagnose(*, dcgm_loader: dcgm_api.BindingsLoader | None = None, nvml_loader: nvml_api.NvmlLoader | None = None,
             bindings_path: str | None = None, address: str = "", dcgm_exporters: list[str] | None = None) -> Report:
    """Every check, in order; the loaders default to the installed providers (fakes in tests)."""
    report = Report(socket.gethostname(), exporter_pages=list(dcgm_exporters or []))
    if dcgm_exporters:  # the pages are the question, not this machine's GPUs
        for endpoint in dcgm_exporters:
            check_dcgm_exporter(report, endpoint)
        return report
    _check_dcgm(report, dcgm_loader or dcgm_api.get_loader(), bindings_path, address)
    _check_nvml(report, nvml_loader or nvml_api.get_loader())
    if report.best is not None:
        _check_models(report, "GPU models", report.models)
    return report


# --- commands --------------------------------------------------------------------------------


def cmd_doctor(args: argparse.Namespace) -> int:
    if getattr(args, "backend", ""):
        return cmd_backend(args)
    if getattr(args, "kubernetes", False):
        from otel_ofu.cli import doctor_kubernetes

        return doctor_kubernetes.cmd(args)
    exporters = getattr(args, "dcgm_exporter", None) or []
    report = diagnose(bindings_path=args.dcgm_bindings_path or None, address=args.dcgm_address or "",
                      dcgm_exporters=exporters)
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.render())
    if exporters:  # asked about dcgm-exporter: its pages decide
        return 0 if report.pages_ok else 1
    return 0 if report.best else 1


def cmd_backend(args: argparse.Namespace) -> int:
    """``doctor --backend URL``: the backend's names and labels instead of this machine's GPUs."""
    checks = backend_check.check_backend(backend_check.Backend(args.backend), lookback_s=args.lookback)
    shown = redact_url(args.backend)
    if args.json:
        print(json.dumps({"backend": shown, "ok": not any(c.status == FAIL for c in checks),
                          "checks": [asdict(c) for c in checks]}, indent=2))
    else:
        print(backend_check.render(shown, checks))
    return 1 if any(c.status == FAIL for c in checks) else 0


def auto_document(report: Report) -> dict[str, Any]:
    """The built-in pipeline for the best source: it -> ofu processor -> console."""
    receiver: dict[str, Any] = {"dcgm": {"address": report.dcgm_address}} if report.best == "dcgm" else {"nvml": {}}
    return {"receivers": receiver, "processors": {"ofu": {}}, "exporters": {"console": {}},
            "service": {"pipelines": {"metrics": {"receivers": list(receiver), "processors": ["ofu"],
                                                  "exporters": ["console"]}}}}


def run_autodetect(args: argparse.Namespace) -> int:
    """``otel-ofu run`` without ``--config``: the best real source, said on stderr; never a simulation."""
    from otel_ofu.cli.run import run_service
    from otel_ofu.pipeline import registry
    from otel_ofu.pipeline.config import parse_service_config
    from otel_ofu.pipeline.service import Service

    report = diagnose()
    if report.best is None:
        failed = [c for c in report.checks if c.status in (FAIL, WARN)]
        print("otel-ofu run: no --config given and no real GPU source is usable on this machine:", file=sys.stderr)
        for check in failed:
            print(f"  {check.name}: {check.detail}" + (f" ({check.fix})" if check.fix else ""), file=sys.stderr)
        print(DEMO_HINT + "\nor give a pipeline with --config (`otel-ofu doctor` explains each check).",
              file=sys.stderr)
        return 1
    detail = {"dcgm": f"DCGM profiling via {report.dcgm_address or 'an embedded host engine'}",
              "nvml": "NVML GPM"}[report.best]
    print(f"otel-ofu run: no --config given; using the {report.best} receiver ({detail}) -> ofu -> console. "
          "Give --config for anything else.", file=sys.stderr)
    config = parse_service_config(auto_document(report), "<auto-detected>", registry.factories())
    configure_logging(args.log_level or "info")
    return run_service(Service(config), args.duration)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("doctor", help="check which real GPU sources (DCGM, NVML GPM) work here, and why "
                                   "not; exit 0 when one does")
    parser.add_argument("--json", action="store_true", help="machine-readable report")
    parser.add_argument("--dcgm-address", default="", help="nv-hostengine host:port to check (default: localhost, "
                        "then an embedded host engine)")
    parser.add_argument("--dcgm-bindings-path", default="", help="directory holding pydcgm.py")
    parser.add_argument("--dcgm-exporter", action="append", default=[], metavar="URL",
                        help="a dcgm-exporter endpoint to scrape and check for the inputs OFU needs (repeatable; "
                        "then the exit code says whether every such page has them)")
    parser.add_argument("--backend", default="", metavar="URL",
                        help="instead: check that the Prometheus-compatible backend at URL (Prometheus, "
                        "VictoriaMetrics, ...) holds the names and labels the dashboards and rules read; exit 1 "
                        "when it does not (docs/backends.md)")
    parser.add_argument("--lookback", type=float, default=3600.0, metavar="SECONDS",
                        help="with --backend: how far back to look for otel-ofu's series (default 3600)")
    from otel_ofu.cli.doctor_kubernetes import add_arguments

    add_arguments(parser)
    parser.set_defaults(func=cmd_doctor)
