"""Overload: the real Collector sends otel-ofu 10x what it can process, then normal load.

Topology (all on loopback, each its own process):

    load generator --OTLP/gRPC--> Collector (otlp receiver; otlp exporter with its own
    retry_on_failure and sending_queue) --OTLP/gRPC--> otel-ofu (otlp receiver with
    max_concurrent_requests and a memory limiter; ofu processor; otlp exporter, queue in
    bytes) --OTLP/gRPC--> an independent sink that counts every point (benchmarks/otlp_sink.py)

1. capacity: the generator sends straight to otel-ofu, ``max_concurrent_requests`` at a time,
   for ``--capacity-s``: requests per second otel-ofu takes;
2. overload: 10x that rate into the Collector for ``--overload-s`` (60 s);
3. normal load: half the capacity for ``--normal-s``; then the generator stops and everything
   drains.

Every request carries a resource attribute ``bench.request``; its pass-through points (power
and temperature, which otel-ofu forwards unchanged) must reach the sink exactly once, unless
the Collector counted the request as dropped by its own queue policy. Prints ``peak_rss_mb``
(otel-ofu's VmHWM), ``limit_mb`` (its memory limiter's hard limit), ``accepted``/``refused``
(requests at otel-ofu's receiver, by outcome), ``delivered`` (requests whose points all
reached the sink), ``lost`` (accepted by the Collector, neither delivered nor counted as
dropped by it: must be 0), ``duplicates`` and ``recovery_s`` (from the end of the overload
until otel-ofu takes everything again and the Collector's queue is empty).

    OTELCOL=$(collector/build.sh | tail -1) .venv/bin/python benchmarks/overload.py --json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools.ports import free_ports, port_open  # noqa: E402

GPUS_PER_REQUEST = int(os.environ.get("OVERLOAD_GPUS_PER_REQUEST", "256"))  # set by --gpus (children read it)
PASS_THROUGH = ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP")
EXPORT = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"


_TEMPLATE_T = 1_700_000_000_123_456_789
_TEMPLATE_TAG = b"TAG=#########"


@functools.lru_cache(maxsize=1)
def _template() -> bytes:
    """A dcgm-exporter request (as the Collector's Prometheus receiver sends it) with a placeholder
    tag and time: building each request from it is a byte substitution, so the generator is never
    what limits the rate."""
    from tests.otlp_shapes import Gpu, dcgm_exporter_request

    gpus = [Gpu(i, f"GPU-{i:04x}", 0.3 + (i % 7) / 10, 1500.0 + i) for i in range(GPUS_PER_REQUEST)]
    request = dcgm_exporter_request(gpus, _TEMPLATE_T, host="node-1")
    for rm in request.resource_metrics:
        kv = rm.resource.attributes.add(key="bench.request")
        kv.value.string_value = _TEMPLATE_TAG.decode()
    return request.SerializeToString()


def make_request(n: int, t_ns: int) -> bytes:
    """Request number ``n``: its tag (bench.request) and every point's time are its own."""
    body = _template().replace(_TEMPLATE_TAG, f"{n:013d}".encode())
    return body.replace(struct.pack("<Q", _TEMPLATE_T), struct.pack("<Q", t_ns))


def pass_through_points(body: bytes) -> int:
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    request = ExportMetricsServiceRequest.FromString(body)
    return sum(len(m.gauge.data_points) for rm in request.resource_metrics for sm in rm.scope_metrics
               for m in sm.metrics if m.name in PASS_THROUGH)


class Generator:
    """Sends numbered requests to a gRPC target: closed loop (capacity) or at a paced rate."""

    def __init__(self, target: str):
        import grpc

        self._grpc = grpc
        self.target = target
        self.channel = grpc.insecure_channel(target, options=[("grpc.max_send_message_length", 64 << 20)])
        self.call = self.channel.unary_unary(EXPORT)
        self.lock = threading.Lock()
        self.next = 0
        self.ok: list[int] = []
        self.failed: dict[str, int] = {}
        self.t0 = 1_767_225_600_000_000_000

    def one(self) -> bool:
        with self.lock:
            n = self.next
            self.next += 1
        body = make_request(n, self.t0 + n * 1_000_000)
        try:
            self.call(body, timeout=30)
        except self._grpc.RpcError as exc:
            with self.lock:
                self.failed[exc.code().name] = self.failed.get(exc.code().name, 0) + 1
            return False
        with self.lock:
            self.ok.append(n)
        return True

    def closed_loop(self, workers: int, seconds: float) -> float:
        """Requests per second taken, ``workers`` in flight at once."""
        stop = time.monotonic() + seconds
        done = [0]

        def work() -> None:
            while time.monotonic() < stop:
                if self.one():
                    with self.lock:
                        done[0] += 1

        threads = [threading.Thread(target=work) for _ in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return done[0] / seconds

    def paced_processes(self, rate: float, seconds: float, processes: int) -> None:
        """:meth:`paced` split over ``processes`` processes (one Python process cannot offer 10x alone)."""
        import multiprocessing

        context = multiprocessing.get_context("spawn")  # a fork would share gRPC's threads
        results = context.Queue()
        base, stride = self.next, 1_000_000
        children = [context.Process(target=_paced_child, args=(self.target, base + i * stride, rate / processes,
                                                               seconds, results)) for i in range(processes)]
        for c in children:
            c.start()
        self.sent_by_children = 0
        for _ in children:
            ok, failed, count = results.get()
            self.ok += ok
            self.sent_by_children += count
            for code, n in failed.items():
                self.failed[code] = self.failed.get(code, 0) + n
        for c in children:
            c.join()
        self.next = base + processes * stride

    def paced(self, rate: float, seconds: float, workers: int = 32) -> None:
        """Open loop: one request every 1/rate s, whatever the answers take (up to ``workers`` in flight)."""
        from concurrent.futures import ThreadPoolExecutor

        start = time.monotonic()
        sent = 0
        with ThreadPoolExecutor(workers) as pool:
            while True:
                now = time.monotonic() - start
                if now >= seconds:
                    break
                due = int(now * rate)
                while sent < due:
                    pool.submit(self.one)
                    sent += 1
                time.sleep(0.002)


def _paced_child(target: str, first: int, rate: float, seconds: float, results) -> None:
    generator = Generator(target)
    generator.next = first
    generator.paced(rate, seconds)
    time.sleep(1)  # answers still in flight
    results.put((generator.ok, generator.failed, generator.next - first))


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def collector_metrics(port: int) -> dict[str, float]:
    """The Collector's own metrics (Prometheus text), summed by name without labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
    return out


def metric(values: dict[str, float], name: str) -> float:
    return values.get(name, values.get(name + "_total", 0.0))


def ofu_counters(path: Path) -> dict[str, dict[str, float]]:
    """otel-ofu's own counters from its selftelemetry file: the last value of each series."""
    from otel_ofu.otlp import codec as otlp

    out: dict[str, dict[str, float]] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        if not line.startswith('{"resourceMetrics"'):
            continue
        for p in otlp.from_request(otlp.from_json_line(line)):
            out.setdefault(p.name, {})[json.dumps(dict(p.attributes), sort_keys=True)] = p.value
    return out


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    try:
        for line in open(f"/proc/{pid}/status"):  # noqa: SIM115
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def run(args) -> dict:
    from tests.e2e_util import collector_binary

    otelcol = os.environ.get("OTELCOL") or collector_binary()
    work = Path(tempfile.mkdtemp(prefix="otel-ofu-overload-"))
    sink_grpc, sink_http, ofu_grpc, col_grpc, col_metrics = free_ports(5)
    procs: list[subprocess.Popen] = []

    def spawn(cmd: list[str], log: str) -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_EXPORTER_OTLP")}
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                                stderr=open(work / log, "w"))  # noqa: SIM115
        procs.append(proc)
        return proc

    ofu_config = work / "ofu.yaml"
    ofu_config.write_text(f"""
receivers:
  otlp:
    protocols: {{grpc: {{endpoint: "127.0.0.1:{ofu_grpc}"}}}}
    max_concurrent_requests: {args.max_concurrent}
    memory_limiter: {{limit_mib: {args.limit_mib}, spike_limit_mib: {args.limit_mib // 4}}}
  selftelemetry: {{collection_interval: 1s}}
processors:
  ofu: {{emit_inputs: true}}
exporters:
  otlp:
    endpoint: 127.0.0.1:{sink_grpc}
    tls: {{insecure: true}}
    sending_queue: {{sizer: bytes, queue_size: {args.queue_mib * 1024 * 1024}, num_consumers: 4}}
  file/self: {{path: {work / 'self.jsonl'}}}
service:
  pipelines:
    metrics: {{receivers: [otlp], processors: [ofu], exporters: [otlp]}}
    metrics/self: {{receivers: [selftelemetry], exporters: [file/self]}}
""")
    col_config = work / "collector.yaml"
    col_config.write_text(f"""
receivers:
  otlp:
    protocols: {{grpc: {{endpoint: "127.0.0.1:{col_grpc}", max_recv_msg_size_mib: 64}}}}
exporters:
  otlp:
    endpoint: 127.0.0.1:{ofu_grpc}
    tls: {{insecure: true}}
    retry_on_failure: {{enabled: true, initial_interval: 1s, max_interval: 5s, max_elapsed_time: 300s}}
    sending_queue: {{enabled: true, num_consumers: 10, queue_size: {args.collector_queue}}}
service:
  telemetry:
    metrics:
      level: detailed
      readers:
        - pull: {{exporter: {{prometheus: {{host: 127.0.0.1, port: {col_metrics}}}}}}}
  pipelines:
    metrics: {{receivers: [otlp], exporters: [otlp]}}
""")
    result: dict = {}
    try:
        spawn([sys.executable, str(ROOT / "benchmarks" / "otlp_sink.py"), "--grpc-port", str(sink_grpc),
               "--http-port", str(sink_http), "--tag-metrics", ",".join(PASS_THROUGH)], "sink.log")
        ofu = spawn([sys.executable, "-m", "otel_ofu", "run", "--config", str(ofu_config)], "ofu.log")
        _wait(lambda: port_open(sink_http) and port_open(ofu_grpc), "sink and otel-ofu to listen", work)

        # 1. capacity, straight into otel-ofu
        direct = Generator(f"127.0.0.1:{ofu_grpc}")
        capacity = direct.closed_loop(args.max_concurrent, args.capacity_s)
        direct_sent = list(direct.ok)
        result["capacity_rps"] = round(capacity, 1)
        result["capacity_points_per_s"] = round(capacity * GPUS_PER_REQUEST * 4)

        spawn([otelcol, "--config", str(col_config)], "collector.log")
        _wait(lambda: port_open(col_grpc) and port_open(col_metrics), "the Collector to listen", work)

        # 2. overload through the Collector, then 3. normal load; sample memory and the queue
        generator = Generator(f"127.0.0.1:{col_grpc}")
        generator.next = 10_000_000  # distinct from the capacity phase's request numbers
        peak_rss = [0.0]
        timeline: list[tuple[float, float, float, float]] = []  # (t, collector queue, ofu refused, rss)
        sampling = threading.Event()

        def sample() -> None:
            start = time.monotonic()
            while not sampling.is_set():
                rss = rss_mb(ofu.pid)
                peak_rss[0] = max(peak_rss[0], rss)
                try:
                    queue = metric(collector_metrics(col_metrics), "otelcol_exporter_queue_size")
                except OSError:
                    queue = -1
                refused = sum(v for k, v in ofu_counters(work / "self.jsonl").get(
                    "otel_ofu.receiver.requests", {}).items() if json.loads(k).get("outcome") != "accepted")
                timeline.append((time.monotonic() - start, queue, refused, rss))
                sampling.wait(1.0)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        overload_started = time.monotonic()
        generator.paced_processes(capacity * args.factor, args.overload_s, args.generators)
        overload_end = time.monotonic() - overload_started
        offered = generator.sent_by_children / overload_end
        sent_overload = generator.sent_by_children
        normal_from = generator.next
        generator.paced(capacity * 0.5, args.normal_s, workers=8)
        sent_normal = generator.next - normal_from
        # drain: the Collector's queue empties and the sink stops changing
        drained_by = time.monotonic() + args.drain_s
        last = None
        stable_since = time.monotonic()
        while time.monotonic() < drained_by:
            counts = get_json(f"http://127.0.0.1:{sink_http}/counts")
            queue = metric(collector_metrics(col_metrics), "otelcol_exporter_queue_size")
            if (counts["points"], queue) != last:
                last, stable_since = (counts["points"], queue), time.monotonic()
            elif queue == 0 and time.monotonic() - stable_since > 5:
                break
            time.sleep(1)
        time.sleep(2)  # the selftelemetry file's next snapshot
        sampling.set()
        sampler.join(5)

        col = collector_metrics(col_metrics)
        sink = get_json(f"http://127.0.0.1:{sink_http}/counts?tags")
        counters = ofu_counters(work / "self.jsonl")
        outcomes: dict[str, float] = {}
        for attributes, value in counters.get("otel_ofu.receiver.requests", {}).items():
            outcome = json.loads(attributes).get("outcome", "?")
            outcomes[outcome] = outcomes.get(outcome, 0) + value
        dropped_by_ofu = sum(counters.get("otel_ofu.exporter.dropped", {}).values())

        per_request = GPUS_PER_REQUEST * len(PASS_THROUGH)
        by_tag = sink.get("by_tag", {})
        collector_accepted = generator.ok
        def got(n: int) -> int:
            return by_tag.get(f"{n:013d}", 0)

        delivered = sum(1 for n in collector_accepted if got(n) >= per_request)
        partial = sum(1 for n in collector_accepted if 0 < got(n) < per_request)
        direct_delivered = sum(1 for n in direct_sent if got(n) >= per_request)
        points_per_request = GPUS_PER_REQUEST * 4
        # Dropped after the Collector accepted them: retries given up (send_failed). Requests its
        # full queue refused (enqueue_failed) were answered with an error: never accepted.
        collector_dropped = metric(col, "otelcol_exporter_send_failed_metric_points") / points_per_request
        collector_queue_refused = metric(col, "otelcol_exporter_enqueue_failed_metric_points") / points_per_request
        lost = len(collector_accepted) - delivered - round(collector_dropped)
        # recovery: from the end of the overload until otel-ofu refuses no more and the queue is empty
        recovered_at = None
        for i, (t, queue, refused, _) in enumerate(timeline):
            if t < overload_end:
                continue
            later = [r for tt, _, r, _ in timeline[i:] if tt <= t + 5]
            if queue == 0 and later and max(later) == refused:
                recovered_at = t
                break
        result.update({
            "peak_rss_mb": round(max(peak_rss[0], rss_mb(ofu.pid, "VmHWM")), 1),
            "limit_mb": args.limit_mib,
            "accepted": int(outcomes.get("accepted", 0)),
            "refused": int(sum(v for k, v in outcomes.items() if k != "accepted")),
            "refused_by_outcome": {k: int(v) for k, v in outcomes.items() if k != "accepted"},
            "delivered": delivered,
            "lost": lost,
            "duplicates": sink["duplicates"],
            "recovery_s": round(recovered_at - overload_end, 1) if recovered_at is not None else None,
            "overload_rate_rps": round(capacity * args.factor, 1),
            "offered_rps": round(offered, 1),  # what the generator managed in the overload phase
            "generator_sent": sent_overload + sent_normal,
            "collector_accepted": len(collector_accepted),
            "collector_refused": generator.failed,
            "collector_dropped_requests": round(collector_dropped, 1),
            "collector_queue_full_refused_requests": round(collector_queue_refused, 1),
            "collector_retries_seen_by_ofu": int(sum(v for k, v in outcomes.items() if k != "accepted")),
            "partially_delivered": partial,
            "capacity_phase_requests": len(direct_sent),
            "capacity_phase_delivered": direct_delivered,
            "ofu_exporter_dropped_points": dropped_by_ofu,
            "peak_collector_queue": max((q for _, q, _, _ in timeline), default=0),
            "work_dir": str(work),
        })
    finally:
        stop_processes(procs, timeout=60)
    return result


def stop_processes(procs: list[subprocess.Popen], timeout: float) -> None:
    """SIGTERM to each still running, newest first; SIGKILL to any not gone within ``timeout`` s."""
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()


def _wait(check, what: str, work: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in work.glob("*.log"))
    raise SystemExit(f"timed out waiting for {what}\n{logs}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--factor", type=float, default=10.0, help="overload rate / measured capacity")
    parser.add_argument("--capacity-s", type=float, default=15.0)
    parser.add_argument("--overload-s", type=float, default=60.0)
    parser.add_argument("--normal-s", type=float, default=60.0)
    parser.add_argument("--drain-s", type=float, default=600.0, help="the longest wait for everything to arrive")
    parser.add_argument("--max-concurrent", type=int, default=4, help="otel-ofu's max_concurrent_requests")
    parser.add_argument("--limit-mib", type=int, default=512, help="otel-ofu's memory_limiter.limit_mib")
    parser.add_argument("--queue-mib", type=int, default=64, help="otel-ofu's sending queue, in MiB (sizer bytes)")
    parser.add_argument("--collector-queue", type=int, default=1000, help="the Collector's sending_queue.queue_size")
    parser.add_argument("--generators", type=int, default=3, help="load generator processes in the overload")
    parser.add_argument("--gpus", type=int, default=256, help="GPUs per request (4 points each)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    global GPUS_PER_REQUEST
    GPUS_PER_REQUEST = args.gpus
    os.environ["OVERLOAD_GPUS_PER_REQUEST"] = str(args.gpus)  # for the spawned generator processes
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key in ("capacity_rps", "overload_rate_rps", "peak_rss_mb", "limit_mb", "accepted", "refused",
                    "delivered", "lost", "duplicates", "recovery_s", "collector_dropped_requests"):
            print(f"{key:28} {result.get(key)}")
    sys.exit(0 if result.get("lost") == 0 and result.get("duplicates") == 0 else 1)


if __name__ == "__main__":
    main()
