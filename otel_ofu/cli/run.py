"""Running a service from the command line: until its duration, a signal or Ctrl-C.

While a live console draws on the terminal, log lines are routed through it so they print
above the live region (:mod:`otel_ofu.console.logs`); the usual handlers come back after.
"""

from __future__ import annotations

from otel_ofu.console.logs import route_logging
from otel_ofu.exporters.console import live_console
from otel_ofu.pipeline.service import Service


def run_service(service: Service, duration: float | None) -> int:
    """Exit code: 0 when it stopped as asked, 130 after a second Ctrl-C."""
    with route_logging(live_console(service)):
        try:
            service.run(duration=duration)
        except KeyboardInterrupt:
            return 130
    return 0
