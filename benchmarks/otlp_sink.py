"""An independent OTLP/gRPC sink for the robustness benchmarks: counts every data point it gets.

It runs as its own process (not inside otel-ofu, not sharing its code paths for counting), keeps
a 64-bit hash of each point's identity (resource, metric name, time, attributes) to count
unique points and duplicates, and serves its counts as JSON on a small HTTP port, where a
benchmark can also make it fail (``POST /down``: every export gets UNAVAILABLE, nothing is
recorded; ``POST /up``) to play a backend outage, and have it write every point's hash to a
file (``GET /dump?<path>``) to compare with what was sent.

    python benchmarks/otlp_sink.py --grpc-port 4317 --http-port 8080
    curl 127.0.0.1:8080/counts
"""

from __future__ import annotations

import argparse
import hashlib
import json
import threading
from collections import Counter
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Sink:
    def __init__(self, tag_metrics: frozenset[str] = frozenset()) -> None:
        self.tag_metrics = tag_metrics  # count bench.request tags on these metrics only (empty: all)
        self.lock = threading.Lock()
        self.seen: set[bytes] = set()
        self.points = 0
        self.duplicates = 0
        self.requests = 0
        self.refused = 0
        self.down = False
        self.by_metric: Counter[str] = Counter()
        self.by_tag: Counter[str] = Counter()  # points per value of the resource attribute bench.request
        self.duplicates_by_metric: Counter[str] = Counter()

    def record(self, request) -> bool:
        with self.lock:
            if self.down:
                self.refused += 1
                return False
        keys: list[tuple[bytes, str]] = []
        tags = Counter()
        names = Counter()
        for rm in request.resource_metrics:
            resource = rm.resource.SerializeToString(deterministic=True)
            tag = next((kv.value.string_value for kv in rm.resource.attributes if kv.key == "bench.request"), "")
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    kind = metric.WhichOneof("data")
                    if kind is None:
                        continue
                    for dp in getattr(metric, kind).data_points:
                        attributes = b"".join(kv.SerializeToString(deterministic=True) for kv in dp.attributes)
                        keys.append((hashlib.blake2b(b"\0".join([resource, metric.name.encode(),
                                                                 str(dp.time_unix_nano).encode(), attributes]),
                                                     digest_size=8).digest(), metric.name))
                        names[metric.name] += 1
                        if tag and (not self.tag_metrics or metric.name in self.tag_metrics):
                            tags[tag] += 1
        with self.lock:
            self.requests += 1
            for key, name in keys:
                if key in self.seen:
                    self.duplicates += 1
                    self.duplicates_by_metric[name] += 1
                else:
                    self.seen.add(key)
            self.points += len(keys)
            self.by_metric.update(names)
            self.by_tag.update(tags)
        return True

    def counts(self, tags: bool) -> dict:
        with self.lock:
            out = {"points": self.points, "unique": len(self.seen), "duplicates": self.duplicates,
                   "requests": self.requests, "refused": self.refused, "down": self.down,
                   "by_metric": dict(self.by_metric), "duplicates_by_metric": dict(self.duplicates_by_metric)}
            if tags:
                out["by_tag"] = dict(self.by_tag)
            return out


def serve(grpc_port: int, http_port: int, tag_metrics: frozenset[str] = frozenset()) -> None:
    import grpc
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc

    sink = Sink(tag_metrics)

    class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
        def Export(self, request, context):  # noqa: N802 (generated name)
            if not sink.record(request):
                context.abort(grpc.StatusCode.UNAVAILABLE, "the sink is down (benchmark outage)")
            return metrics_service_pb2.ExportMetricsServiceResponse()

    class Logs(logs_service_pb2_grpc.LogsServiceServicer):
        def Export(self, request, context):  # noqa: N802
            with sink.lock:
                down = sink.down
            if down:
                context.abort(grpc.StatusCode.UNAVAILABLE, "the sink is down (benchmark outage)")
            return logs_service_pb2.ExportLogsServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16),
                         options=[("grpc.max_receive_message_length", 256 * 1024 * 1024)])
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), server)
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(Logs(), server)
    server.add_insecure_port(f"127.0.0.1:{grpc_port}")
    server.start()

    class Control(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def _reply(self, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            if self.path.startswith("/dump?"):  # every point hash, 8 bytes each, written to the given file
                from urllib.parse import unquote

                with sink.lock:
                    data = b"".join(sink.seen)
                with open(unquote(self.path.split("?", 1)[1]), "wb") as handle:
                    handle.write(data)
            self._reply(sink.counts(tags="tags" in self.path))

        def do_POST(self) -> None:  # noqa: N802
            with sink.lock:
                sink.down = self.path.startswith("/down")
            self._reply(sink.counts(tags=False))

    http = ThreadingHTTPServer(("127.0.0.1", http_port), Control)
    print(f"sink: OTLP/gRPC on 127.0.0.1:{grpc_port}, counts on http://127.0.0.1:{http_port}/counts", flush=True)
    http.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--tag-metrics", default="", help="comma-separated: count bench.request tags on these only")
    args = parser.parse_args()
    serve(args.grpc_port, args.http_port, frozenset(n for n in args.tag_metrics.split(",") if n))


if __name__ == "__main__":
    main()
