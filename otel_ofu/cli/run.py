"""Running a service from the command line: until its duration, a signal or Ctrl-C.

While a live console draws on the terminal, log lines are routed through it so they print
above the live region (:mod:`otel_ofu.console.logs`); the usual handlers come back after.
"""

from __future__ import annotations

import gc
import logging
import sys

from otel_ofu.console.logs import route_logging
from otel_ofu.exporters.console import live_console
from otel_ofu.pipeline.component import StartError
from otel_ofu.pipeline.config import ConfigError
from otel_ofu.pipeline.memory import tune_allocator
from otel_ofu.pipeline.service import Service

# The garbage collector's thresholds for a running service (CPython's default: 700, 10, 10).
GC_THRESHOLDS = (50_000, 20, 100)

log = logging.getLogger(__name__)


def tune_runtime() -> None:
    """The interpreter and allocator settings of a running service: :func:`tune_garbage_collection` and
    :func:`otel_ofu.pipeline.memory.tune_allocator`."""
    tune_garbage_collection()
    if not tune_allocator():
        log.debug("glibc malloc left as it is (not glibc, or MALLOC_*/GLIBC_TUNABLES set)")


def tune_garbage_collection() -> None:
    """Collect garbage less often than CPython's defaults, and never walk what start-up built.

    Why: a service keeps large long-lived state (every GPU's labels, resources and shapes in
    the receivers' and exporters' caches, the jobs' series), and each batch allocates hundreds
    of thousands of short-lived objects. With the default thresholds the collector walks that
    state again and again while a batch is processed: a fifth of the processing stage's time
    at 50,000 GPUs (benchmarks/throughput.py). A first threshold of 50,000 lets a batch's
    objects die by reference counting before a collection sees them; freezing the modules and
    the config takes them out of every collection. Cyclic garbage is still collected.
    """
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def run_service(service: Service, duration: float | None) -> int:
    """Exit code: 0 when it stopped as asked, 130 after a second Ctrl-C, 1 for a config problem
    found when a component starts (e.g. an environment variable it needs is unset) or for a
    finite receiver that sent nothing (a replay that refused its file) or a component that could not
    start (:class:`StartError`)."""
    tune_runtime()
    with route_logging(live_console(service)):
        try:
            service.run(duration=duration)
        except KeyboardInterrupt:
            return 130
        except ConfigError as exc:
            print(f"invalid config: {exc}", file=sys.stderr)
            return 1
        except StartError as exc:
            print(f"otel-ofu: cannot start: {exc}", file=sys.stderr)
            return 1
    failures = service.failures()
    for receiver_id, why in failures.items():
        print(f"otel-ofu: {receiver_id} sent nothing: {why}", file=sys.stderr)
    return 1 if failures else 0
