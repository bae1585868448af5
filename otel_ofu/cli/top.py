"""``otel-ofu top``: watch GPUs' OFU, jobs and findings live, in one command and no config file.

It builds the pipeline in code, through the same config loader and validation as a YAML
file: a receiver (this machine's GPUs, a dcgm-exporter endpoint, or OTLP from a Collector)
-> ``attribution`` -> ``ofu`` -> ``jobs`` -> ``console``. With no source given it picks this
machine's GPUs the way ``otel-ofu run`` without ``--config`` does (:mod:`otel_ofu.doctor`:
DCGM profiling, else NVML GPM) and says which, or why none works.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from otel_ofu.pipeline.config import ConfigError

DEFAULT_OTLP_GRPC = "127.0.0.1:4317"
DEFAULT_OTLP_HTTP = "127.0.0.1:4318"
DEFAULT_SCRAPE_INTERVAL = 30.0  # dcgm-exporter's own default collect interval (-c 30000)
LOCAL_INTERVAL = 10.0  # the dcgm / nvml receivers' default window

SOURCES_HELP = """\
sources (pick one; the default is this machine's GPUs):
  (none)            this machine's GPUs, chosen as `otel-ofu run` without --config does: DCGM
                    profiling (an nv-hostengine on localhost:5555 or an embedded one; needs the DCGM
                    Python bindings and profiling permission), else NVML GPM (Hopper or newer, the
                    NVIDIA driver's libnvidia-ml). `otel-ofu doctor` says what is missing.
  --scrape URL      a dcgm-exporter /metrics endpoint (repeat for several nodes), e.g.
                    http://gpu-node-1:9400/metrics. It must export DCGM_FI_PROF_PIPE_TENSOR_ACTIVE
                    and DCGM_FI_DEV_SM_CLOCK (its default counters do; a custom counters CSV must
                    keep them) and the modelName label. Scraped every --interval (default 30 s,
                    dcgm-exporter's own collect interval).
  --otlp [ENDPOINT] OTLP from an OpenTelemetry Collector (its prometheus receiver scraping
                    dcgm-exporter, or its dcgm receiver) on gRPC ENDPOINT (default 127.0.0.1:4317)
                    and HTTP --otlp-http (default 127.0.0.1:4318, "off" to disable). Point the
                    Collector's otlp exporter here; --window is the TPA window the source averages over.

Jobs come from Kubernetes pod labels and hpc_job on dcgm-exporter pages, and from the GPUs'
processes (/proc) on this machine. Ctrl-C stops; piped, it prints plain lines instead of the
live screen. docs/console.md describes the screen.
"""


def build_document(source: str, *, endpoints: list[str] | None = None, interval: float | None = None,
                   otlp_grpc: str = DEFAULT_OTLP_GRPC, otlp_http: str = DEFAULT_OTLP_HTTP, window: float = 30.0,
                   dcgm_address: str = "", refresh: float = 2.0, plain: bool = False,
                   title: str = "otel-ofu top") -> dict[str, Any]:
    """The pipeline document for a source: ``local-dcgm``, ``local-nvml``, ``scrape`` or ``otlp``."""
    attribution: dict[str, Any] = {}
    if source == "scrape":
        interval = interval or DEFAULT_SCRAPE_INTERVAL
        receivers: dict[str, Any] = {"dcgm_exporter": {
            "endpoints": endpoints, "collection_interval": interval, "exporter_collect_interval": interval}}
    elif source == "otlp":
        interval = window
        protocols: dict[str, Any] = {"grpc": {"endpoint": otlp_grpc}}
        if otlp_http != "off":
            protocols["http"] = {"endpoint": otlp_http}
        receivers = {"otlp": {"protocols": protocols, "window": window, "passthrough": False}}
    elif source in ("local-dcgm", "local-nvml"):
        interval = interval or LOCAL_INTERVAL
        if source == "local-dcgm":
            receivers = {"dcgm": {"address": dcgm_address, "collection_interval": interval}}
            attribution = {"processes": {"enabled": True, "pid_sources": ["nvml"]}}
        else:
            receivers = {"nvml": {"collection_interval": interval}}
            attribution = {"processes": {"enabled": True, "pid_sources": ["samples"]}}
    else:
        raise ValueError(f"unknown source {source!r}")
    jobs = {"default_interval": interval, "max_gap": max(120.0, 4 * interval)}
    console = {"refresh_interval": refresh, "mode": "plain" if plain else "auto", "title": title}
    return {"receivers": receivers, "processors": {"attribution": attribution, "ofu": {}, "jobs": jobs},
            "exporters": {"console": console},
            "service": {"pipelines": {"metrics": {"receivers": list(receivers),
                                                  "processors": ["attribution", "ofu", "jobs"],
                                                  "exporters": ["console"]}}}}


def _local_source(args: argparse.Namespace) -> tuple[str, str] | None:
    """(source, what it is) for this machine's GPUs, or None after saying why there is none."""
    from otel_ofu.cli.doctor import DEMO_HINT, FAIL, WARN, diagnose

    report = diagnose(address=args.dcgm_address or "")
    if report.best is None:
        print("otel-ofu top: no real GPU source is usable on this machine:", file=sys.stderr)
        for check in report.checks:
            if check.status in (FAIL, WARN):
                print(f"  {check.name}: {check.detail}" + (f" ({check.fix})" if check.fix else ""), file=sys.stderr)
        print("Watch another machine instead: otel-ofu top --scrape http://NODE:9400/metrics (dcgm-exporter) or "
              "otel-ofu top --otlp (from a Collector); `otel-ofu doctor` explains each check.\n" + DEMO_HINT,
              file=sys.stderr)
        return None
    if report.best == "dcgm":
        args.dcgm_address = report.dcgm_address
        return "local-dcgm", f"DCGM profiling via {report.dcgm_address or 'an embedded host engine'}"
    return "local-nvml", "NVML GPM"


def cmd_top(args: argparse.Namespace) -> int:
    from otel_ofu.cli.logs import configure_logging
    from otel_ofu.cli.run import run_service
    from otel_ofu.pipeline import registry
    from otel_ofu.pipeline.config import parse_service_config
    from otel_ofu.pipeline.service import Service

    if args.scrape and args.otlp is not None:
        print("otel-ofu top: give one source: --scrape or --otlp, not both", file=sys.stderr)
        return 2
    if args.scrape:
        source, what = "scrape", ", ".join(args.scrape)
    elif args.otlp is not None:
        http = "" if args.otlp_http == "off" else f", HTTP {args.otlp_http}"
        source, what = "otlp", f"OTLP on gRPC {args.otlp}{http}"
    else:
        local = _local_source(args)
        if local is None:
            return 1
        source, what = local
    doc = build_document(source, endpoints=args.scrape, interval=args.interval, otlp_grpc=args.otlp or "",
                         otlp_http=args.otlp_http, window=args.window or 30.0, dcgm_address=args.dcgm_address or "",
                         refresh=args.refresh, plain=args.plain, title=f"otel-ofu top · {what}")
    try:
        config = parse_service_config(doc, "otel-ofu top", registry.factories())
    except ConfigError as exc:  # a bad URL or endpoint: named by the key it went into
        print(f"otel-ofu top: {exc}", file=sys.stderr)
        return 2
    configure_logging(args.log_level)
    return run_service(Service(config), args.duration)


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "top", help="watch GPUs' OFU, jobs and findings live (this machine, a dcgm-exporter, or OTLP); no config",
        description="Watch OFU live: a fleet header, jobs with their OFU trend and open findings (reported MFU far "
                    "from OFU, regressions), and a per-GPU table. Builds receiver -> attribution -> ofu -> jobs -> "
                    "console itself; no config file.",
        epilog=SOURCES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_argument_group("source")
    source.add_argument("--scrape", metavar="URL", action="append", default=[],
                        help="a dcgm-exporter endpoint (host:port means http://host:port/metrics); repeatable")
    source.add_argument("--otlp", metavar="ENDPOINT", nargs="?", const=DEFAULT_OTLP_GRPC, default=None,
                        help=f"listen for OTLP gRPC on ENDPOINT (default {DEFAULT_OTLP_GRPC})")
    source.add_argument("--otlp-http", metavar="ENDPOINT", default=DEFAULT_OTLP_HTTP,
                        help=f"with --otlp: OTLP/HTTP endpoint (default {DEFAULT_OTLP_HTTP}; 'off' disables it)")
    source.add_argument("--dcgm-address", default="", help="this machine: nv-hostengine host:port to use")
    parser.add_argument("--interval", type=_positive, default=None, metavar="S",
                        help=f"seconds between reads (default: {DEFAULT_SCRAPE_INTERVAL:g} for --scrape, "
                             f"{LOCAL_INTERVAL:g} for this machine)")
    parser.add_argument("--window", type=_positive, default=None, metavar="S",
                        help="with --otlp: the TPA window of the source, seconds (default 30, dcgm-exporter's)")
    parser.add_argument("--refresh", type=_positive, default=2.0, metavar="S",
                        help="redraw every S seconds (default 2)")
    parser.add_argument("--plain", action="store_true", help="plain lines even on a terminal")
    parser.add_argument("--duration", type=_positive, default=None, metavar="S", help="stop after S seconds")
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="warning",
                        help="default warning: the screen says what info logs would")
    parser.set_defaults(func=cmd_top)
