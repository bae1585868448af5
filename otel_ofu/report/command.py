"""``otel-ofu report PATH``: the command line over :mod:`.build` (table, JSON, CSV) and :mod:`.plots`."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from otel_ofu.cli.backend_check import Backend
from otel_ofu.jobs.config import JobsConfig
from otel_ofu.report import plots
from otel_ofu.report.backend import build_backend_report, parse_time
from otel_ofu.report.build import ReadOptions, ReportError, build_report, render_table, report_json, write_csv

log = logging.getLogger("otel_ofu.report")


def _jobs_config(config_path: str) -> JobsConfig:
    """The settings of the jobs processor of a pipeline config (the first one)."""
    from otel_ofu.pipeline.config import ConfigError, component_type
    from otel_ofu.pipeline.service import load_config

    try:
        service = load_config(config_path)
    except ConfigError as exc:
        raise ReportError(f"invalid config: {exc}") from None
    for comp_id, cfg in service.components["processors"].items():
        if component_type(comp_id) == "jobs":
            return cfg
    raise ReportError(f"{config_path}: no jobs processor configured: nothing to take settings from")


def _backend(args: argparse.Namespace) -> Backend:
    """The query API of ``--prometheus``, with the bearer token and TLS options (the scrape client's keys)."""
    from otel_ofu.scrape.client import TlsSettings, _ssl_context

    token = ""
    if args.bearer_token_file:
        try:
            token = Path(args.bearer_token_file).expanduser().read_text().strip()
        except OSError as exc:
            raise ReportError(f"--bearer-token-file {args.bearer_token_file}: {exc.strerror}") from None
    if bool(args.cert_file) != bool(args.key_file):
        raise ReportError("--cert-file and --key-file go together (client certificate and its key)")
    tls = TlsSettings(args.ca_file or "", args.cert_file or "", args.key_file or "", args.insecure_skip_verify)
    try:
        context = _ssl_context(tls) if args.prometheus.startswith("https:") else None
    except (OSError, ValueError) as exc:
        raise ReportError(f"TLS settings: {exc}") from None
    return Backend(args.prometheus, timeout=args.timeout, bearer_token=token, context=context)


def cmd_report(args: argparse.Namespace) -> int:
    try:
        config = _jobs_config(args.config) if args.config else None
        config_source = f"the jobs settings of {args.config}" if args.config else "default jobs settings"
        if args.prometheus:
            if args.paths:
                raise ReportError("give recordings (PATH) or --prometheus URL, not both")
            refused = [option for option, given in (("--plots", args.plots), ("--gpus", args.gpus),
                                                    ("--recompute", args.recompute)) if given]
            if refused:
                raise ReportError(f"{', '.join(refused)}: not from a backend: the job series hold no per-GPU "
                                  "points, timelines or points to recompute findings from (docs/report.md#what-"
                                  "the-backend-report-cannot-give)")
            now = time.time()
            end = parse_time(args.end, now)
            report = build_backend_report(_backend(args), parse_time(args.start, end if args.start.strip()
                                                                     .startswith("-") else now), end, config,
                                          config_source)
        elif not args.paths:
            raise ReportError("give recordings (PATH ...) or --prometheus URL")
        else:
            options = ReadOptions(model=args.model or "", host_name=args.host_name or "",
                                  start_time=args.start_time, interval=args.interval,
                                  skip_malformed=args.skip_malformed, processes=args.processes)
            report = build_report(args.paths, config, recompute=args.recompute, options=options,
                                  config_source=config_source, timelines=bool(args.plots))
        if args.csv:
            write_csv(report, args.csv)
        if args.plots:
            written = plots.write_plots(report, args.plots)
            log.info("wrote %d plots to %s", len(written), args.plots)
    except ReportError as exc:
        print(f"otel-ofu report: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report_json(report), indent=2))
    else:
        print(render_table(report, show_gpus=args.gpus))
        if args.csv:
            print(f"CSV: {args.csv}")
        if args.plots:
            print(f"plots: {args.plots}")
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "report", help="per-job table (GPU hours, OFU, FLOPs, waste, findings) and plots from recordings or a "
                       "Prometheus-compatible backend",
        description="Reads recordings (the file exporter's OTLP JSON lines and the Collector's OTLP protobuf records "
                    "(format: proto), told by their bytes, also rotated or compressed; dcgmi dmon "
                    "output and CSV, computed as the replay receiver and the ofu processor would) and prints a "
                    "per-job table sorted by wasted GPU hours. Points of all files are taken in data-time order. "
                    "With --prometheus URL, the same report from the jobs processor's series in a Prometheus, "
                    "VictoriaMetrics, Thanos or Mimir. docs/report.md has the details.")
    parser.add_argument("paths", nargs="*", metavar="PATH",
                        help="files, directories (every recording inside) or globs; .gz and .zst are read")
    parser.add_argument("--gpus", action="store_true", help="also print the per-GPU table (always printed when no "
                        "job was attributed)")
    parser.add_argument("--processes", type=int, default=0, metavar="N",
                        help="read up to N files at once, each in its own process (default 0: as many as the CPUs "
                        "this process may use; inputs under 20 MB in all are read in this process)")
    parser.add_argument("--skip-malformed", action="store_true",
                        help="skip lines that do not parse (with a warning) instead of stopping")
    replay = parser.add_argument_group("dmon and CSV recordings (as the replay receiver's settings)")
    replay.add_argument("--model", help="GPU model of a dmon (or model-less CSV) recording, which picks f_ref, "
                        "e.g. 'NVIDIA H100 80GB HBM3'")
    replay.add_argument("--host-name", help="host.name of the GPUs of a dmon recording")
    replay.add_argument("--start-time", help="time of the first dmon row, ISO 8601 or unix seconds (default: now)")
    replay.add_argument("--interval", type=float, help="dmon row spacing / CSV window in seconds (default: the "
                        "recorded -d, else 1 s)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--csv", metavar="FILE", help="also write the table as CSV")
    parser.add_argument("--plots", metavar="DIR", help="also write PNG plots (per-job timelines, fleet distribution)")
    parser.add_argument("--recompute", action="store_true",
                        help="recompute the jobs and their findings from the GPU points with the report's settings "
                             "(--config) even when the recording holds the jobs processor's series and events "
                             "(docs/report.md#two-ways-to-read-a-recording)")
    parser.add_argument("--config", metavar="FILE",
                        help="take the jobs settings (windows, thresholds) from this pipeline config's jobs processor")
    backend = parser.add_argument_group("from a Prometheus-compatible backend (docs/report.md#from-the-backend)")
    backend.add_argument("--prometheus", metavar="URL", default="",
                         help="instead of recordings: the query API's base URL (http://HOST:9090 for Prometheus, "
                              "http://HOST:8428 for VictoriaMetrics; user:password@ in it is sent as basic auth)")
    backend.add_argument("--start", default="-24h", metavar="T",
                         help="the range's start: RFC 3339 (2026-11-01T00:00:00Z), unix seconds, or before --end "
                              "such as -30d (s, m, h, d, w; default -24h)")
    backend.add_argument("--end", default="now", metavar="T",
                         help="the range's end: RFC 3339, unix seconds, 'now' (the default) or before now (-1h)")
    backend.add_argument("--bearer-token-file", metavar="FILE", help="send the token in FILE as Authorization: Bearer")
    backend.add_argument("--ca-file", metavar="FILE", help="CA bundle (PEM) to verify an https:// backend")
    backend.add_argument("--cert-file", metavar="FILE", help="client certificate (PEM), with --key-file")
    backend.add_argument("--key-file", metavar="FILE", help="the client certificate's key")
    backend.add_argument("--insecure-skip-verify", action="store_true",
                         help="do not verify the backend's certificate")
    backend.add_argument("--timeout", type=float, default=120.0, metavar="S",
                         help="seconds each query may take (default 120: a month of a large fleet is heavy)")
    parser.set_defaults(func=cmd_report)
