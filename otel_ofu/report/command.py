"""``otel-ofu report PATH``: the command line over :mod:`.build` (table, JSON, CSV) and :mod:`.plots`."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from otel_ofu.jobs.tracker import JobsConfig
from otel_ofu.report import plots
from otel_ofu.report.build import ReportError, build_report, render_table, report_json, write_csv

log = logging.getLogger("otel_ofu.report")


def _jobs_config(config_path: str) -> JobsConfig:
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


def cmd_report(args: argparse.Namespace) -> int:
    try:
        config = _jobs_config(args.config) if args.config else None
        report = build_report(args.path, config, recompute=args.recompute)
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
        print(render_table(report))
        if args.csv:
            print(f"CSV: {args.csv}")
        if args.plots:
            print(f"plots: {args.plots}")
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "report", help="per-job table (GPU hours, OFU, FLOPs, waste, findings) and plots from a recording",
        description="Reads OTLP JSON lines written by the file exporter and prints a per-job table sorted by wasted "
                    "GPU hours.")
    parser.add_argument("path", help="the file exporter's output (OTLP JSON lines)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--csv", metavar="FILE", help="also write the table as CSV")
    parser.add_argument("--plots", metavar="DIR", help="also write PNG plots (per-job timelines, fleet distribution)")
    parser.add_argument("--recompute", action="store_true",
                        help="recompute findings from the points even when the recording holds finding events")
    parser.add_argument("--config", metavar="FILE",
                        help="take the jobs settings (windows, thresholds) from this pipeline config's jobs processor")
    parser.set_defaults(func=cmd_report)
