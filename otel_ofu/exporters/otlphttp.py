"""The ``otlphttp`` exporter: :mod:`otel_ofu.exporters.otlp` over OTLP/HTTP (protobuf).

Its own module only because the registry wants one FACTORY per module.
"""

from otel_ofu.exporters.otlp import HTTP_FACTORY

FACTORY = HTTP_FACTORY
