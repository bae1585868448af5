"""Which component types exist: each module listed here defines a module-level ``FACTORY``.

Listing the factories imports every module below, so keep their top-level imports light:
import optional or heavy dependencies (DCGM bindings, pynvml, grpc servers) inside the
component's ``start()``.
"""

from __future__ import annotations

import functools
import importlib

from otel_ofu.pipeline.component import Factory

COMPONENT_MODULES: dict[str, tuple[str, ...]] = {
    "receivers": (
        "otel_ofu.receivers.sim",
        "otel_ofu.receivers.dcgm",
        "otel_ofu.receivers.nvml",
        "otel_ofu.receivers.dcgm_exporter",
        "otel_ofu.receivers.prometheus",
        "otel_ofu.receivers.replay",
        "otel_ofu.receivers.otlp",
        "otel_ofu.receivers.selftelemetry",
    ),
    "processors": (
        "otel_ofu.processors.ofu",
        "otel_ofu.processors.attribution",
        "otel_ofu.processors.jobs",
    ),
    "exporters": (
        "otel_ofu.exporters.console",
        "otel_ofu.exporters.file",
        "otel_ofu.exporters.otlp",
        "otel_ofu.exporters.otlphttp",
        "otel_ofu.exporters.prometheus",
    ),
}


@functools.cache
def factories() -> dict[str, dict[str, Factory]]:
    out: dict[str, dict[str, Factory]] = {}
    for section, modules in COMPONENT_MODULES.items():
        table: dict[str, Factory] = {}
        for module_name in modules:
            factory: Factory = importlib.import_module(module_name).FACTORY
            if factory.type in table:
                raise RuntimeError(f"two {section} claim type '{factory.type}': {module_name}")
            table[factory.type] = factory
        out[section] = table
    return out
