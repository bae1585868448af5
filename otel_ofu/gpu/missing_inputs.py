"""The inputs every GPU window needs for OFU (tensor pipe activity, the SM clock): which are
missing from a source, and what to change there so that it sends them.

Why: a source that sends GPUs without one of them (a dcgm-exporter before 4.0, whose default
counters CSV has no profiling field, or a custom CSV without the tensor activity line) gives no
OFU, and otherwise only the drop counter (``gpu.ofu.dropped{ofu.drop.reason=missing}``) would say
so. Profiling metrics missing from the counters CSV is the most common misconfiguration; the
receivers say it once per source, at WARNING, with the fix (and again only after it came back and
went away). Some GPU sources can give no OFU whatever their settings (:data:`SOURCES_WITHOUT_OFU`:
an exporter of nvidia-smi's fields, the dcgm receiver's first metric names); the otlp receiver says
once per host what it got, what that lacks, and what to run instead.
"""

from __future__ import annotations

import threading

from otel_ofu.core.model import GpuSample
from otel_ofu.otlp.join.inputs import (
    DCGMRECEIVER_CLOCK,
    DCGMRECEIVER_PIPE,
    DCGMRECEIVER_PIPE_ATTR,
    DCGMRECEIVER_V1,
    NVIDIA_SMI_EXPORTER,
)

# The inputs a page must carry for OFU: (field, its name in dcgm-exporter's counters CSV, the
# CSV line that enables it, whether it is a profiling field), and the sample attribute holding it.
REQUIRED_INPUTS: tuple[tuple[str, str, str, bool], ...] = (
    ("tensor_active", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
     "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge, Ratio of cycles the tensor (HMMA) pipe is active.", True),
    ("sm_clock_mhz", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_SM_CLOCK, gauge, SM clock frequency (in MHz).", False),
)


def missing_inputs(samples: list[GpuSample]) -> list[str]:
    """The required inputs (counters CSV names) that no GPU entity of one page carries."""
    if not samples:
        return []
    return [name for attribute, name, _, _ in REQUIRED_INPUTS
            if all(getattr(sample, attribute) is None for sample in samples)]


def how_to_enable(name: str) -> str:
    """What to change in dcgm-exporter so that its page carries input ``name``."""
    line, profiling = next((line, prof) for _, n, line, prof in REQUIRED_INPUTS if n == name)
    text = (f"add the line '{line}' to dcgm-exporter's counters CSV (-f/--collectors, DCGM_EXPORTER_COLLECTORS; "
            "default /etc/dcgm-exporter/default-counters.csv)")
    if profiling:
        text += (", or run it with the CSV its image ships with the profiling fields: Helm chart value "
                 "arguments: [\"-f\", \"/etc/dcgm-exporter/dcp-metrics-included.csv\"], or the line in customMetrics "
                 "(GPU Operator: a ConfigMap named in dcgmExporter.config.name). Profiling fields need a datacenter "
                 "GPU (Volta or newer), and no other profiler (Nsight, a second DCGM) holding the counters")
    else:
        text += ", or in the Helm chart's customMetrics"
    return text


# The same inputs as the Collector's dcgm receiver names them (REFERENCE.md section 7).
_DCGMRECEIVER_METRICS = {"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": f"{DCGMRECEIVER_PIPE} ({DCGMRECEIVER_PIPE_ATTR}=tensor)",
                         "DCGM_FI_DEV_SM_CLOCK": DCGMRECEIVER_CLOCK}


def how_to_enable_dcgmreceiver(name: str) -> str:
    """What to change in the Collector's dcgm receiver so that it sends input ``name``."""
    return (f"enable its metric {_DCGMRECEIVER_METRICS[name]} (metrics: in the receiver's config; the profiling "
            "metrics need a datacenter GPU and no other profiler holding the counters)")


# GPU sources whose metrics make no OFU however they are set up (otel_ofu.otlp.join.inputs.NOTICED_METRICS):
# what they are, what they lack, and what to run instead.
SOURCES_WITHOUT_OFU: dict[str, tuple[str, str, str]] = {
    DCGMRECEIVER_V1: (
        "the Collector dcgm receiver's metrics as named up to 2024-09 (dcgm.gpu.*, dcgm.gpu.profiling.*: "
        "GoogleCloudPlatform/opentelemetry-operations-collector, its dcgm receiver version 1)",
        "they carry tensor pipe activity but no SM clock, and OFU is tensor activity x SM clock / the reference "
        "clock, so no OFU can be made from them",
        f"send the receiver's version 2 metrics, which carry the SM clock ({DCGMRECEIVER_CLOCK}) beside "
        f"{DCGMRECEIVER_PIPE}: in the Ops Agent (2.51.0 or newer) set receiver_version: 2 on its dcgm receiver; "
        "elsewhere run a Collector whose dcgm receiver is from 2024-09 or later"),
    NVIDIA_SMI_EXPORTER: (
        "nvidia_gpu_exporter's metrics (nvidia_smi_*: utkuozdemir/nvidia_gpu_exporter, nvidia-smi's query fields)",
        "they carry the SM clock but no tensor pipe activity (nvidia-smi has no such field; its per-MIG-instance "
        "GPM ratios are not read), so no OFU can be made from them",
        "run NVIDIA dcgm-exporter on the host with the profiling fields and have the Collector scrape it too: "
        + "add the line '" + REQUIRED_INPUTS[0][2] + "' to its counters CSV, or use the CSV its image ships, "
        "/etc/dcgm-exporter/dcp-metrics-included.csv (Helm chart value arguments: [\"-f\", "
        "\"/etc/dcgm-exporter/dcp-metrics-included.csv\"])"),
}


class MissingInputs:
    """Which required inputs each source (an endpoint, a host) lacked in what it last sent; thread-safe,
    bounded (a fleet's sources: full, it starts over, so a source still missing an input is said again)."""

    def __init__(self, max_sources: int = 4096):
        self.max_sources = max_sources
        self._missing: dict[str, list[str]] = {}
        self._said: set[tuple[str, str]] = set()  # (source, kind) said once (first_time)
        self._lock = threading.Lock()

    def first_time(self, source: str, kind: str) -> bool:
        """Whether ``source`` is seen sending ``kind`` for the first time (a GPU source that gives no OFU
        whatever it sends: said once, never "back"). Bounded as the rest: full, it starts over."""
        with self._lock:
            if (source, kind) in self._said:
                return False
            if len(self._said) >= self.max_sources:
                self._said.clear()
            self._said.add((source, kind))
            return True

    def note(self, source: str, samples: list[GpuSample]) -> tuple[list[str], list[str]]:
        """Record what ``samples`` (all the GPUs one source sent at once) lack; returns the inputs newly
        missing and those that came back."""
        missing = missing_inputs(samples)
        with self._lock:
            before = self._missing.get(source, [])
            if missing:
                if source not in self._missing and len(self._missing) >= self.max_sources:
                    self._missing.clear()
                self._missing[source] = missing
            else:
                self._missing.pop(source, None)
        return ([name for name in missing if name not in before],
                [name for name in before if name not in missing] if samples else [])

    def sources(self) -> set[str]:
        """The sources that lacked an input in what they last sent."""
        with self._lock:
            return set(self._missing)

    def fields(self) -> dict[str, list[str]]:
        """Source -> the required inputs it last lacked."""
        with self._lock:
            return {source: list(names) for source, names in self._missing.items()}
