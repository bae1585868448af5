"""otel-ofu: Overall FLOP Utilization of GPUs from hardware counters, as an OpenTelemetry pipeline."""

# The one place the version is written: pyproject.toml reads it (dynamic), the Helm chart's
# version and appVersion must equal it, the image is tagged with it (tests/test_version.py).
__version__ = "0.2.0"
