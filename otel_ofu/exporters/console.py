"""The ``console`` exporter: the fleet, its jobs and findings, and its GPUs, live on a terminal.

On a terminal it draws a rich live layout (a fleet header, a jobs panel with OFU trends and
open findings, the per-GPU table) redrawn every ``refresh_interval``; log lines print above
it when the CLI routes logging through its console (:mod:`otel_ofu.console.logs`). When the
output is piped it prints plain lines instead: the header and the jobs every
``refresh_interval`` (when something changed), the per-GPU table every ``plain_gpu_table``
and at shutdown. Times shown are the data's own (simulated time under the ``sim``
receiver). What it shows and why: :mod:`otel_ofu.console.state`, docs/console.md.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Literal, TextIO

from rich.console import Console, RenderableType
from rich.live import Live

from otel_ofu.console.render import live_layout, plain_lines
from otel_ofu.console.state import FleetState, FleetView, source_lines
from otel_ofu.core.metrics import RECEIVER_ACCEPTED
from otel_ofu.core.model import Batch
from otel_ofu.pipeline.component import Context, Exporter, Factory
from otel_ofu.pipeline.config import Duration, require


@dataclass
class ConsoleExporterConfig:
    # How often the screen is redrawn (plain mode: how often lines may be printed).
    refresh_interval: Duration = field(default_factory=lambda: Duration(2.0))
    max_rows: int = 64  # GPU rows at most (fewer when the terminal is shorter)
    max_jobs: int = 12  # job rows at most
    output: Literal["stdout", "stderr"] = "stdout"  # where the console is drawn
    # live: the layout (even when not a terminal); plain: lines; auto: live on a terminal,
    # plain lines otherwise.
    mode: Literal["auto", "live", "plain"] = "auto"
    # Plain mode: the per-GPU table this often (and at shutdown); header and jobs every refresh.
    plain_gpu_table: Duration = field(default_factory=lambda: Duration(60.0))
    # The jobs' OFU trend: one sparkline block per this much data time.
    sparkline_bucket: Duration = field(default_factory=lambda: Duration(60.0))
    # A GPU with no data for this long (wall time) shows as stale; unset: three of its own
    # intervals between data, at least 5 s.
    stale_after: Duration | None = None
    title: str = "otel-ofu"  # the header's title

    def validate(self) -> None:
        require(self.refresh_interval > 0, "refresh_interval", "must be positive")
        require(self.max_rows > 0, "max_rows", "must be positive")
        require(self.max_jobs > 0, "max_jobs", "must be positive")
        require(self.plain_gpu_table >= 0, "plain_gpu_table", "must not be negative")
        require(self.sparkline_bucket > 0, "sparkline_bucket", "must be positive")
        require(self.stale_after is None or self.stale_after > 0, "stale_after", "must be positive")


class ConsoleExporter(Exporter):
    def __init__(self, config: ConsoleExporterConfig, context: Context, stream: TextIO | None = None):
        super().__init__(config, context)
        self.stream = stream or (sys.stdout if config.output == "stdout" else sys.stderr)
        self.live = config.mode == "live" or (config.mode == "auto" and _isatty(self.stream))
        # Live: rich detects size and colour (NO_COLOR respected); forced for mode "live" on a non-terminal.
        self.console = Console(file=self.stream, force_terminal=True if config.mode == "live" else None) \
            if self.live else None
        self.state = FleetState(sparkline_bucket_s=float(config.sparkline_bucket),
                                stale_after_s=None if config.stale_after is None else float(config.stale_after))
        self._lock = threading.Lock()
        self._dirty = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._live: Live | None = None
        self._table_at: float | None = None  # plain mode: when the GPU table was last printed
        self._last_had_table = False
        self._sources_shown: tuple[str, ...] = ()  # plain mode: the source lines last printed

    def export(self, batch: Batch) -> None:
        with self._lock:
            self._dirty |= self.state.update(batch)

    def _view(self) -> FleetView:
        """The state, with what the service's receivers say of themselves (their sources' state)."""
        with self._lock:
            view = self.state.view()
        telemetry = self.context.telemetry
        states = telemetry.receiver_states()
        accepted = {receiver: telemetry.counter(RECEIVER_ACCEPTED, receiver=receiver) for receiver in states}
        return replace(view, sources=source_lines(states, accepted, bool(view.gpus or view.jobs)))

    def layout(self) -> RenderableType:
        """The live screen as a rich renderable, sized to the console."""
        view = self._view()
        assert self.console is not None
        return live_layout(view, self.console, title=self.config.title, max_gpus=self.config.max_rows,
                           max_jobs=self.config.max_jobs)

    def render(self, gpus: bool = True, view: FleetView | None = None) -> list[str]:
        """The current state as plain lines (header first)."""
        return plain_lines(view or self._view(), title=self.config.title, gpus=gpus, max_gpus=self.config.max_rows)

    def _draw(self, final: bool = False) -> None:
        if self._live is not None:
            self._live.refresh()  # also when nothing arrived: staleness is wall time
            return
        with self._lock:
            dirty, self._dirty = self._dirty, False
        view = self._view()
        # What the sources say changed (a scrape began failing, or recovered): printed like new data.
        dirty |= view.sources != self._sources_shown
        # The last frame ends with the GPU table, unless the frame before already showed this state with it.
        if not dirty and (not final or self._last_had_table):
            return
        now = time.monotonic()
        table = final or self._table_at is None or now - self._table_at >= float(self.config.plain_gpu_table)
        if table:
            self._table_at = now
        self._last_had_table = table
        lines = self.render(gpus=table, view=view)
        if final and not self.state.gpus and not self.state.jobs and view.sources == self._sources_shown:
            return
        self._sources_shown = view.sources
        self.stream.write("\n".join(lines) + "\n\n")
        self.stream.flush()

    def _loop(self) -> None:
        while not self._stop.wait(float(self.config.refresh_interval)):
            try:
                self._draw()
            except Exception:  # a drawing bug must not kill the display thread for good
                self.log.exception("console: drawing failed")

    def start(self) -> None:
        if self.live:
            self._live = Live(console=self.console, auto_refresh=False, transient=False, redirect_stdout=True,
                              redirect_stderr=_isatty(sys.stderr), get_renderable=self.layout)
            self._live.start(refresh=True)
        self._thread = threading.Thread(target=self._loop, name=self.context.component_id, daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self._draw(final=True)
        finally:
            if self._live is not None:
                self._live.stop()
                self._live = None


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def live_console(service) -> Console | None:
    """The rich Console of a live console exporter in ``service`` (None when there is none)."""
    for slot in getattr(service, "exporters", {}).values():
        exporter = slot.exporter
        if isinstance(exporter, ConsoleExporter) and exporter.console is not None:
            return exporter.console
    return None


FACTORY = Factory("console", ConsoleExporterConfig, ConsoleExporter,
                  "a live console: fleet header, jobs with findings, per-GPU table")
