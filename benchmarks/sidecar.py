"""Sidecar cost: otel-ofu as a node daemon for 8 GPUs, CPU-seconds per hour and peak RSS.

Why: we claim otel-ofu is cheap enough to sit on every training node (< 0.5 % of one core,
i.e. < 18 CPU-s per hour, and < 80 MB RSS). This runs ``python -m otel_ofu run --config``
as a subprocess on the simulated fleet at real rates (time_acceleration 1: SM clock sampled
every 1 s, 10 s windows, 8 GPUs), exporting OTLP/gRPC to a tiny sink served from this
process, and in the same run the floor: a bare Python process that wakes every 1 s and
sleeps. CPU is user+sys from /proc/PID/stat between the end of a warm-up and the end of the
run (start-up is reported apart); peak RSS is VmHWM.

    python benchmarks/sidecar.py                 # 60 s
    python benchmarks/sidecar.py --seconds 300 --json
    python benchmarks/sidecar.py --profile       # also a cProfile of the daemon (top functions)
    python benchmarks/sidecar.py --no-loss       # without the loss account (gpu.ofu.loss): what it costs
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
FLOOR_CODE = "import time\nwhile True:\n    time.sleep(1.0)\n"


def cpu_seconds(pid: int) -> float:
    """user + sys CPU of a process, from /proc/PID/stat (fields 14 and 15, clock ticks)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()  # the command name may contain spaces
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


class Sink:
    """A local OTLP/gRPC server that accepts metrics and logs and counts what arrives."""

    def __init__(self) -> None:
        import grpc
        from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc

        self.requests = 0
        self.points = 0
        self.log_records = 0
        self._lock = threading.Lock()
        sink = self

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request, context):  # noqa: N802 - the gRPC method name
                n = sum(len(getattr(m, m.WhichOneof("data")).data_points) for rm in request.resource_metrics
                        for sm in rm.scope_metrics for m in sm.metrics if m.WhichOneof("data"))
                with sink._lock:
                    sink.requests += 1
                    sink.points += n
                return metrics_service_pb2.ExportMetricsServiceResponse()

        class Logs(logs_service_pb2_grpc.LogsServiceServicer):
            def Export(self, request, context):  # noqa: N802
                n = sum(len(sl.log_records) for rl in request.resource_logs for sl in rl.scope_logs)
                with sink._lock:
                    sink.log_records += n
                return logs_service_pb2.ExportLogsServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), self.server)
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(Logs(), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        self.server.stop(grace=1).wait()


def otlp_exporter_registered() -> tuple[bool, str]:
    """Whether the ``otlp`` exporter exists in this tree (another change adds it)."""
    try:
        from otel_ofu.pipeline import registry

        return "otlp" in registry.factories()["exporters"], ""
    except Exception as exc:  # noqa: BLE001 - a tree mid-change: fall back and say why
        return False, f"{type(exc).__name__}: {exc}"


def daemon_config(gpus: int, port: int | None, consumers: int | None = None, loss: bool = True) -> str:
    """The node daemon's YAML: sim at real rates -> ofu -> otlp (or file to /dev/null); ``loss=False``:
    the ofu processor without its loss account (``loss.enabled: false``), to measure what it costs."""
    exporter = (f"  otlp:\n    endpoint: http://127.0.0.1:{port}\n" if port is not None
                else "  file:\n    path: /dev/null\n")
    if port is not None and consumers is not None:
        exporter += f"    sending_queue:\n      num_consumers: {consumers}\n"
    name = "otlp" if port is not None else "file"
    ofu = "{}" if loss else "{loss: {enabled: false}}"
    return f"""receivers:
  sim:
    nodes: 1
    gpus_per_node: {gpus}
    time_acceleration: 1
    collection_interval: 10s
    clock_sample_interval: 1s
processors:
  ofu: {ofu}
exporters:
{exporter}service:
  pipelines:
    metrics:
      receivers: [sim]
      processors: [ofu]
      exporters: [{name}]
"""


def measure(seconds: float, warmup: float, gpus: int, use_otlp: bool, profile: str | None,
            consumers: int | None = None, loss: bool = True) -> dict:
    sink = Sink() if use_otlp else None
    if sink:
        sink.start()
    with tempfile.TemporaryDirectory(prefix="otel-ofu-sidecar-") as tmp:
        config = Path(tmp) / "sidecar.yaml"
        config.write_text(daemon_config(gpus, sink.port if sink else None, consumers, loss))
        log_path = Path(tmp) / "daemon.log"
        cmd = [sys.executable, "-m", "otel_ofu", "run", "--config", str(config)]
        if profile:
            cmd = [sys.executable, "-m", "cProfile", "-o", profile, "-m", "otel_ofu", "run", "--config", str(config),
                   "--duration", str(warmup + seconds)]
        with open(log_path, "w") as log:
            t_start = time.monotonic()
            daemon = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            floor = subprocess.Popen([sys.executable, "-c", FLOOR_CODE])
            try:
                time.sleep(warmup)
                alive = daemon.poll() is None
                if not alive:
                    raise RuntimeError(f"the daemon exited with {daemon.returncode}:\n{log_path.read_text()}")
                t0 = time.monotonic()
                d0, f0 = cpu_seconds(daemon.pid), cpu_seconds(floor.pid)
                time.sleep(seconds)
                t1 = time.monotonic()
                d1, f1 = cpu_seconds(daemon.pid), cpu_seconds(floor.pid)
                d_hwm, f_hwm = status_kb(daemon.pid, "VmHWM"), status_kb(floor.pid, "VmHWM")
                d_threads = status_kb(daemon.pid, "Threads")
            finally:
                for proc in (daemon, floor):
                    if proc.poll() is None:
                        proc.send_signal(signal.SIGTERM if proc is daemon else signal.SIGKILL)
                try:
                    daemon.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                floor.wait()
                if sink:
                    sink.stop()
        daemon_log = log_path.read_text()
    wall = t1 - t0
    per_hour = 3600.0 / wall
    return {
        "seconds": wall, "gpus": gpus, "exporter": "otlp" if use_otlp else "file:/dev/null", "loss_account": loss,
        "otlp_queue_consumers": consumers if use_otlp else None,
        "cpu_s_per_hour": (d1 - d0) * per_hour, "peak_rss_mb": d_hwm / 1024,
        "floor_cpu_s_per_hour": (f1 - f0) * per_hour, "floor_peak_rss_mb": f_hwm / 1024,
        "cpu_share_of_core": (d1 - d0) / wall, "startup_cpu_s": d0, "startup_wall_s": t0 - t_start,
        "daemon_threads": d_threads, "cpu_resolution_s": 1.0 / CLK_TCK,
        "sink_requests": sink.requests if sink else None, "sink_points": sink.points if sink else None,
        "sink_log_records": sink.log_records if sink else None,
        "daemon_log_tail": daemon_log[-2000:] if daemon_log.strip() else "",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="measured wall time after warm-up (default 60)")
    parser.add_argument("--warmup", type=float, default=5.0, help="start-up time excluded from the rate")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--exporter", choices=["auto", "otlp", "file"], default="auto",
                        help="auto: otlp when the exporter is registered, else file to /dev/null")
    parser.add_argument("--queue-consumers", type=int, default=None,
                        help="otlp sending_queue.num_consumers (default: the exporter's default)")
    parser.add_argument("--profile", action="store_true", help="run the daemon under cProfile; print top functions")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--no-loss", action="store_true",
                        help="the ofu processor without its loss account (loss.enabled: false): what it costs")
    args = parser.parse_args(argv)
    registered, why = otlp_exporter_registered()
    use_otlp = args.exporter == "otlp" or (args.exporter == "auto" and registered)
    profile = None
    if args.profile:
        profile = tempfile.NamedTemporaryFile(prefix="sidecar-", suffix=".prof", delete=False).name
    out = measure(args.seconds, args.warmup, args.gpus, use_otlp, profile, args.queue_consumers, not args.no_loss)
    if args.exporter == "auto" and not use_otlp:
        out["note"] = "otlp exporter not registered in this tree; exported with file to /dev/null" + (
            f" ({why})" if why else "")
    out["target_cpu_s_per_hour"] = 18.0
    out["target_peak_rss_mb"] = 80.0
    out["cpu_target_met"] = out["cpu_s_per_hour"] < 18.0
    out["rss_target_met"] = out["peak_rss_mb"] < 80.0
    top: list[str] = []
    if profile and Path(profile).exists() and Path(profile).stat().st_size:
        stats = pstats.Stats(profile)
        stats.sort_stats("tottime")
        rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:15]  # type: ignore[attr-defined]
        top = [f"{tt:7.3f}s self {ct:7.3f}s cum {nc:7d} calls  {Path(f).name}:{line} {fn}"
               for (f, line, fn), (_cc, nc, tt, ct, _callers) in rows]
        out["profile_top"] = top
    if args.json:
        json.dump(out, sys.stdout)
        print()
        return 0
    print(f"sidecar: {out['gpus']} simulated GPUs at real rates, {out['seconds']:.0f} s measured, "
          f"exporter {out['exporter']}" + (f", {args.queue_consumers} queue consumer(s)"
                                              if use_otlp and args.queue_consumers else ""))
    print(f"  otel-ofu : {out['cpu_s_per_hour']:7.2f} CPU-s/hour ({100 * out['cpu_share_of_core']:.3f} % of a core), "
          f"peak RSS {out['peak_rss_mb']:.1f} MB, {out['daemon_threads']} threads, "
          f"start-up {out['startup_cpu_s']:.2f} CPU-s")
    print(f"  floor    : {out['floor_cpu_s_per_hour']:7.2f} CPU-s/hour, peak RSS {out['floor_peak_rss_mb']:.1f} MB")
    if out["sink_points"] is not None:
        print(f"  sink got : {out['sink_requests']} requests, {out['sink_points']} points, "
              f"{out['sink_log_records']} log records")
    if "note" in out:
        print("  note     : " + out["note"])
    print(f"  target < 18 CPU-s/hour: {'met' if out['cpu_target_met'] else 'MISSED'}; "
          f"< 80 MB RSS: {'met' if out['rss_target_met'] else 'MISSED'}")
    if out["daemon_log_tail"]:
        print("  daemon log (tail):\n" + out["daemon_log_tail"])
    if top:
        print("  profile, top self time:\n    " + "\n    ".join(top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
