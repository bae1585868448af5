"""otel-ofu: Overall FLOP Utilization of GPUs from hardware counters, as an OpenTelemetry pipeline."""

__version__ = "0.1.0"
