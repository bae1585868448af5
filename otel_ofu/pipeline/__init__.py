"""The runtime, after the OpenTelemetry Collector's service: the component model
(:mod:`.component`), the one config loader (:mod:`.config`), the component registry
(:mod:`.registry`), self-telemetry (:mod:`.telemetry`) and the service that wires pipelines
from YAML and owns their lifecycle (:mod:`.service`).
"""
