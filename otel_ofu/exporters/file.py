"""The ``file`` exporter: OTLP JSON, one export request per line, like the Collector's.

Other tools (the Collector's otlpjsonfilereceiver, ``otel-ofu report``, the ``replay``
receiver) read the same format. Every line is flushed as it is written, so a crash loses at
most the batch being written.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from otel_ofu.core.model import Batch
from otel_ofu.otlp import codec as otlp
from otel_ofu.pipeline.component import Context, Exporter, Factory
from otel_ofu.pipeline.config import require


@dataclass
class FileExporterConfig:
    path: str = ""
    # As in the Collector: false truncates the file at start, true appends to it.
    append: bool = False

    def validate(self) -> None:
        require(bool(self.path), "path", "required: the file to write OTLP JSON lines to")
        parent = Path(self.path).expanduser().parent
        require(parent.is_dir(), "path", f"directory {str(parent)!r} does not exist")


class FileExporter(Exporter):
    def __init__(self, config: FileExporterConfig, context: Context):
        super().__init__(config, context)
        self._file = None
        self._lock = threading.Lock()
        self.lines_written = 0

    def start(self) -> None:
        self._file = open(Path(self.config.path).expanduser(), "a" if self.config.append else "w", encoding="utf-8")

    def export(self, batch: Batch) -> None:
        lines = []
        request = otlp.to_request(batch.points)
        request.resource_metrics.extend(otlp.passthrough_messages(batch.passthrough))
        if request.resource_metrics:
            lines.append(otlp.to_json_line(request))
        if batch.events:  # as the Collector's file exporter: each signal's requests on their own lines
            lines.append(otlp.to_json_line(otlp.events_to_request(batch.events)))
        if not lines:
            return
        with self._lock:
            if self._file is None:
                raise RuntimeError("file exporter used before start() or after shutdown()")
            self._file.write("\n".join(lines) + "\n")
            self._file.flush()
            self.lines_written += len(lines)

    def shutdown(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


FACTORY = Factory("file", FileExporterConfig, FileExporter, "writes OTLP JSON lines to a file")
