"""Throughput: OTLP requests of dcgm-exporter metrics through decode, join, attribution, OFU, encode.

Why: we claim one core keeps up with a 100,000-GPU fleet at a 10 s interval. The input is
what a Collector's prometheus receiver (scraping dcgm-exporter on every node, batch
processor of 8192 points) sends to otel-ofu's OTLP receiver: per node one ResourceMetrics
(scrape-target resource, the receiver's scope), per GPU TPA, SM clock and 20 other DCGM
fields with dcgm-exporter's labels (gpu, UUID, pci_bus_id, device, modelName, Hostname,
driver version, pod, namespace, container), plus the scrape's own series (up, ...).

Each request goes through the real code, as the otlp receiver and exporter run it:
``ExportMetricsServiceRequest.FromString`` -> ``otlp_join.split_request`` (join; the other
fields pass through untouched, cut from the received bytes) -> the ``attribution``
processor (job from the pod labels) -> the ``ofu`` processor with the settings of
``collector-config/processor-stage.yaml`` -> the OTLP exporter's encoding
(``otlp_encoding.metrics_payload``). In the same loop, on the same bytes, the floor:
protobuf decode + re-encode alone. Requests are generated one at a time outside the timed
region, so N = 100,000 needs no gigabytes.

    python benchmarks/throughput.py                  # N = 1,000 and 100,000, 2 intervals each (a few minutes)
    python benchmarks/throughput.py --quick --json   # N = 1,000 only, 1 repetition
    python benchmarks/throughput.py --profile        # cProfile the pipeline's last interval on N = 1,000
    python benchmarks/throughput.py --gpus 1000 --loss-cost   # also without the loss account, alternating
    python benchmarks/throughput.py --gpus 100000 --no-loss   # without it only (compare with a run with it)

Each size runs ``--intervals`` intervals of the same fleet (the same GPUs and labels, new
readings, the metrics in a new order each scrape as the Collector's receiver makes them); the
figures are the last interval's, the steady state, with the first (everything new) beside them.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import random
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AGGREGATION_TEMPORALITY_CUMULATIVE, ResourceMetrics

from otel_ofu.cli.run import tune_runtime
from otel_ofu.core.model import Batch
from otel_ofu.otlp import codec as otlp
from otel_ofu.otlp import join as otlp_join
from otel_ofu.otlp.payload import count_data_points, metrics_payload
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import build_config
from otel_ofu.processors.attribution import FACTORY as ATTRIBUTION
from otel_ofu.processors.ofu import FACTORY as OFU

ROOT = Path(__file__).resolve().parent.parent
# The ofu processor's settings in the shipped processing-stage config (otel-ofu behind a Collector).
OFU_SETTINGS: dict = yaml.safe_load((ROOT / "collector-config" / "processor-stage.yaml").read_text())[
    "processors"]["ofu"]
GPUS_PER_NODE = 8
BATCH_POINTS = 8192  # the Collector batch processor's send_batch_size default
INTERVAL_S = 10.0
SCOPE = "github.com/open-telemetry/opentelemetry-collector-contrib/receiver/prometheusreceiver"

# dcgm-exporter's default counters (name, counter?, typical value); TPA and SM clock are the inputs.
FIELDS: tuple[tuple[str, bool, float], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", False, 1755.0), ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", False, 0.45),
    ("DCGM_FI_DEV_MEM_CLOCK", False, 2619.0), ("DCGM_FI_DEV_MEMORY_TEMP", False, 41.0),
    ("DCGM_FI_DEV_GPU_TEMP", False, 58.0), ("DCGM_FI_DEV_POWER_USAGE", False, 612.4),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", True, 8.1e9), ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", True, 0.0),
    ("DCGM_FI_DEV_GPU_UTIL", False, 100.0), ("DCGM_FI_DEV_MEM_COPY_UTIL", False, 38.0),
    ("DCGM_FI_DEV_ENC_UTIL", False, 0.0), ("DCGM_FI_DEV_DEC_UTIL", False, 0.0),
    ("DCGM_FI_DEV_XID_ERRORS", False, 0.0), ("DCGM_FI_DEV_FB_FREE", False, 9000.0),
    ("DCGM_FI_DEV_FB_USED", False, 72000.0), ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", True, 3.2e12),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", True, 0.0), ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", True, 0.0),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", False, 0.98), ("DCGM_FI_PROF_SM_ACTIVE", False, 0.93),
    ("DCGM_FI_PROF_DRAM_ACTIVE", False, 0.41), ("DCGM_FI_PROF_PCIE_TX_BYTES", False, 1.2e8),
)
TYPICAL = {name: typical for name, _, typical in FIELDS}
_NESTED = ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE")
SCRAPE_SERIES = ("up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_samples_post_metric_relabeling",
                 "scrape_series_added")
POINTS_PER_NODE = GPUS_PER_NODE * len(FIELDS) + len(SCRAPE_SERIES)


def _kv(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def node_metrics(node: int, t_ns: int, rng: random.Random, seed: int = 7) -> ResourceMetrics:
    """One dcgm-exporter scrape of one 8-GPU node, as the prometheus receiver emits it.

    The node's GPUs (UUIDs, labels) are the same in every interval; values vary, and so does the
    order of the metrics (the receiver builds them from a Go map: no two scrapes alike).
    """
    host = f"gpu-node-{node:05d}"
    rm = ResourceMetrics()
    rm.resource.attributes.extend([_kv("service.name", "dcgm-exporter"), _kv("service.instance.id", f"{host}:9400"),
                                   _kv("server.address", host), _kv("server.port", "9400"),
                                   _kv("url.scheme", "http")])
    sm = rm.scope_metrics.add()
    sm.scope.name = SCOPE
    sm.scope.version = "0.115.0"
    pod = f"train-{node // 4:05d}-worker-{node % 4}"  # a job spans 4 nodes (32 GPUs)
    identity = random.Random(seed * 1_000_003 + node)
    labels = []
    for g in range(GPUS_PER_NODE):
        h = f"{identity.getrandbits(128):032x}"
        labels.append([
            _kv("gpu", str(g)), _kv("UUID", f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"),
            _kv("pci_bus_id", f"00000000:{0x18 + 0x10 * g:02X}:00.0"), _kv("device", f"nvidia{g}"),
            _kv("modelName", "NVIDIA H100 80GB HBM3"), _kv("Hostname", host),
            _kv("DCGM_FI_DRIVER_VERSION", "550.90.07"), _kv("pod", pod), _kv("namespace", "llm-pretrain"),
            _kv("container", "pytorch"),
        ])
    fields = list(FIELDS)
    rng.shuffle(fields)
    readings = {name: [typical * (0.9 + 0.2 * rng.random()) if typical else 0.0 for _ in range(GPUS_PER_NODE)]
                for name, _, typical in fields}
    # The activity ratios nest as on a GPU (a tensor cycle is an SM cycle is an engine cycle): each
    # level is the one below plus its own varying share, at most 1.
    below = readings[_NESTED[0]]
    for name in _NESTED[1:]:
        gap = TYPICAL[name] - TYPICAL[_NESTED[_NESTED.index(name) - 1]]
        below = readings[name] = [min(1.0, b + gap * (0.9 + 0.2 * rng.random())) for b in below]
    for name, counter, _ in fields:
        metric = sm.metrics.add(name=name)
        if counter:
            metric.sum.aggregation_temporality = AGGREGATION_TEMPORALITY_CUMULATIVE
            metric.sum.is_monotonic = True
            points = metric.sum.data_points
        else:
            points = metric.gauge.data_points
        for g in range(GPUS_PER_NODE):
            value = readings[name][g]
            if name == "DCGM_FI_DEV_SM_CLOCK":
                value = float(round(value / 15) * 15)
            dp = points.add(time_unix_nano=t_ns, as_double=value)
            if counter:
                dp.start_time_unix_nano = START_NS
            dp.attributes.extend(labels[g])
    for name in SCRAPE_SERIES:
        sm.metrics.add(name=name).gauge.data_points.add(time_unix_nano=t_ns, as_double=1.0)
    return rm


START_NS = 1_764_000_000 * 10**9 - 3600 * 10**9  # the counters' start (the exporter's start)


def requests_for(gpus: int, seed: int, interval: int = 0) -> Iterator[tuple[bytes, int]]:
    """Serialized requests for a fleet of ``gpus`` GPUs in one interval, batched as a Collector would,
    with point counts. Interval ``k`` is the fleet 10 s x k later: the same GPUs, new readings."""
    rng = random.Random(seed * 1_000_003 + interval)
    nodes = max(1, gpus // GPUS_PER_NODE)
    per_request = max(1, BATCH_POINTS // POINTS_PER_NODE + (BATCH_POINTS % POINTS_PER_NODE > 0))
    t_ns = 1_764_000_000 * 10**9 + int(INTERVAL_S * 1e9) * interval
    for first in range(0, nodes, per_request):
        request = ExportMetricsServiceRequest()
        count = min(per_request, nodes - first)
        request.resource_metrics.extend(node_metrics(n, t_ns, rng, seed) for n in range(first, first + count))
        yield request.SerializeToString(), count * POINTS_PER_NODE


@dataclass
class Pipeline:
    """The otel-ofu path for one request, timed by stage: what the otlp receiver and exporter run."""

    attribution: object
    ofu: object
    stages: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("decode", "join", "attribution", "ofu", "encode"), 0.0))
    samples: int = 0
    points_out: int = 0

    @classmethod
    def build(cls, loss: bool = True) -> Pipeline:
        """The processors as collector-config/processor-stage.yaml sets them (OFU_SETTINGS), plus attribution;
        ``loss=False``: without the loss account (the ofu processor's ``loss.enabled: false``)."""
        attribution = ATTRIBUTION.create(build_config(ATTRIBUTION.config_type, {"max_jobs": 100_000}),
                                         Context("attribution"))
        settings = OFU_SETTINGS if loss else {**OFU_SETTINGS, "loss": {**OFU_SETTINGS.get("loss", {}),
                                                                         "enabled": False}}
        ofu = OFU.create(build_config(OFU.config_type, settings), Context("ofu"))
        return cls(attribution, ofu)

    @staticmethod
    def split(body: bytes) -> tuple[ExportMetricsServiceRequest, list, list]:
        """Decode, then join; the pass-through is cut from ``body`` as the otlp receiver does."""
        request = ExportMetricsServiceRequest.FromString(body)
        samples, rest = otlp_join.split_request(request, window_s=30.0, tolerance_s=5.0, wire=body)
        return request, samples, rest

    def check(self, body: bytes) -> list[str]:
        """Untimed: the encoded output must hold every point the stages produced (nothing lost)."""
        _, samples, rest = self.split(body)
        batch = self.ofu.process(self.attribution.process(  # type: ignore[attr-defined]
            Batch(samples=samples, passthrough=list(rest))))
        payload = metrics_payload(batch.points, batch.passthrough)
        problems = []
        if payload is None:
            return ["the pipeline produced nothing"]
        decoded = ExportMetricsServiceRequest.FromString(payload[0])
        actual = sum(count_data_points(r) for r in decoded.resource_metrics)
        if actual != payload[1]:
            problems.append(f"encoded request holds {actual} data points but {payload[1]} were produced "
                            f"({payload[1] - actual} lost in encoding)")
        expected = len(batch.points) + sum(count_data_points(r) for r in otlp.passthrough_messages(batch.passthrough))
        if actual != expected:
            problems.append(f"encoded request holds {actual} data points, expected {expected}")
        ofu_points = sum(1 for p in batch.points if p.name == "gpu.ofu")
        if ofu_points != len(samples):
            problems.append(f"{len(samples)} GPU samples joined but {ofu_points} gpu.ofu points")
        return problems

    def run(self, body: bytes) -> float:
        t0 = time.perf_counter()
        request = ExportMetricsServiceRequest.FromString(body)
        t1 = time.perf_counter()
        samples, rest = otlp_join.split_request(request, window_s=30.0, tolerance_s=5.0, wire=body)
        t2 = time.perf_counter()
        batch = self.attribution.process(Batch(samples=samples, passthrough=list(rest)))  # type: ignore[attr-defined]
        t3 = time.perf_counter()
        batch = self.ofu.process(batch)  # type: ignore[attr-defined]
        t4 = time.perf_counter()
        payload = metrics_payload(batch.points_and_rows(), batch.passthrough)  # as the otlp exporters do
        t5 = time.perf_counter()
        for stage, dt in zip(self.stages, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
            self.stages[stage] += dt
        self.samples += len(samples)
        self.points_out += payload[1] if payload else 0
        return t5 - t0


def floor(body: bytes) -> float:
    """The floor for any Python stage: protobuf decode and re-encode of the same request."""
    t0 = time.perf_counter()
    ExportMetricsServiceRequest.FromString(body).SerializeToString()
    return time.perf_counter() - t0


def measure(gpus: int, reps: int, seed: int, intervals: int = 2, loss_cost: bool = False, loss: bool = True) -> dict:
    """``intervals`` intervals of the fleet through one pipeline; per request ``reps`` alternating
    floor/pipeline runs, the median of each. The headline figures are the last interval's: one
    core keeping up is about the steady state, when the pipeline has seen the fleet before; the
    first interval (everything new: labels, identities, resources) is reported beside them.
    ``loss_cost``: a second pipeline without the loss account runs in the same alternation, on the
    same requests, so the two rates are measured back to back on the same machine state. The two
    share the encoder's caches (by resource and point count), which hold one 100,000-GPU fleet: at
    that size compare two runs, one with ``loss=False``, instead.
    """
    pipeline = Pipeline.build(loss)
    plain = Pipeline.build(loss=False) if loss_cost else None
    problems: list[str] = []
    generate = 0.0
    runs = []
    for interval in range(intervals):
        points = requests_n = samples = points_out = 0
        ofu_times: list[float] = []
        floor_times: list[float] = []
        plain_times: list[float] = []
        stages = dict(pipeline.stages)
        t_gen = time.perf_counter()
        for body, n in requests_for(gpus, seed, interval):
            generate += time.perf_counter() - t_gen
            if interval == 0 and requests_n == 0:
                problems = Pipeline.build().check(body)
            f, o, w = [], [], []
            before = pipeline.samples, pipeline.points_out
            for _ in range(reps):
                f.append(floor(body))
                o.append(pipeline.run(body))
                if plain is not None:
                    w.append(plain.run(body))
            if w:
                plain_times.append(statistics.median(w))
            samples += (pipeline.samples - before[0]) // reps
            points_out += (pipeline.points_out - before[1]) // reps
            floor_times.append(statistics.median(f))
            ofu_times.append(statistics.median(o))
            points += n
            requests_n += 1
            t_gen = time.perf_counter()
        ofu_total, floor_total = sum(ofu_times), sum(floor_times)
        runs.append({"ofu_s": ofu_total, "floor_s": floor_total, "plain_s": sum(plain_times), "points": points,
                     "requests": requests_n,
                     "samples": samples, "points_out": points_out,
                     "stage_share": {k: (v - stages[k]) / reps / ofu_total for k, v in pipeline.stages.items()}})
    last, first = runs[-1], runs[0]
    ofu_total, floor_total, points = last["ofu_s"], last["floor_s"], last["points"]
    ofu_rate, floor_rate = points / ofu_total, points / floor_total
    return {
        "gpus": gpus, "loss_account": loss, "intervals": intervals, "requests": last["requests"], "points_in": points,
        "points_per_request": points / last["requests"], "reps": reps, "ofu_points_per_s": ofu_rate,
        "floor_points_per_s": floor_rate, "ratio": ofu_rate / floor_rate,
        "ofu_s_per_interval": ofu_total, "floor_s_per_interval": floor_total,
        "gpus_per_core_at_10s": gpus * INTERVAL_S / ofu_total, "keeps_up_at_10s": ofu_total < INTERVAL_S,
        "headroom_at_10s": INTERVAL_S / ofu_total,
        "first_interval_s": first["ofu_s"], "first_interval_ratio": first["floor_s"] / first["ofu_s"],
        "samples_joined": last["samples"], "points_out": last["points_out"],
        "stage_share": last["stage_share"], "generate_s": generate, "output_problems": problems,
        **({"without_loss_points_per_s": points / last["plain_s"],
            "loss_cost": 1.0 - last["plain_s"] / ofu_total} if plain is not None else {}),
    }


def profile(gpus: int, seed: int, intervals: int = 2, top: int = 18) -> str:
    """cProfile of the pipeline over the last of ``intervals`` intervals (the steady state)."""
    pipeline = Pipeline.build()
    for interval in range(intervals - 1):
        for body, _ in requests_for(gpus, seed, interval):
            pipeline.run(body)
    bodies = [b for b, _ in requests_for(gpus, seed, intervals - 1)]
    prof = cProfile.Profile()
    prof.enable()
    for body in bodies:
        pipeline.run(body)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=None, help="fleet sizes (default 1000 100000)")
    parser.add_argument("--reps", type=int, default=None, help="repetitions per request (default 5, 1 above 10k GPUs)")
    parser.add_argument("--quick", action="store_true", help="N = 1,000 only, 1 repetition")
    parser.add_argument("--profile", action="store_true", help="also cProfile the pipeline on the first N")
    parser.add_argument("--intervals", type=int, default=2,
                        help="intervals of the same fleet; figures are the last one's (default 2: first sight, steady)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--loss-cost", action="store_true",
                        help="also run the pipeline without the loss account, alternating on the same requests "
                             "(up to about 50,000 GPUs: two pipelines fill the encoder's caches twice)")
    parser.add_argument("--no-loss", action="store_true",
                        help="the ofu processor without its loss account (loss.enabled: false) only")
    args = parser.parse_args(argv)
    tune_runtime()  # as `otel-ofu run` does
    sizes = args.gpus or ([1000] if args.quick else [1000, 100_000])
    runs = []
    for n in sizes:
        reps = args.reps or (1 if args.quick or n > 10_000 else 5)
        runs.append(measure(n, reps, args.seed, max(1, args.intervals), args.loss_cost, not args.no_loss))
    headline = runs[-1]
    out = {"ofu_points_per_s": headline["ofu_points_per_s"], "floor_points_per_s": headline["floor_points_per_s"],
           "ratio": headline["ratio"], "gpus": headline["gpus"], "ratio_target_met": headline["ratio"] >= 0.5,
           "keeps_up_100k_at_10s": next((r["keeps_up_at_10s"] for r in runs if r["gpus"] >= 100_000), None),
           "headroom_100k_at_10s": next((r["headroom_at_10s"] for r in runs if r["gpus"] >= 100_000), None),
           "output_ok": not any(r["output_problems"] for r in runs), "runs": runs}
    prof_text = profile(sizes[0], args.seed, max(1, args.intervals)) if args.profile else ""
    if args.json:
        if prof_text:
            out["profile"] = prof_text
        json.dump(out, sys.stdout)
        print()
        return 0
    print(f"throughput: {POINTS_PER_NODE} points per 8-GPU node ({len(FIELDS)} DCGM fields per GPU + "
          f"{len(SCRAPE_SERIES)} scrape series), requests of ~{BATCH_POINTS} points")
    for r in runs:
        print(f"\nN = {r['gpus']:,} GPUs: {r['requests']} requests, {r['points_in']:,} points per interval, "
              f"{r['reps']} rep(s); interval {r['intervals']} of {r['intervals']} (the first: "
              f"{r['first_interval_s']:.2f} s)")
        print(f"  otel-ofu : {r['ofu_points_per_s']:12,.0f} points/s  ({r['ofu_s_per_interval']:.2f} s per interval, "
              f"headroom {r['headroom_at_10s']:.2f}x at 10 s)")
        print(f"  floor    : {r['floor_points_per_s']:12,.0f} points/s  ({r['floor_s_per_interval']:.2f} s)")
        print(f"  ratio    : {r['ratio']:.3f}   one core at 10 s: {r['gpus_per_core_at_10s']:,.0f} GPUs "
              f"({'keeps up' if r['keeps_up_at_10s'] else 'does NOT keep up'} with N)")
        print("  stages   : " + ", ".join(f"{k} {100 * v:.0f} %" for k, v in r["stage_share"].items()))
        print(f"  joined {r['samples_joined']:,} GPU samples, {r['points_out']:,} points out")
        if "loss_cost" in r:
            print(f"  without the loss account: {r['without_loss_points_per_s']:,.0f} points/s; the loss account "
                  f"costs {100 * r['loss_cost']:.1f} % of the stage's time")
        for problem in r["output_problems"]:
            print(f"  OUTPUT PROBLEM: {problem}")
    print(f"\ntarget ratio >= 0.5: {'met' if out['ratio_target_met'] else 'MISSED'} ({out['ratio']:.3f})")
    if out["headroom_100k_at_10s"] is not None:
        headroom = out["headroom_100k_at_10s"]
        print(f"target one core keeps up with 100,000 GPUs at 10 s with 2x headroom: "
              f"{'met' if headroom >= 2 else 'MISSED'} ({headroom:.2f}x)")
    if prof_text:
        print("\n" + prof_text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
