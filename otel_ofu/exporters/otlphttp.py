"""The ``otlphttp`` exporter: :mod:`otel_ofu.otlp.exporter` over OTLP/HTTP (protobuf)."""

from otel_ofu.otlp.exporter import OtlpHttpExporter
from otel_ofu.otlp.exporter_config import OtlpHttpExporterConfig
from otel_ofu.pipeline.component import Factory

FACTORY = Factory("otlphttp", OtlpHttpExporterConfig, OtlpHttpExporter,
                  "sends OTLP/HTTP protobuf, with a retrying, optionally on-disk queue")
