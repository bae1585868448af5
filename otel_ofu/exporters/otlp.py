"""The ``otlp`` exporter: metrics and events out over OTLP/gRPC (:mod:`otel_ofu.otlp.exporter`)."""

from otel_ofu.otlp.exporter import OtlpExporter
from otel_ofu.otlp.exporter_config import OtlpExporterConfig
from otel_ofu.pipeline.component import Factory

FACTORY = Factory("otlp", OtlpExporterConfig, OtlpExporter,
                  "sends OTLP/gRPC, with a retrying, optionally on-disk queue")
