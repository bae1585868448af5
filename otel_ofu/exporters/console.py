"""The ``console`` exporter: a live per-GPU table.

On a terminal the table is redrawn in place every ``refresh_interval``; when the output is
piped it prints the table as plain lines every ``refresh_interval`` instead, so logs stay
readable. It shows the latest window of each GPU; the timestamp is the data's own
(simulated time under the ``sim`` receiver).
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal, TextIO

from otel_ofu.core.model import GPU_INDEX, HOST_NAME, HW_ID, HW_MODEL, Batch, job_id_of, precision_of
from otel_ofu.pipeline.component import Context, Exporter, Factory
from otel_ofu.pipeline.config import Duration, require

_COLUMNS = ("host", "gpu", "model", "job", "precision", "tpa", "sm_mhz", "ofu_raw", "ofu")
_METRIC_COLUMNS = {"gpu.tensor.activity": "tpa", "gpu.sm.clock.frequency": "sm_mhz", "gpu.ofu.raw": "ofu_raw",
                   "gpu.ofu": "ofu"}


@dataclass
class ConsoleExporterConfig:
    refresh_interval: Duration = field(default_factory=lambda: Duration(2.0))
    max_rows: int = 64
    output: Literal["stdout", "stderr"] = "stdout"
    # auto: redraw in place on a terminal, plain lines otherwise.
    mode: Literal["auto", "live", "plain"] = "auto"

    def validate(self) -> None:
        require(self.refresh_interval > 0, "refresh_interval", "must be positive")
        require(self.max_rows > 0, "max_rows", "must be positive")


def _short_model(model: str) -> str:
    return model.removeprefix("NVIDIA ").strip()


class ConsoleExporter(Exporter):
    def __init__(self, config: ConsoleExporterConfig, context: Context, stream: TextIO | None = None):
        super().__init__(config, context)
        self.stream = stream or (sys.stdout if config.output == "stdout" else sys.stderr)
        live = config.mode == "live" or (config.mode == "auto" and self.stream.isatty())
        self.live = live
        self._rows: dict[str, dict[str, object]] = {}
        self._latest_ns = 0
        self._lock = threading.Lock()
        self._dirty = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def export(self, batch: Batch) -> None:
        with self._lock:
            for p in batch.points:
                column = _METRIC_COLUMNS.get(p.name)
                if column is None:
                    continue
                resource = dict(p.resource)
                key = str(resource.get(HW_ID, resource.get(HOST_NAME, "?")))
                row = self._rows.setdefault(key, {})
                row.update(host=resource.get(HOST_NAME, "?"), gpu=resource.get(GPU_INDEX, "?"),
                           model=_short_model(str(resource.get(HW_MODEL, "?"))),
                           job=job_id_of(p) or "?", precision=precision_of(p) or "?")
                row[column] = p.value / 1e6 if column == "sm_mhz" else p.value
                row["_t"] = p.time_unix_nano
                self._latest_ns = max(self._latest_ns, p.time_unix_nano)
                self._dirty = True

    def render(self) -> list[str]:
        """The current table as lines (header first)."""
        with self._lock:
            rows = sorted(self._rows.values(), key=lambda r: (str(r["host"]), _gpu_sort_key(r["gpu"])))
            latest = self._latest_ns
        stamp = datetime.fromtimestamp(latest / 1e9, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if latest else "-"
        ofus = [float(r["ofu"]) for r in rows if isinstance(r.get("ofu"), float)]
        mean = f"{sum(ofus) / len(ofus):.3f}" if ofus else "n/a"
        cells = [[_fmt(r.get(c)) for c in _COLUMNS] for r in rows[: self.config.max_rows]]
        widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c) for i, c in enumerate(_COLUMNS)]
        lines = [f"otel-ofu  {stamp}  {len(rows)} GPUs  mean OFU {mean}",
                 "  ".join(c.ljust(w) for c, w in zip(_COLUMNS, widths))]
        lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
        if len(rows) > self.config.max_rows:
            lines.append(f"... {len(rows) - self.config.max_rows} more GPUs")
        return lines

    def _draw(self) -> None:
        with self._lock:
            if not self._dirty:
                return
            self._dirty = False
        lines = self.render()
        if self.live:
            self.stream.write("\x1b[H\x1b[2J" + "\n".join(lines) + "\n")
        else:
            self.stream.write("\n".join(lines) + "\n\n")
        self.stream.flush()

    def _loop(self) -> None:
        while not self._stop.wait(self.config.refresh_interval):
            self._draw()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=self.context.component_id, daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._draw()


def _gpu_sort_key(value: object) -> tuple[int, str]:
    text = str(value)
    return (int(text), "") if text.isdigit() else (1 << 30, text)


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.0f}" if value >= 10 else f"{value:.3f}"
    return str(value)


FACTORY = Factory("console", ConsoleExporterConfig, ConsoleExporter, "prints a live per-GPU table")
