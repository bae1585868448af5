"""A long backend outage with a SIGKILL of otel-ofu in the middle: nothing lost, nothing sent twice.

A benchmark script in real time (not a test with accelerated time): ``--outage-s`` (600 s by
default) of outage, at the demo fleet's rate (collector-config/demo.yaml: 2 nodes x 8 GPUs,
its jobs, 120 simulated seconds per wall second, so about 12 windows of 16 GPUs a second).

1. otel-ofu runs the demo pipeline (sim -> ofu -> jobs) into an ``otlp`` exporter with a disk
   queue bounded in bytes (``sizer: bytes``) and a ``file`` exporter that records every batch it
   produced; the backend is an independent sink (benchmarks/otlp_sink.py) counting points.
2. After ``--before-s`` the sink goes down (answers UNAVAILABLE) for ``--outage-s``.
3. Half way through the outage otel-ofu is killed with SIGKILL and started again on the same
   queue (its sim starts a later day, so its points are new).
4. The sink comes back; the queue drains; otel-ofu is stopped with SIGTERM.

Checks: every point otel-ofu produced arrived at the sink exactly once, or was dropped by
the queue's bound and counted (``otel_ofu.exporter.dropped{reason=queue_full}``, the oldest
first); ``lost`` (neither) must be 0; ``duplicates`` at most the documented crash window (a
batch the backend took whose deletion the kill prevented; none here, as the kill falls in the
outage); the queue file never exceeds its bound by more than one batch and SQLite's overhead.

    .venv/bin/python benchmarks/outage.py --json                      # about 15 minutes
    .venv/bin/python benchmarks/outage.py --outage-s 60 --queue-mib 4  # a short rehearsal
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from overload import get_json, stop_processes  # noqa: E402

from tools.ports import free_ports, port_open  # noqa: E402


def config(work: Path, name: str, sink_port: int, queue_bytes: int, start: str) -> Path:
    path = work / f"{name}.yaml"
    demo = (ROOT / "collector-config" / "demo.yaml").read_text()
    receivers = demo.split("receivers:\n", 1)[1].split("\nprocessors:", 1)[0]
    processors = demo.split("\nprocessors:\n", 1)[1].split("\nexporters:", 1)[0]
    receivers = receivers.replace("    seed: 42\n", f"    seed: 42\n    start_time: \"{start}\"\n")
    path.write_text(f"""receivers:
{receivers}
  selftelemetry: {{collection_interval: 1s}}
processors:
{processors}
exporters:
  otlp:
    endpoint: 127.0.0.1:{sink_port}
    tls: {{insecure: true}}
    retry_on_failure: {{initial_interval: 1s, max_interval: 5s, max_elapsed_time: 0s}}
    sending_queue: {{storage: {work / 'queue'}, sizer: bytes, queue_size: {queue_bytes}, num_consumers: 4,
                    drain_timeout: 60s}}
  file: {{path: {work / (name + '.jsonl')}}}
  file/self: {{path: {work / (name + '-self.jsonl')}}}
service:
  shutdown_timeout: 90s
  pipelines:
    metrics: {{receivers: [sim], processors: [ofu, jobs], exporters: [otlp, file]}}
    metrics/self: {{receivers: [selftelemetry], exporters: [file/self]}}
""")
    return path


def point_keys(path: Path) -> set[bytes]:
    """The sink's hash of every point in a file the file exporter wrote (skipping a cut last line)."""
    from google.protobuf import json_format
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    from otel_ofu.otlp import files

    keys: set[bytes] = set()
    if not path.exists():
        return keys
    for _, line in files.read_json_lines(path, on_partial=lambda message: None):
        if not line.startswith('{"resourceMetrics"'):
            continue
        request = ExportMetricsServiceRequest()
        json_format.Parse(line, request)
        for rm in request.resource_metrics:
            resource = rm.resource.SerializeToString(deterministic=True)
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    kind = metric.WhichOneof("data")
                    for dp in getattr(metric, kind).data_points if kind else ():
                        attributes = b"".join(kv.SerializeToString(deterministic=True) for kv in dp.attributes)
                        keys.add(hashlib.blake2b(b"\0".join([resource, metric.name.encode(),
                                                             str(dp.time_unix_nano).encode(), attributes]),
                                                 digest_size=8).digest())
    return keys


def dropped(self_file: Path) -> dict[str, float]:
    """otel-ofu's exporter drop counters (by reason) from the last snapshot of its selftelemetry file."""
    from otel_ofu.otlp import codec as otlp
    from otel_ofu.otlp import files

    last: dict[str, float] = {}
    if not self_file.exists():
        return last
    for _, line in files.read_json_lines(self_file, on_partial=lambda message: None):
        if not line.startswith('{"resourceMetrics"'):
            continue
        snapshot = {}
        for p in otlp.from_request(otlp.from_json_line(line)):
            if p.name == "otel_ofu.exporter.dropped" and dict(p.attributes).get("exporter") == "otlp":
                reason = str(dict(p.attributes).get("reason"))
                snapshot[reason] = snapshot.get(reason, 0.0) + p.value
        if snapshot or not last:
            last = snapshot or last
    return last


def run(args) -> dict:
    work = Path(tempfile.mkdtemp(prefix="otel-ofu-outage-"))
    sink_grpc, sink_http = free_ports(2)
    queue_bytes = args.queue_mib * 1024 * 1024
    procs: list[subprocess.Popen] = []

    def spawn(cmd: list[str], log: str) -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_EXPORTER_OTLP")}
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                                stderr=open(work / log, "w"))  # noqa: SIM115
        procs.append(proc)
        return proc

    def sink(path: str) -> dict:
        request = urllib.request.Request(f"http://127.0.0.1:{sink_http}{path}", method="POST" if path in
                                         ("/down", "/up") else "GET")
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    queue_file = work / "queue" / "otlp.sqlite3"
    max_queue = [0]
    sampling = threading.Event()

    def sample_queue() -> None:
        while not sampling.is_set():
            size = sum(p.stat().st_size for p in queue_file.parent.glob("otlp.sqlite3*")
                       if p.exists() and not p.name.endswith(".lock")) if queue_file.parent.exists() else 0
            max_queue[0] = max(max_queue[0], size)
            sampling.wait(1.0)

    result: dict = {"work_dir": str(work), "outage_s": args.outage_s, "queue_bound_bytes": queue_bytes}
    try:
        spawn([sys.executable, str(HERE / "otlp_sink.py"), "--grpc-port", str(sink_grpc), "--http-port",
               str(sink_http)], "sink.log")
        while not port_open(sink_http):
            time.sleep(0.2)
        threading.Thread(target=sample_queue, daemon=True).start()
        first = spawn([sys.executable, "-m", "otel_ofu", "run", "--config",
                       str(config(work, "first", sink_grpc, queue_bytes, "2026-01-01T00:00:00+00:00"))], "first.log")
        time.sleep(args.before_s)
        sink("/down")
        outage_started = time.monotonic()
        time.sleep(args.outage_s / 2)
        first.send_signal(signal.SIGKILL)
        first.wait(60)
        killed_at = time.monotonic() - outage_started
        second = spawn([sys.executable, "-m", "otel_ofu", "run", "--config",
                        str(config(work, "second", sink_grpc, queue_bytes, "2026-03-01T00:00:00+00:00"))],
                       "second.log")
        time.sleep(max(0.0, args.outage_s - (time.monotonic() - outage_started)))
        sink("/up")
        recovered = time.monotonic()
        # drain: the sink stops changing and the queue holds nothing (the production goes on)
        deadline = time.monotonic() + args.drain_s
        while time.monotonic() < deadline:
            time.sleep(5)
            from sqlite3 import connect

            db = connect(queue_file)
            waiting = db.execute("SELECT COUNT(*) FROM queue").fetchone()[0]
            db.close()
            if waiting <= 2:
                break
        drain_s = time.monotonic() - recovered
        time.sleep(args.after_s)
        second.send_signal(signal.SIGTERM)
        second.wait(180)
        time.sleep(3)
        sampling.set()

        counts = sink("/counts")
        sink_keys = _sink_keys(sink_http, work)
        produced_first, produced_second = point_keys(work / "first.jsonl"), point_keys(work / "second.jsonl")
        produced = produced_first | produced_second
        drops_first, drops_second = dropped(work / "first-self.jsonl"), dropped(work / "second-self.jsonl")
        dropped_points = sum(drops_first.values()) + sum(drops_second.values())
        missing = produced - sink_keys
        extra = sink_keys - produced  # enqueued by the killed process but not yet in its file (the crash window)
        result.update({
            "produced_points": len(produced), "delivered_points": len(produced & sink_keys),
            "dropped_counted": int(dropped_points),
            "dropped_by_reason": {k: drops_first.get(k, 0) + drops_second.get(k, 0)
                                  for k in {*drops_first, *drops_second}},
            "missing_points": len(missing), "lost": len(missing) - int(dropped_points),
            "duplicates": counts["duplicates"], "duplicates_by_metric": counts["duplicates_by_metric"],
            "sink_points": counts["points"],
            "extra_at_sink_not_in_file": len(extra),
            "max_queue_file_bytes": max_queue[0],
            "queue_within_bound": max_queue[0] <= queue_bytes * 1.25 + 8 * 1024 * 1024,
            "killed_at_s_into_outage": round(killed_at, 1), "drain_s": round(drain_s, 1),
            "first_exit": first.returncode, "second_exit": second.returncode,
        })
        # the oldest are dropped first: every missing point is older than every point of its run kept
        for name, keys in (("first", produced_first), ("second", produced_second)):
            result[f"{name}_produced"] = len(keys)
            result[f"{name}_missing"] = len(keys - sink_keys)
    finally:
        sampling.set()
        stop_processes(procs, timeout=120)
    return result


def _sink_keys(port: int, work: Path) -> set[bytes]:
    path = work / "sink-keys.bin"
    get_json(f"http://127.0.0.1:{port}/dump?{path}")
    data = path.read_bytes()
    return {data[i:i + 8] for i in range(0, len(data), 8)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--outage-s", type=float, default=600.0)
    parser.add_argument("--before-s", type=float, default=30.0)
    parser.add_argument("--after-s", type=float, default=10.0)
    parser.add_argument("--drain-s", type=float, default=900.0)
    parser.add_argument("--queue-mib", type=int, default=64, help="sending_queue.queue_size in MiB (sizer bytes)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args)
    print(json.dumps(result, indent=2) if args.json else "\n".join(f"{k:28} {v}" for k, v in result.items()))
    sys.exit(0 if result.get("lost") == 0 and result.get("duplicates") == 0 and result.get("queue_within_bound")
             else 1)


if __name__ == "__main__":
    main()
