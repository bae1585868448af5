"""Fleet throughput: node-tier OTLP through the real gateway Collector into 1, then 2 otel-ofu jobs instances.

Why: the fleet topology (docs/fleet.md) scales the per-job work out over N jobs-tier instances
behind the OpenTelemetry Collector's load balancer. This measures, in one run on this machine:

- the gateway Collector forwarding the requests to sinks (collector-config/otelcol-gateway.yaml:
  it keeps what the jobs tier reads, of GPUs with a job, and routes it by job): its CPU per
  node-tier point, ``collector_passthrough_points_per_s_per_core``;
- the same requests through the same gateway into 1 and then 2 otel-ofu jobs-tier instances
  (``otel-ofu run`` with collector-config/fleet-jobs.yaml: decode, jobs processor with its
  on-disk state, the job series exported to a sink): their CPU per node-tier point
  (``ofu_points_per_s_per_core``), and the end-to-end rate (``points_per_s``, first request sent
  until the instances have decoded every point the gateway forwards).

The jobs tier sends only what it makes (the node agents send the GPUs' series themselves), so the
sinks cannot count its intake: each instance reports what it decoded (``otel_ofu.receiver.decoded``,
its self-telemetry every second instead of fleet-jobs.yaml's 30 s, nothing else changed), and a
run is complete when that adds up to what the gateway forwards. The end-to-end time is therefore
known to about a second.

The input is what node agents send: per node and 10 s window one request of its 8 GPUs'
points as the ``ofu`` processor makes them (job identity on the resource; a job spans 16
nodes; one GPU in ten has no job), generated before the clock starts. CPU is user+system
time from /proc/PID/stat. The load generator and the sinks run in this process on the same
cores: on a 2-core machine the processes compete, so ``scaling_1_to_2`` says more about the
machine than about otel-ofu there (the JSON records ``cores``).

    python benchmarks/fleet.py --json                 # 20,000 GPUs, 3 windows
    python benchmarks/fleet.py --gpus 100000 --json   # the 100k fleet (about 3 minutes)
    python benchmarks/fleet.py --direct --json        # the Helm chart's default: agents straight into one instance
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from otel_ofu.attribution.config import UNSET_JOBS  # noqa: E402
from otel_ofu.core.model import GpuSample, job_id_of  # noqa: E402
from otel_ofu.otlp import codec  # noqa: E402
from otel_ofu.pipeline.component import Context  # noqa: E402
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig  # noqa: E402

EXPORT = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
DECODED = "otel_ofu.receiver.decoded"  # a jobs instance's self-telemetry: points its otlp receiver decoded
GPUS_PER_NODE = 8
NODES_PER_JOB = 16
INTERVAL_S = 10
T0 = 1_767_225_600


def jobs_inputs() -> frozenset[str]:
    """The metrics the jobs tier decodes, which are all the gateway forwards (fleet-jobs.yaml)."""
    import yaml

    doc = yaml.safe_load((ROOT / "collector-config" / "fleet-jobs.yaml").read_text())
    return frozenset(doc["receivers"]["otlp"]["decode"])


def node_requests(gpus: int, windows: int) -> list[list[tuple[bytes, int, int]]]:
    """Per window, one (request, data points, points the gateway forwards) per node: what each node agent sends."""
    ofu = OfuProcessor(OfuProcessorConfig(), Context("ofu"))
    inputs = jobs_inputs()
    out = []
    for w in range(windows):
        requests = []
        for node in range(max(1, gpus // GPUS_PER_NODE)):
            points = []
            for g in range(GPUS_PER_NODE):
                idle = (node * GPUS_PER_NODE + g) % 10 == 9
                sample = GpuSample(
                    (T0 + INTERVAL_S * (w + 1)) * 10**9, float(INTERVAL_S), f"gpu-node-{node:05d}", g,
                    f"GPU-{node:05d}-{g}", "NVIDIA H100 80GB HBM3", 0.40 + 0.01 * ((node + g + w) % 10), 1755.0, 10,
                    1980.0, 610.0, 0, 0.93, source="dcgm", job_id=None if idle else f"job-{node // NODES_PER_JOB:05d}",
                    precision=None if idle else "bf16",
                    resource={"k8s.namespace.name": "llm", "k8s.pod.name": f"train-{node // NODES_PER_JOB}-{node}"})
                points += ofu.sample_points(sample)
            # The gateway's filter/keep_jobs drops a resource without a job (no ofu.job.id, "none", "unknown", "").
            forwarded = sum(1 for p in points if p.name in inputs and job_id_of(p) not in (None, *UNSET_JOBS))
            requests.append((codec.encode_request(points), len(points), forwarded))
        out.append(requests)
    return out


class Sink:
    """An OTLP/gRPC server that counts the data points it receives (the backend, or the gateway's targets),
    and keeps the latest otel_ofu.receiver.decoded of each jobs instance that reports to it."""

    def __init__(self) -> None:
        self.points = 0
        self.last = 0.0
        self.decoded: dict[str, float] = {}  # service.instance.id -> points its otlp receiver decoded
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                                  options=[("grpc.max_receive_message_length", 64 << 20)])
        handler = grpc.method_handlers_generic_handler(
            "opentelemetry.proto.collector.metrics.v1.MetricsService",
            {"Export": grpc.unary_unary_rpc_method_handler(self._export)})
        self.server.add_generic_rpc_handlers((handler,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def _export(self, body: bytes, context: object) -> bytes:
        request = ExportMetricsServiceRequest.FromString(body)
        n = sum(codec.count_data_points(rm) for rm in request.resource_metrics)
        decoded = {}
        for rm in request.resource_metrics:
            for metric in (m for sm in rm.scope_metrics for m in sm.metrics if m.name == DECODED):
                instance = next((a.value.string_value for a in rm.resource.attributes
                                 if a.key == "service.instance.id"), "")
                decoded[instance] = sum(dp.as_double or dp.as_int for dp in metric.sum.data_points)
        with self._lock:
            self.points += n
            self.last = time.monotonic()
            self.decoded.update(decoded)
        return b""

    def stop(self) -> None:
        self.server.stop(grace=None).wait()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(args, env={**os.environ, **env}, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            cwd=ROOT)


def send(port: int, windows: list[list[tuple[bytes, int, int]]], in_flight: int = 64) -> int:
    """Every request, ``in_flight`` at a time; a refused one (queue full) is sent again."""
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 64 << 20)])
    export = channel.unary_unary(EXPORT)
    sent = 0
    pending: list[tuple[object, bytes]] = []

    def drain(limit: int) -> None:
        while len(pending) > limit:
            future, body = pending.pop(0)
            while True:
                try:
                    future.result()  # type: ignore[attr-defined]
                    break
                except grpc.RpcError:
                    time.sleep(0.05)
                    future = export.future(body, timeout=60)
    for requests in windows:
        for body, n, _ in requests:
            pending.append((export.future(body, timeout=60), body))
            sent += n
            drain(in_flight)
    drain(0)
    channel.close()
    return sent


def jobs_tier_config(work: Path) -> Path:
    """collector-config/fleet-jobs.yaml with its self-telemetry every second (how the run knows it is done)."""
    import yaml

    doc = yaml.safe_load((ROOT / "collector-config" / "fleet-jobs.yaml").read_text())
    doc["receivers"]["selftelemetry"]["collection_interval"] = "1s"
    path = work / "fleet-jobs-1s.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def run_phase(otelcol: str, windows: list[list[tuple[bytes, int, int]]], instances: int | None, work: Path) -> dict:
    """instances None: the gateway into two sinks; else into that many otel-ofu jobs instances."""
    procs: list[subprocess.Popen] = []
    sinks: list[Sink] = []
    try:
        targets: list[int] = []
        ofu: list[subprocess.Popen] = []
        if instances is None:
            sinks = [Sink(), Sink()]
            targets = [s.port for s in sinks]
        else:
            sinks = [Sink()]
            config = jobs_tier_config(work)
            for i in range(instances):
                port = free_port()
                proc = start([sys.executable, "-m", "otel_ofu", "run", "--config", str(config)],
                             {"OFU_JOBS_GRPC_ENDPOINT": f"127.0.0.1:{port}",
                              "OFU_BACKEND_ENDPOINT": f"127.0.0.1:{sinks[0].port}",
                              "OFU_STATE_DIR": str(work / f"jobs-{instances}-{i}")}, work / f"jobs-{instances}-{i}.log")
                procs.append(proc)
                ofu.append(proc)
                wait_port(port, proc)
                targets.append(port)
        gateway_port = free_port()
        gateway = start([otelcol, f"--config=file:{ROOT / 'collector-config' / 'otelcol-gateway.yaml'}"],
                        {"OFU_JOBS_ENDPOINTS": "[" + ", ".join(f"127.0.0.1:{p}" for p in targets) + "]",
                         "OFU_GATEWAY_GRPC_ENDPOINT": f"127.0.0.1:{gateway_port}",
                         "OFU_GATEWAY_HTTP_ENDPOINT": f"127.0.0.1:{free_port()}",
                         "OFU_GATEWAY_HEALTH_ENDPOINT": f"127.0.0.1:{free_port()}",
                         "OFU_GATEWAY_BATCH_TIMEOUT": "200ms"}, work / f"gateway-{instances}.log")
        procs.append(gateway)
        wait_port(gateway_port, gateway)
        cpu0 = {p.pid: cpu_seconds(p.pid) for p in procs}
        t0 = time.monotonic()
        sent = send(gateway_port, windows)
        forwarded = sum(f for requests in windows for _, _, f in requests)

        def arrived() -> float:  # at the sinks, or decoded by the jobs instances
            return sum(s.points for s in sinks) if instances is None else sum(sinks[0].decoded.values())

        deadline = time.monotonic() + 600
        while arrived() < forwarded and time.monotonic() < deadline:
            time.sleep(0.05)
        received = arrived()
        wall = max(max(s.last for s in sinks) - t0, 1e-3)
        tick = 1 / os.sysconf("SC_CLK_TCK")  # a tiny run may not use one tick: no division by zero
        cpu = {p.pid: max(cpu_seconds(p.pid) - cpu0[p.pid], tick) for p in procs}
        return {"instances": instances or 0, "points": sent, "forwarded": forwarded, "received": received,
                "wall_s": wall,
                "points_per_s": sent / wall, "gateway_cpu_s": cpu[gateway.pid],
                "ofu_cpu_s": sum(cpu[p.pid] for p in ofu)}
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        for sink in sinks:
            sink.stop()


def chart_jobs_config(port: int, metrics_port: int, work: Path) -> Path:
    """The Helm chart's default jobs instance (no gateway): fleet-jobs.yaml's intake and jobs processor,
    taking only what the jobs processor reads and passing on only what it makes, no state on disk,
    served to Prometheus (deploy/helm/otel-ofu/templates/_config.tpl)."""
    import yaml

    doc = yaml.safe_load((ROOT / "collector-config" / "fleet-jobs.yaml").read_text())
    doc["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"] = f"127.0.0.1:{port}"
    doc["receivers"]["otlp"]["passthrough"] = False
    doc["processors"]["jobs"].pop("storage", None)
    doc["processors"]["jobs"]["passthrough"] = False
    doc["exporters"] = {"prometheus": {"endpoint": f"127.0.0.1:{metrics_port}", "metric_expiration": "5m"}}
    for pipeline in doc["service"]["pipelines"].values():
        pipeline["exporters"] = ["prometheus"]
    path = work / "chart-jobs.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def run_direct(windows: list[list[tuple[bytes, int, int]]], work: Path) -> dict:
    """The chart's default: every node agent's request straight to the one jobs instance (no gateway).

    Each request is one node's window (8 GPUs), as agents send them; the instance acknowledges a
    request once it has processed it, so the run ends when the last is acknowledged.
    """
    port, metrics_port = free_port(), free_port()
    config = chart_jobs_config(port, metrics_port, work)
    proc = start([sys.executable, "-m", "otel_ofu", "run", "--config", str(config)], {}, work / "jobs-direct.log")
    try:
        wait_port(port, proc)
        cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
        sent = send(port, windows)
        wall = time.monotonic() - t0
        cpu = max(cpu_seconds(proc.pid) - cpu0, 1 / os.sysconf("SC_CLK_TCK"))
        return {"points": sent, "requests": sum(len(w) for w in windows), "wall_s": wall, "ofu_cpu_s": cpu,
                "points_per_s_per_core": sent / cpu}
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=20_000)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--direct", action="store_true",
                        help="only the Helm chart's default: the agents' requests straight into one jobs instance")
    args = parser.parse_args(argv)
    if args.direct:
        windows = node_requests(args.gpus, args.windows)
        with tempfile.TemporaryDirectory(prefix="ofu-fleet-") as tmp:
            direct = run_direct(windows, Path(tmp))
        out = {"gpus": args.gpus, "windows": args.windows, "cores": os.cpu_count(), **direct,
               "jobs_instance_gpus_per_core_at_10s": args.gpus * args.windows * INTERVAL_S / direct["ofu_cpu_s"]}
        if args.json:
            json.dump(out, sys.stdout)
            print()
        else:
            print(f"direct: {args.gpus:,} GPUs x {args.windows} windows = {direct['points']:,} points in "
                  f"{direct['requests']:,} requests: {direct['points_per_s_per_core']:,.0f} points per CPU-second, "
                  f"{out['jobs_instance_gpus_per_core_at_10s']:,.0f} GPUs per core at 10 s")
        return 0
    otelcol = os.environ.get("OTELCOL") or subprocess.run(
        [str(ROOT / "collector" / "build.sh")], capture_output=True, text=True,
        check=True).stdout.strip().splitlines()[-1]
    t = time.perf_counter()
    windows = node_requests(args.gpus, args.windows)
    generate_s = time.perf_counter() - t
    with tempfile.TemporaryDirectory(prefix="ofu-fleet-") as tmp:
        work = Path(tmp)
        collector = run_phase(otelcol, windows, None, work)
        one = run_phase(otelcol, windows, 1, work)
        two = run_phase(otelcol, windows, 2, work)
    points = collector["points"]
    collector_rate = points / collector["gateway_cpu_s"]
    ofu_rate = points / one["ofu_cpu_s"]
    out = {
        "gpus": args.gpus, "windows": args.windows, "instances": [1, 2], "cores": os.cpu_count(), "points": points,
        "points_per_s": {"1": one["points_per_s"], "2": two["points_per_s"]},
        "ofu_points_per_s_per_core": ofu_rate,
        "ofu_points_per_s_per_core_2_instances": points / two["ofu_cpu_s"],
        "collector_passthrough_points_per_s_per_core": collector_rate,
        "ratio_to_collector": ofu_rate / collector_rate,
        "scaling_1_to_2": two["points_per_s"] / one["points_per_s"],
        "jobs_tier_gpus_per_core_at_10s": args.gpus * args.windows * INTERVAL_S / one["ofu_cpu_s"],
        "gateway_gpus_per_core_at_10s": args.gpus * args.windows * INTERVAL_S / one["gateway_cpu_s"],
        "phases": {"collector_to_sinks": collector, "one_instance": one, "two_instances": two},
        "generate_s": generate_s,
        "forwarded": collector["forwarded"],
        "complete": all(p["received"] >= p["forwarded"] for p in (collector, one, two)),
    }
    if args.json:
        json.dump(out, sys.stdout)
        print()
        return 0
    print(f"fleet: {args.gpus:,} GPUs x {args.windows} windows = {points:,} points, {os.cpu_count()} cores")
    print(f"  gateway pass-through : {collector_rate:12,.0f} points per CPU-second")
    print(f"  otel-ofu jobs tier   : {ofu_rate:12,.0f} points per CPU-second (ratio {out['ratio_to_collector']:.2f})")
    print(f"  end to end           : 1 instance {one['points_per_s']:,.0f} points/s, 2 instances "
          f"{two['points_per_s']:,.0f} points/s (scaling {out['scaling_1_to_2']:.2f})")
    print(f"  jobs tier {out['jobs_tier_gpus_per_core_at_10s']:,.0f} GPUs per core at 10 s; gateway "
          f"{out['gateway_gpus_per_core_at_10s']:,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
