"""The ``otel-ofu`` command line: run, validate (and the subcommands other modules add)."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from otel_ofu import __version__
from otel_ofu.cli.logs import configure_logging
from otel_ofu.cli.run import run_service
from otel_ofu.pipeline.config import ConfigError

log = logging.getLogger("otel_ofu.cli")

# Modules that add subcommands: each defines ``register(subparsers)``, which adds its parser
# and sets ``func`` (taking the parsed args, returning an exit code).
COMMAND_MODULES: tuple[str, ...] = ("otel_ofu.report.command", "otel_ofu.cli.doctor", "otel_ofu.cli.top")


def cmd_validate(args: argparse.Namespace) -> int:
    from otel_ofu.pipeline.service import load_config

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"invalid config: {exc}", file=sys.stderr)
        return 1
    names = ", ".join(p.name for p in config.pipelines)
    for warning in config.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"{args.config}: valid ({len(config.pipelines)} pipeline(s): {names})")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from otel_ofu.pipeline.service import Service, load_config

    if not args.config:  # the best real GPU source on this machine, or a pointer to the demo
        from otel_ofu.cli.doctor import run_autodetect

        return run_autodetect(args)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"invalid config: {exc}", file=sys.stderr)
        return 1
    configure_logging(args.log_level or config.log_level)
    return run_service(Service(config, exit_when_done=True if args.exit_when_done else None), args.duration)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="otel-ofu", description="GPU Overall FLOP Utilization as OpenTelemetry "
                                     "metrics.")
    parser.add_argument("--version", action="version", version=f"otel-ofu {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run pipelines from a config until --duration ends or SIGINT/SIGTERM")
    run.add_argument("--config", help="pipeline config (YAML)")
    run.add_argument("--duration", type=float, default=None, help="stop after this many wall-clock seconds")
    run.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default=None)
    run.add_argument("--exit-when-done", action="store_true",
                     help="stop (flushing every exporter) once every receiver that ends by itself, such as a replay "
                          "without loop, has sent everything; same as service.exit_when_done: true")
    run.set_defaults(func=cmd_run)

    validate = sub.add_parser("validate", help="check a config; exit 0 when valid")
    validate.add_argument("--config", required=True)
    validate.set_defaults(func=cmd_validate)

    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
