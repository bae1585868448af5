"""Regenerate docs/img/console.png: the live console during the demo, as a terminal shows it.

    .venv/bin/pip install -e '.[docs]' && .venv/bin/python tools/console_screenshot.py

Runs the demo pipeline (collector-config/demo.yaml, sped up, from a fixed start time) until
both of its findings are open, logs printed through the same rich Console above the layout
as in a terminal, then exports that Console as SVG (rich's ``export_svg``) and converts it to
PNG with CairoSVG. ``--out x.svg`` writes only the SVG (no CairoSVG needed).
"""

from __future__ import annotations

import argparse
import io
import logging
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import yaml
from rich.console import Console
from rich.terminal_theme import MONOKAI

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from otel_ofu.console.logs import rich_handler  # noqa: E402
from otel_ofu.console.render import live_layout  # noqa: E402
from otel_ofu.console.state import FleetView  # noqa: E402
from otel_ofu.pipeline import registry  # noqa: E402
from otel_ofu.pipeline.config import parse_service_config  # noqa: E402
from otel_ofu.pipeline.service import Service  # noqa: E402

COMMAND = "otel-ofu run --config collector-config/demo.yaml"
START = "2026-03-02T09:00:00+00:00"
# rich's SVG template fetches Fira Code from a CDN; render with a local monospace font instead.
FONT = "DejaVu Sans Mono"


def demo_service(acceleration: float) -> Service:
    doc = yaml.safe_load((ROOT / "collector-config" / "demo.yaml").read_text())
    doc["receivers"]["sim"].update(time_acceleration=acceleration, start_time=START)
    doc["exporters"] = {"console": {"mode": "plain", "refresh_interval": "1h"}}
    # The GPUs' pipeline only, drawn by the console (the demo's self-telemetry goes to its file exporter).
    doc["receivers"] = {"sim": doc["receivers"]["sim"]}
    doc["service"]["pipelines"] = {"metrics": {**doc["service"]["pipelines"]["metrics"], "exporters": ["console"]}}
    return Service(parse_service_config(doc, "demo (screenshot)", registry.factories()))


def run_until_findings(service: Service, data_minutes: float, timeout: float,
                       before_stop: Callable[[], None]) -> FleetView:
    """Run the demo until both findings are open and ``data_minutes`` of fleet time have passed."""
    exporter = service.exporters["console"].exporter
    exporter.stream = io.StringIO()  # its plain frames are not wanted here
    stop = threading.Event()
    runner = threading.Thread(target=service.run, kwargs={"stop": stop}, daemon=True)
    runner.start()
    deadline = time.monotonic() + timeout
    start_ns = None
    while time.monotonic() < deadline:
        time.sleep(0.1)
        view = exporter.state.view()
        start_ns = start_ns or view.data_ns
        if view.open_findings >= 2 and view.data_ns - (start_ns or 0) >= data_minutes * 60e9:
            break
    else:
        raise SystemExit(f"the demo did not open both findings within {timeout:g} s")
    before_stop()  # the shutdown's log lines (jobs ended) are not part of the shot
    stop.set()
    runner.join(timeout=60)
    return view  # the frame to draw: as it was while both findings were open


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "console.png")
    parser.add_argument("--width", type=int, default=156, help="terminal columns")
    parser.add_argument("--height", type=int, default=46, help="terminal lines")
    parser.add_argument("--acceleration", type=float, default=600.0, help="simulated seconds per wall second")
    parser.add_argument("--minutes", type=float, default=40.0, help="fleet minutes to simulate before the shot")
    args = parser.parse_args(argv)

    console = Console(record=True, width=args.width, height=args.height, file=io.StringIO(), force_terminal=True,
                      color_system="truecolor")
    service = demo_service(args.acceleration)
    # As in a terminal: the log lines print above the live region (otel_ofu.console.logs).
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    root.addHandler(rich_handler(console))
    view = run_until_findings(service, args.minutes, timeout=120, before_stop=root.handlers.clear)
    console.print(live_layout(view, console, title="otel-ofu"))
    svg = console.export_svg(title=COMMAND, theme=MONOKAI, code_format=_svg_format())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.out.suffix == ".svg":
        args.out.write_text(svg)
    else:
        try:
            import cairosvg
        except ImportError:
            print("CairoSVG is missing: pip install -e '.[docs]' (or give --out FILE.svg)", file=sys.stderr)
            return 1
        cairosvg.svg2png(bytestring=svg.encode(), write_to=str(args.out), output_width=args.width * 12)
    print(args.out)
    return 0


def _svg_format() -> str:
    from rich._export_format import CONSOLE_SVG_FORMAT

    start = CONSOLE_SVG_FORMAT.index("    @font-face")
    end = CONSOLE_SVG_FORMAT.index("    .{unique_id}-matrix")
    return (CONSOLE_SVG_FORMAT[:start] + CONSOLE_SVG_FORMAT[end:]).replace("font-family: Fira Code, monospace",
                                                                            f"font-family: '{FONT}', monospace")


if __name__ == "__main__":
    sys.exit(main())
