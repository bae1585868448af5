"""The parsers of outside input, as fuzz targets: how to make inputs, how to feed them, what must hold.

Shared by the property tests (tests/test_fuzz.py, Hypothesis, in CI) and the long run
(benchmarks/fuzz.py, at least 100,000 inputs per parser). Each :class:`Target` wraps one
parser the way otel-ofu calls it on data it does not control and answers "accepted" or
"rejected"; anything else it raises is a crash. What must hold for every input:

- no crash: only the parser's documented error (ReplayFormatError, ConfigError, a gRPC
  status or HTTP code from the receiver, ...) and it names the problem (file and line,
  component and key, or a status with a message);
- no hang: each input is bounded in time (the runner's alarm);
- memory bounded (the runner measures the peak);
- nothing accepted is lost: what a parser accepts reaches the next stage (for the receiver,
  the OFU processor runs on it, and the pass-through re-encodes).

Inputs are valid-then-mutated where structure helps: a generator builds a valid input of the
real shape (a dcgm-exporter page, a dmon capture, an OTLP request) with hostile values
(blanks, NaN, huge numbers, odd labels), then a mutator flips, cuts, splices or repeats bytes
or tokens; a share of inputs are raw random bytes.
"""

from __future__ import annotations

import base64
import csv
import gzip
import io
import json
import os
import random
import string
import struct
import sys
import tempfile
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# --- mutation ---------------------------------------------------------------------------------

INTERESTING_TEXT = ["0", "-1", "1e309", "-1e309", "NaN", "nan", "+Inf", "-Inf", "inf", "9223372036854775807",
                    "9223372036854775808", "-9223372036854775809", "2147483632", "9223372036854775792",
                    "140737488355328", "4294967296", "0x7ffffff0", "1.7976931348623157e308", "5e-324", "",
                    " ", "\t", "\\", '"', "'", "\n", "\r\n", "\x00", "#", "{", "}", "[", "]", ",", ":", "=",
                    "N/A", "\u00e9", "\U0001f600", "\ufeff", "GPU", "GPU-I", "-" * 80, "A" * 5000]
INTERESTING_BYTES = [b"\x00", b"\xff", b"\x7f", b"\x80", b"\xff\xff\xff\xff\x0f", b"\x80" * 10, b"\x0a\xff\xff\xff\x7f",
                     b"\x12\x00", b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", b"\x1f\x8b", b"\x28\xb5\x2f\xfd"]


def mutate_bytes(data: bytes, rng: random.Random, corpus: list[bytes], rounds: int | None = None) -> bytes:
    """libFuzzer-style byte mutations: flip, set, insert, delete, duplicate, truncate, splice."""
    buf = bytearray(data)
    for _ in range(rounds or rng.randint(1, 6)):
        op = rng.randrange(9)
        n = len(buf)
        if op == 0 and n:
            buf[rng.randrange(n)] ^= 1 << rng.randrange(8)
        elif op == 1 and n:
            buf[rng.randrange(n)] = rng.randrange(256)
        elif op == 2:
            at = rng.randint(0, n)
            buf[at:at] = rng.choice(INTERESTING_BYTES) if rng.random() < 0.5 else rng.randbytes(rng.randint(1, 16))
        elif op == 3 and n:
            a = rng.randrange(n)
            del buf[a:a + rng.randint(1, max(1, n // 8))]
        elif op == 4 and n:
            a = rng.randrange(n)
            chunk = buf[a:a + rng.randint(1, 64)]
            at = rng.randint(0, n)
            buf[at:at] = chunk * rng.randint(1, 8)
        elif op == 5 and n:
            del buf[rng.randint(0, n):]  # truncate
        elif op == 6 and corpus:
            other = rng.choice(corpus)
            if other:
                a = rng.randrange(len(other))
                at = rng.randint(0, n)
                buf[at:at] = other[a:a + rng.randint(1, 256)]
        elif op == 7 and n >= 2:
            a, b = sorted(rng.sample(range(n), 2))
            buf[a:b] = buf[a:b][::-1]
        elif op == 8 and n:
            at = rng.randrange(n)
            buf[at:at + 8] = rng.getrandbits(64).to_bytes(8, "little")
    return bytes(buf)


def mutate_text(text: str, rng: random.Random, rounds: int | None = None) -> str:
    """Token and line mutations that keep most of a text format's shape."""
    lines = text.split("\n")
    for _ in range(rounds or rng.randint(1, 4)):
        if not lines:
            lines = [""]
        op = rng.randrange(8)
        i = rng.randrange(len(lines))
        if op == 0:  # replace a token by an interesting one
            tokens = lines[i].split(" ")
            j = rng.randrange(len(tokens))
            tokens[j] = rng.choice(INTERESTING_TEXT)
            lines[i] = " ".join(tokens)
        elif op == 1:
            lines.insert(rng.randrange(len(lines) + 1), lines[i])
        elif op == 2:
            del lines[i]
        elif op == 3 and len(lines) > 1:
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == 4:
            at = rng.randint(0, len(lines[i]))
            lines[i] = lines[i][:at] + rng.choice(INTERESTING_TEXT) + lines[i][at:]
        elif op == 5:
            lines[i] = lines[i][:rng.randint(0, len(lines[i]))]
        elif op == 6:
            lines.insert(i, "".join(rng.choice(string.printable) for _ in range(rng.randint(0, 60))))
        else:  # a character level edit
            if lines[i]:
                at = rng.randrange(len(lines[i]))
                lines[i] = lines[i][:at] + chr(rng.randrange(0x20, 0x2FFF)) + lines[i][at + 1:]
    return "\n".join(lines)


def hostile_number(rng: random.Random) -> float | int:
    return rng.choice([0, 1, -1, 0.5, 0.929260, 1755, 1980, 1e309, -1e309, float("nan"), 2 ** 63 - 1, 2 ** 63,
                       -(2 ** 63), 2147483632, 9223372036854775792, 140737488355328.0, 1e-300, 5e-324,
                       rng.uniform(-1e6, 1e6), rng.random(), rng.randint(0, 3000)])


def hostile_label(rng: random.Random) -> str:
    return rng.choice(["", "0", "node-1", f"GPU-{rng.getrandbits(32):08x}", "MIG-x", "NVIDIA H100 80GB HBM3",
                       "NVIDIA B200", "NVIDIA A100-SXM4-80GB", "unknown", 'a"b', "a\\b", "a\nb", "\u00e9\u4e2d",
                       "x" * rng.randint(0, 300), str(rng.randint(-5, 10)), "1g.10gb", "..", "/", " "])


# --- targets ----------------------------------------------------------------------------------

@dataclass
class Target:
    """One parser: ``run(data)`` returns "accepted" or "rejected"; any other exception is a crash."""

    name: str
    description: str
    seeds: Callable[[], list[bytes]]
    generate: Callable[[random.Random, list[bytes]], bytes]
    run: Callable[[bytes], str]
    start: Callable[[], None] = field(default=lambda: None)
    stop: Callable[[], None] = field(default=lambda: None)


class Rejected(Exception):
    """A parser said no, with a message: fine when the message names the problem."""


def _require_clear(message: str, *needles: str) -> None:
    """A rejection must say something, and where (file:line, key, ...): else it is a finding."""
    if not message.strip():
        raise AssertionError("rejected with an empty message")
    for needle in needles:
        if needle not in message:
            raise AssertionError(f"rejection {message[:200]!r} does not name {needle!r}")


# OTLP metrics (receiver) ------------------------------------------------------------------------

def _otlp_request(rng: random.Random):
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    from tests.otlp_shapes import Gpu, dcgm_exporter_request, dcgmreceiver_request

    gpus = [Gpu(i, hostile_label(rng) if rng.random() < 0.3 else f"GPU-{i:04x}", hostile_number(rng),
                hostile_number(rng), hostile_number(rng), hostile_label(rng) if rng.random() < 0.3 else
                "NVIDIA H100 80GB HBM3") for i in range(rng.randint(0, 6))]
    t = rng.choice([0, 1, 1_764_000_000_000_000_000, 2 ** 64 - 10 ** 8, rng.getrandbits(63)])  # + ms offsets fit
    request = ExportMetricsServiceRequest()
    for _ in range(rng.randint(1, 2)):
        if rng.random() < 0.6:
            dcgm_exporter_request(gpus, t, host=hostile_label(rng), request=request)
        else:
            request.resource_metrics.extend(dcgmreceiver_request(gpus, t).resource_metrics)
    # structural mutations: odd types and values where the join reads
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                if kind is None:
                    continue
                if rng.random() < 0.1:
                    metric.unit = rng.choice(["", "%", "Hz", "MHz", "1", "{x}", hostile_label(rng)])
                for dp in getattr(metric, kind).data_points:
                    r = rng.random()
                    if r < 0.1:
                        dp.as_int = rng.choice([0, -1, 2 ** 63 - 1, -(2 ** 63), 9223372036854775792])
                    elif r < 0.15:
                        dp.ClearField("value") if hasattr(dp, "ClearField") else None
                    elif r < 0.2:
                        dp.flags = rng.choice([0, 1, 2 ** 32 - 1])
                    if rng.random() < 0.1:
                        dp.time_unix_nano = rng.choice([0, 2 ** 64 - 1, rng.getrandbits(64)])
                    if rng.random() < 0.1 and dp.attributes:
                        kv = rng.choice(list(dp.attributes))
                        which = rng.randrange(4)
                        if which == 0:
                            kv.value.int_value = rng.getrandbits(63)
                        elif which == 1:
                            kv.value.double_value = hostile_number(rng)
                        elif which == 2:
                            kv.value.bool_value = True
                        else:
                            kv.value.array_value.values.add().string_value = hostile_label(rng)
    return request


def _otlp_seed_bytes() -> list[bytes]:
    rng = random.Random(1)
    return [_otlp_request(rng).SerializeToString() for _ in range(20)]


def _gen_otlp_protobuf(rng: random.Random, corpus: list[bytes]) -> bytes:
    r = rng.random()
    if r < 0.1:
        return rng.randbytes(rng.randint(0, 512))
    body = _otlp_request(rng).SerializeToString()
    return mutate_bytes(body, rng, corpus) if r < 0.7 else body


def _accept_request(request, wire: bytes | None) -> str:
    """What the receiver does with a decoded request, then what the next stages do with it."""
    from otel_ofu.core.model import Batch
    from otel_ofu.otlp import codec as otlp
    from otel_ofu.otlp import join as otlp_join
    from otel_ofu.otlp.payload import metrics_payload

    samples, rest = otlp_join.split_request(request, window_s=30.0, tolerance_s=5.0, passthrough=True, wire=wire)
    batch = _OFU().process(Batch(samples=samples, passthrough=list(rest)))
    metrics_payload(batch.points, batch.passthrough)  # what otlp/otlphttp exporters send
    otlp.to_json_line(otlp.to_request(batch.points[:50]))  # what the file exporter writes
    return "accepted"


_ofu_processor = None


def _OFU():  # noqa: N802 (a cached processor instance)
    global _ofu_processor
    if _ofu_processor is None:
        from otel_ofu.pipeline.component import Context
        from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig

        _ofu_processor = OfuProcessor(OfuProcessorConfig(), Context("ofu"))
    return _ofu_processor


def run_otlp_protobuf(data: bytes) -> str:
    """The otlp receiver's HTTP path for a protobuf body, gzip or not, then the pipeline."""
    from otel_ofu.receivers.otlp import PROTOBUF, RequestRefused, _decode, _decompress

    encoding = ""
    if data[:1] == b"\x01":  # the first byte picks the encoding, so the fuzzer explores both
        encoding, data = "gzip", gzip.compress(data[1:], mtime=0) if len(data) % 3 else data[1:]
    try:
        body = _decompress(data, encoding, 4 * 1024 * 1024)
        request = _decode(body, PROTOBUF)
    except RequestRefused as exc:
        _require_clear(str(exc))
        return "rejected"
    except ValueError as exc:
        _require_clear(str(exc), "ExportMetricsServiceRequest")
        return "rejected"
    return _accept_request(request, body)


def _gen_otlp_json(rng: random.Random, corpus: list[bytes]) -> bytes:
    from google.protobuf import json_format

    r = rng.random()
    if r < 0.1:
        return rng.randbytes(rng.randint(0, 256))
    text = json_format.MessageToJson(_otlp_request(rng), indent=None)
    if r < 0.4:
        return mutate_text(text, rng).encode("utf-8", "surrogatepass")
    if r < 0.7:
        doc = json.loads(text)
        _mutate_json(doc, rng)
        return json.dumps(doc, allow_nan=True).encode()
    return text.encode()


def _mutate_json(doc, rng: random.Random, depth: int = 0) -> None:
    """Replace some values of a JSON tree with values of other types."""
    choices = [None, True, 0, -1, 1e308, "x", "NaN", "18446744073709551616", "-5", [], {}, [1, 2], {"a": 1},
               "A" * 1000, 2 ** 70]
    if isinstance(doc, dict):
        for key in list(doc):
            if rng.random() < 0.15:
                doc[key] = rng.choice(choices)
            else:
                _mutate_json(doc[key], rng, depth + 1)
        if rng.random() < 0.05:
            doc[rng.choice(["unknown", "timeUnixNano", "asDouble", "asInt", "value", "gauge"])] = rng.choice(choices)
    elif isinstance(doc, list):
        for i in range(len(doc)):
            if rng.random() < 0.1:
                doc[i] = rng.choice(choices)
            else:
                _mutate_json(doc[i], rng, depth + 1)


def run_otlp_json(data: bytes) -> str:
    from otel_ofu.receivers.otlp import JSON, _decode

    try:
        request = _decode(data, JSON)
    except ValueError as exc:
        _require_clear(str(exc), "OTLP/JSON")
        return "rejected"
    return _accept_request(request, None)


# Live receiver: real HTTP and gRPC ----------------------------------------------------------------

class _LiveReceiver:
    """A started otlp receiver (both protocols) feeding the ofu processor, on free loopback ports."""

    def __init__(self) -> None:
        self.receiver = None
        self.accepted = 0

    def start(self) -> None:
        if self.receiver is not None:
            return
        from otel_ofu.core.model import Batch
        from otel_ofu.pipeline.component import Context
        from otel_ofu.pipeline.config import build_config
        from otel_ofu.receivers.otlp import OtlpReceiver, OtlpReceiverConfig

        def consume(batch: Batch) -> None:
            _OFU().process(batch)
            self.accepted += 1

        config = build_config(OtlpReceiverConfig, {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"},
                                                                 "http": {"endpoint": "127.0.0.1:0"}},
                                                   "max_request_size": 65536})
        self.receiver = OtlpReceiver(config, Context("otlp"), consume)
        self.receiver.start()
        self._http = None
        self._channel = None

    def stop(self) -> None:
        if self.receiver is not None:
            self.receiver.shutdown()
            self.receiver = None

    def http(self, body: bytes, headers: dict[str, str]) -> int:
        import http.client

        for attempt in range(2):
            if self._http is None:
                self._http = http.client.HTTPConnection("127.0.0.1", self.receiver.http_port, timeout=10)
            try:
                self._http.request("POST", "/v1/metrics", body=body, headers=headers)
                response = self._http.getresponse()
                response.read()
                if response.getheader("Connection", "").lower() == "close":
                    self._http.close()
                    self._http = None
                return response.status
            except (ConnectionError, http.client.HTTPException):
                self._http.close()
                self._http = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def grpc(self, body: bytes, gzip_it: bool):
        import grpc

        if self._channel is None:
            self._channel = grpc.insecure_channel(f"127.0.0.1:{self.receiver.grpc_port}")
            self._call = self._channel.unary_unary("/opentelemetry.proto.collector.metrics.v1.MetricsService/Export")
        try:
            self._call(body, timeout=10, compression=grpc.Compression.Gzip if gzip_it else None)
            return grpc.StatusCode.OK, ""
        except grpc.RpcError as exc:
            return exc.code(), exc.details() or ""


LIVE = _LiveReceiver()
_HTTP_OK = {200}
_HTTP_REFUSED = {400, 411, 413, 415}


def run_otlp_http(data: bytes) -> str:
    """A real HTTP request: protobuf or JSON, gzip/deflate or not, truncated or oversized."""
    selector, body = (data[0], data[1:]) if data else (0, b"")
    media = "application/json" if selector & 1 else "application/x-protobuf"
    headers = {"Content-Type": media}
    if selector & 2:
        headers["Content-Encoding"] = "gzip"
        body = gzip.compress(body, mtime=0) if selector & 4 else body  # a valid or a bogus gzip stream
    elif selector & 8:
        headers["Content-Encoding"] = "deflate"
        body = zlib.compress(body) if selector & 4 else body
    if selector & 16:
        body = body * 40  # oversized (max_request_size 64 KiB)
    try:
        status = LIVE.http(body, headers)
    except (BrokenPipeError, ConnectionResetError):
        # The receiver answers a too large Content-Length without reading the body and closes:
        # a client still writing sees the close. Refused, not a failure, if it still serves.
        LIVE.http(b"", {"Content-Type": "application/x-protobuf"})
        return "rejected"
    if status in _HTTP_OK:
        return "accepted"
    if status in _HTTP_REFUSED:
        return "rejected"
    raise AssertionError(f"HTTP {status}: the receiver failed on this request")


def run_otlp_grpc(data: bytes) -> str:
    import grpc

    selector, body = (data[0], data[1:]) if data else (0, b"")
    if selector & 16:
        body = body * 40
    code, details = LIVE.grpc(body, bool(selector & 2))
    if code == grpc.StatusCode.OK:
        return "accepted"
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED):
        _require_clear(details)
        return "rejected"
    raise AssertionError(f"gRPC {code.name}: {details}")


def _gen_live(rng: random.Random, corpus: list[bytes]) -> bytes:
    selector = rng.getrandbits(8) & ~16 if rng.random() < 0.95 else rng.getrandbits(8)
    body = _gen_otlp_json(rng, corpus) if selector & 1 else _gen_otlp_protobuf(rng, corpus)
    return bytes([selector]) + body


# Prometheus text (dcgm_exporter receiver) -------------------------------------------------------

def _prom_page(rng: random.Random) -> str:
    fields = ["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_POWER_USAGE",
              "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_MAX_SM_CLOCK", "DCGM_FI_PROF_TENSOR_UTIL_RATIO",
              "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_GPU_TEMP", "not_dcgm"]
    lines = []
    for name in rng.sample(fields, rng.randint(1, len(fields))):
        lines.append(f"# HELP {name} {hostile_label(rng)}")
        lines.append(f"# TYPE {name} {rng.choice(['gauge', 'counter', 'untyped', 'summary', 'histogram', 'x'])}")
        for gpu in range(rng.randint(0, 4)):
            labels = {"gpu": str(gpu), "UUID": f"GPU-{gpu:04x}", "modelName": "NVIDIA H100 80GB HBM3",
                      "Hostname": "node-1"}
            for key in rng.sample(["pod", "namespace", "container", "GPU_I_ID", "GPU_I_PROFILE", "hpc_job", "uuid",
                                   "hostname", "device", "pci_bus_id"], rng.randint(0, 4)):
                labels[key] = hostile_label(rng)
            if rng.random() < 0.2:
                labels[rng.choice(list(labels))] = hostile_label(rng)
            text = ",".join(f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
                            .replace("\n", "\\n") for k, v in labels.items())
            value = hostile_number(rng)
            lines.append(f"{name}{{{text}}} {value}" + (f" {rng.getrandbits(41)}" if rng.random() < 0.2 else ""))
    return "\n".join(lines) + "\n"


def _gen_prom(rng: random.Random, corpus: list[bytes]) -> bytes:
    r = rng.random()
    if r < 0.05:
        return rng.randbytes(rng.randint(0, 256))
    if r < 0.15 and corpus:
        return mutate_bytes(rng.choice(corpus), rng, corpus)
    page = _prom_page(rng)
    return (mutate_text(page, rng) if r < 0.7 else page).encode("utf-8", "surrogatepass")


def _prom_seeds() -> list[bytes]:
    return [p.read_bytes() for p in sorted((ROOT / "tests" / "data" / "dcgm-exporter").glob("*.prom"))]


def run_prometheus(data: bytes) -> str:
    from otel_ofu.receivers.dcgm_exporter import parse_metrics

    text = data.decode("utf-8", "replace")  # the scraper decodes the page as requests does
    try:
        samples = parse_metrics(text, time_unix_nano=1_764_000_000_000_000_000, window_s=30.0, default_host="n")
    except ValueError as exc:  # the receiver turns this into ScrapeError("malformed", ...)
        _require_clear(str(exc) or "a line does not parse")
        return "rejected"
    from otel_ofu.core.model import Batch

    _OFU().process(Batch(samples=samples))
    return "accepted"


# dcgmi dmon and CSV (replay receiver) -----------------------------------------------------------

def _dmon_text(rng: random.Random) -> str:
    cols = rng.sample(["TENSO", "SMCLK", "POWER", "SMACT", "GRACT", "DRAMA", "MMCLK", "1004", "100"], rng.randint(1, 5))
    lines = []
    if rng.random() < 0.5:
        lines.append(f"# dcgmi dmon -e {','.join(rng.choice(['1004', '100', '155', '1002', 'x']) for _ in cols)} "
                     f"-d {rng.choice([100, 1000, 0, 99999999])}")
    lines.append("#Entity   " + "   ".join(cols))
    lines.append("ID        " + "   ".join("W" for _ in cols))
    for _ in range(rng.randint(0, 6)):
        for group, eid in rng.sample([("GPU", "0"), ("GPU", "1"), ("GPU-I", "3"), ("GPU-CI", "0"), ("GPU", "x")],
                                     rng.randint(1, 3)):
            values = [rng.choice(["N/A", str(hostile_number(rng)), "0.929", "1755", ""]) for _ in cols]
            lines.append(f"{group} {eid}    " + "   ".join(values))
    return "\n".join(lines) + "\n"


def _replay_seeds(pattern: str) -> list[bytes]:
    return [p.read_bytes() for p in sorted((ROOT / "tests" / "data" / "replay").glob(pattern))]


def _gen_dmon(rng: random.Random, corpus: list[bytes]) -> bytes:
    r = rng.random()
    if r < 0.05:
        return rng.randbytes(rng.randint(0, 256))
    if r < 0.3 and corpus:
        return mutate_text(rng.choice(corpus).decode("utf-8", "replace"), rng).encode("utf-8", "surrogatepass")
    text = _dmon_text(rng)
    return (mutate_text(text, rng) if r < 0.7 else text).encode("utf-8", "surrogatepass")


def _replay_run(data: bytes, parse: Callable) -> str:
    from otel_ofu.core.model import Batch
    from otel_ofu.receivers.replay import ReplayFormatError

    text = data.decode("utf-8", "replace")
    skipped: list[ReplayFormatError] = []
    try:  # skip_malformed: bad lines are skipped, a bad header still stops it
        frames = list(parse(io.StringIO(text, newline=""), "capture.txt", on_error=skipped.append))
    except ReplayFormatError as exc:
        _require_clear(str(exc), "capture.txt:")
        frames = []
    for error in skipped:
        _require_clear(str(error), "capture.txt:")
    for frame in frames:
        _OFU().process(Batch(samples=frame.batch.samples))
    try:  # and the strict mode: the first bad line stops it, naming file and line
        list(parse(io.StringIO(text, newline=""), "capture.txt"))
    except ReplayFormatError as exc:
        _require_clear(str(exc), "capture.txt:")
        return "rejected"
    return "accepted"


def run_dmon(data: bytes) -> str:
    from otel_ofu.receivers.replay import parse_dmon

    return _replay_run(data, lambda lines, path, **kw: parse_dmon(lines, path, start_unix_nano=0, **kw))


def _csv_text(rng: random.Random) -> str:
    header = ["timestamp", "gpu"] + rng.sample(["uuid", "model", "host", "window_s", "1004", "100",
                                                "DCGM_FI_DEV_POWER_USAGE", "pod", "job", "TENSO"], rng.randint(0, 5))
    rng.shuffle(header)
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(header)
    for _ in range(rng.randint(0, 8)):
        row = []
        for name in header:
            if name == "timestamp":
                row.append(rng.choice(["2026-01-01T00:00:00Z", "1767225600", "1767225600000", "x", "",
                                       "9999-99-99", str(hostile_number(rng)), "2026-01-01T00:00:00+99:00"]))
            elif name == "gpu":
                row.append(rng.choice(["0", "1", "", "-1", "x"]))
            else:
                row.append(rng.choice([str(hostile_number(rng)), hostile_label(rng), "N/A", ""]))
        writer.writerow(row)
    return out.getvalue()


def _gen_csv(rng: random.Random, corpus: list[bytes]) -> bytes:
    r = rng.random()
    if r < 0.05:
        return rng.randbytes(rng.randint(0, 256))
    if r < 0.3 and corpus:
        return mutate_text(rng.choice(corpus).decode("utf-8", "replace"), rng).encode("utf-8", "surrogatepass")
    text = _csv_text(rng)
    return (mutate_text(text, rng) if r < 0.7 else text).encode("utf-8", "surrogatepass")


def run_csv(data: bytes) -> str:
    from otel_ofu.receivers.replay import parse_csv

    return _replay_run(data, lambda lines, path, **kw: parse_csv(lines, path, **kw))


# OTLP JSON lines (replay, report) ---------------------------------------------------------------

def _gen_jsonl(rng: random.Random, corpus: list[bytes]) -> bytes:
    from otel_ofu.core.model import Event, MetricPoint, attrs
    from otel_ofu.otlp import codec as otlp

    r = rng.random()
    if r < 0.05:
        return rng.randbytes(rng.randint(0, 256))
    if r < 0.35 and corpus:
        seed = rng.choice(corpus)
        lines = seed.split(b"\n")[: rng.randint(1, 6)]
        return mutate_text(b"\n".join(lines).decode("utf-8", "replace"), rng).encode("utf-8", "surrogatepass")
    lines = []
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.7:
            points = [MetricPoint(rng.choice(["gpu.ofu", "gpu.ofu.raw", "job.ofu", "gpu.tensor.activity", "x"]),
                                  float(hostile_number(rng)), rng.getrandbits(63),
                                  attrs({"hw.id": hostile_label(rng), "host.name": hostile_label(rng)}),
                                  attrs({"ofu.job.id": hostile_label(rng), "ofu.precision": hostile_label(rng)}))
                      for _ in range(rng.randint(0, 5))]
            line = otlp.to_json_line(otlp.to_request(points))
        else:
            events = [Event(rng.choice(["ofu.job.start", "ofu.job.end", "ofu.job.finding", "x"]), rng.getrandbits(63),
                            attrs({"ofu.job.id": hostile_label(rng)}), attrs({"k": hostile_label(rng)}),
                            hostile_label(rng)) for _ in range(rng.randint(0, 3))]
            line = otlp.to_json_line(otlp.events_to_request(events))
        if rng.random() < 0.4:
            doc = json.loads(line)
            _mutate_json(doc, rng)
            line = json.dumps(doc)
        lines.append(line)
    text = "\n".join(lines) + "\n"
    return (mutate_text(text, rng) if r < 0.6 else text).encode("utf-8", "surrogatepass")


def run_jsonl(data: bytes) -> str:
    """The replay receiver's otlp_json reader, and the report's reader on the same lines."""
    from otel_ofu.receivers.replay import ReplayFormatError, parse_otlp
    from otel_ofu.report.build import ReportError, build_report

    text = data.decode("utf-8", "replace")
    skipped: list[ReplayFormatError] = []
    frames = list(parse_otlp(io.StringIO(text, newline=""), "rec.jsonl", on_error=skipped.append))
    for error in skipped:
        _require_clear(str(error), "rec.jsonl:")
    del frames
    path = _scratch("rec.jsonl", data)
    try:
        build_report(path)
    except ReportError as exc:
        _require_clear(str(exc), str(path))
        return "rejected"
    return "rejected" if skipped else "accepted"


def _gen_proto_records(rng: random.Random, corpus: list[bytes]) -> bytes:
    """The Collector's format: proto: length-prefixed OTLP protobuf requests, metrics and logs, some
    zstd per record, bytes flipped, lengths wrong, the end cut."""
    import zstandard

    from otel_ofu.core.model import Event, MetricPoint, attrs
    from otel_ofu.otlp import codec as otlp

    if rng.random() < 0.05:
        return rng.randbytes(rng.randint(0, 256))
    records = []
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.7:
            points = [MetricPoint(rng.choice(["gpu.ofu", "gpu.flops.achieved", "gpu.ofu.loss", "training.mfu", "x"]),
                                  float(hostile_number(rng)), rng.getrandbits(63),
                                  attrs({"hw.id": hostile_label(rng), "host.name": hostile_label(rng)}),
                                  attrs({"ofu.job.id": hostile_label(rng), "ofu.loss.part": hostile_label(rng)}))
                      for _ in range(rng.randint(0, 5))]
            body = otlp.to_request(points).SerializeToString()
        else:
            events = [Event(rng.choice(["ofu.job.start", "ofu.job.end", "ofu.finding.open", "x"]), rng.getrandbits(63),
                            attrs({"ofu.job.id": hostile_label(rng)}), attrs({"ofu.finding.id": hostile_label(rng)}),
                            hostile_label(rng)) for _ in range(rng.randint(0, 3))]
            body = otlp.events_to_request(events).SerializeToString()
        body = bytearray(body)
        for _ in range(rng.choice([0, 0, 1, 3])):
            if body:
                body[rng.randrange(len(body))] = rng.randrange(256)
        if rng.random() < 0.3:
            body = bytearray(zstandard.ZstdCompressor().compress(bytes(body)))
        size = len(body) + rng.choice([0, 0, 0, -1, 1, 1 << 20])
        records.append(struct.pack(">I", max(0, size) & 0xFFFFFFFF) + bytes(body))
    data = b"".join(records)
    return data[:rng.randint(0, len(data))] if rng.random() < 0.2 else data


def run_proto_records(data: bytes) -> str:
    """The replay receiver's and the report's reading of the same protobuf records."""
    from otel_ofu.receivers.replay import ReplayFormatError, read_frames
    from otel_ofu.report.build import ReportError, build_report

    path = _scratch("rec.binpb", data)
    rejected = False
    try:
        for _ in read_frames(path, "auto", start_unix_nano=0):
            pass
    except ReplayFormatError as exc:
        _require_clear(str(exc), str(path))
        rejected = True
    try:
        build_report(path)
    except ReportError as exc:
        _require_clear(str(exc), str(path))
        return "rejected"
    return "rejected" if rejected else "accepted"


_SCRATCH = Path(tempfile.mkdtemp(prefix="otel-ofu-fuzz-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))


def _scratch(name: str, data: bytes) -> Path:
    path = _SCRATCH / f"{threading.get_ident()}-{name}"
    path.write_bytes(data)
    return path


# YAML configs -----------------------------------------------------------------------------------

def _config_seeds() -> list[bytes]:
    paths = sorted((ROOT / "collector-config").glob("*.yaml")) + sorted((ROOT / "tests" / "data" / "configs")
                                                                        .glob("*.yaml"))
    return [p.read_bytes() for p in paths if not p.name.startswith("otelcol-")]


def _mutate_yaml_tree(doc, rng: random.Random) -> None:
    scalars = ["${env:FUZZ_SET}", "${env:FUZZ_UNSET}", "${env:FUZZ_UNSET:-5s}", "$$", "${env:FUZZ_SET}x",
               "10s", "-1s", "0", "1e400", "", None, True, [], {}, "127.0.0.1:0", "x" * 300, 2 ** 70, -5,
               "${env:FUZZ_YAML}", "${env:}", "${env:A:-${env:B}}"]
    if isinstance(doc, dict):
        for key in list(doc):
            if rng.random() < 0.15:
                doc[key] = rng.choice(scalars)
            elif rng.random() < 0.03:
                doc[str(key) + rng.choice(["x", "_", ""])] = doc.pop(key)
            else:
                _mutate_yaml_tree(doc[key], rng)
    elif isinstance(doc, list):
        for i in range(len(doc)):
            if rng.random() < 0.15:
                doc[i] = rng.choice(scalars)
            else:
                _mutate_yaml_tree(doc[i], rng)


def _gen_config(rng: random.Random, corpus: list[bytes]) -> bytes:
    import yaml

    seed = rng.choice(corpus)
    r = rng.random()
    if r < 0.05:
        return rng.randbytes(rng.randint(0, 256))
    if r < 0.1:  # an alias bomb: small text, exponential tree
        depth = rng.randint(3, 12)
        lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
        lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, depth)]
        lines.append(f"receivers: {{sim: {{jobs: *a{depth - 1}}}}}")
        return "\n".join(lines).encode()
    if r < 0.5:
        try:
            doc = yaml.safe_load(seed)
        except yaml.YAMLError:
            doc = None
        if isinstance(doc, dict):
            _mutate_yaml_tree(doc, rng)
            return yaml.safe_dump(doc, allow_unicode=True).encode()
    return mutate_text(seed.decode("utf-8", "replace"), rng).encode("utf-8", "surrogatepass")


def run_config(data: bytes) -> str:
    from otel_ofu.pipeline import registry
    from otel_ofu.pipeline.config import ConfigError, load_document, parse_service_config

    os.environ.setdefault("FUZZ_SET", "4317")
    os.environ.setdefault("FUZZ_YAML", "{a: [1, 2]}")
    path = _scratch("config.yaml", data)
    try:
        parse_service_config(load_document(path), str(path), registry.factories())
    except ConfigError as exc:
        _require_clear(exc.format(), str(path))
        return "rejected"
    return "accepted"


# kubelet pod-resources replies ------------------------------------------------------------------

def _kubelet_reply(rng: random.Random) -> bytes:
    from otel_ofu.attribution.proto import podresources_v1_pb2 as pb

    reply = pb.ListPodResourcesResponse()
    for _ in range(rng.randint(0, 5)):
        pod = reply.pod_resources.add(name=hostile_label(rng), namespace=hostile_label(rng))
        for _ in range(rng.randint(0, 3)):
            container = pod.containers.add(name=hostile_label(rng))
            for _ in range(rng.randint(0, 3)):
                devices = container.devices.add(resource_name=rng.choice(
                    ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "amd.com/gpu", hostile_label(rng)]))
                ids = [f"GPU-{rng.getrandbits(32):08x}", "MIG-abc", "0", "GPU-x::3", hostile_label(rng)]
                devices.device_ids.extend(rng.choice(ids) for _ in range(rng.randint(0, 4)))
    return reply.SerializeToString()


def _gen_kubelet(rng: random.Random, corpus: list[bytes]) -> bytes:
    r = rng.random()
    if r < 0.1:
        return rng.randbytes(rng.randint(0, 256))
    reply = _kubelet_reply(rng)
    return mutate_bytes(reply, rng, corpus) if r < 0.6 else reply


def run_kubelet(data: bytes) -> str:
    from google.protobuf.message import DecodeError

    from otel_ofu.attribution.kubelet import gpu_pods
    from otel_ofu.attribution.proto import podresources_v1_pb2 as pb

    try:
        reply = pb.ListPodResourcesResponse.FromString(data)
    except DecodeError as exc:  # grpc raises this inside the client call: the source logs it, attribution carries on
        _require_clear(str(exc) or "Error parsing message")
        return "rejected"
    gpu_pods(reply, ignored=set())
    return "accepted"


# /proc and Slurm ---------------------------------------------------------------------------------

def _proc_files(rng: random.Random) -> bytes:
    a, b, c, d, e = (rng.getrandbits(bits) for bits in (32, 16, 16, 16, 48))
    uid = f"{a:08x}-{b:04x}-{c:04x}-{d:04x}-{e:012x}"
    cgroup_lines = [
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid.replace('-', '_')}.slice/"
        f"cri-containerd-{rng.getrandbits(256):064x}.scope",
        f"12:memory:/kubepods/besteffort/pod{uid}/{rng.getrandbits(256):064x}",
        f"0::/system.slice/slurmstepd.scope/job_{rng.randint(0, 10**9)}/step_{rng.choice(['0', 'batch', 'x'])}",
        f"4:devices:/slurm/uid_{rng.randint(0, 65535)}/job_{rng.randint(0, 10**9)}/step_0",
        "0::/user.slice", "garbage", "::", "1:cpu", ""]
    cgroup = "\n".join(rng.choice(cgroup_lines) for _ in range(rng.randint(0, 5)))
    env = b"\0".join(rng.choice([b"SLURM_JOB_ID=%d" % rng.randint(0, 10**9), b"SLURM_JOBID=1", b"SLURM_JOB_USER=a",
                                 b"SLURM_JOB_NAME=" + hostile_label(rng).encode(), b"PATH=/bin", b"=x", b"X",
                                 b"SLURM_JOB_ACCOUNT=\xff\xfe", b"SLURM_JOB_PARTITION="])
                     for _ in range(rng.randint(0, 8)))
    return cgroup.encode("utf-8", "surrogatepass") + b"\x00\x01SPLIT\x01\x00" + env


def _gen_proc(rng: random.Random, corpus: list[bytes]) -> bytes:
    r = rng.random()
    if r < 0.1:
        return rng.randbytes(rng.randint(0, 256))
    data = _proc_files(rng)
    return mutate_bytes(data, rng, corpus) if r < 0.6 else data


def run_proc(data: bytes) -> str:
    """A process's /proc/PID/cgroup and environ, read as the attribution processor reads them."""
    from otel_ofu.attribution.procfs import parse_pids, read_process
    from otel_ofu.attribution.slurm import ENV_KEYS, slurm_attributes

    cgroup, _, environ = data.partition(b"\x00\x01SPLIT\x01\x00")
    root = _SCRATCH / f"proc-{threading.get_ident()}"
    (root / "4242").mkdir(parents=True, exist_ok=True)
    (root / "4242" / "cgroup").write_bytes(cgroup)
    (root / "4242" / "environ").write_bytes(environ)
    info = read_process(root, 4242, ENV_KEYS)
    if info is None:
        raise AssertionError("a readable process was reported gone")
    slurm_attributes(info)
    parse_pids(cgroup.decode("utf-8", "replace"))
    return "accepted"


# --- the table ------------------------------------------------------------------------------------

TARGETS: dict[str, Target] = {t.name: t for t in [
    Target("otlp_protobuf", "OTLP/protobuf request (HTTP body, gzip or not): decode, join, OFU, re-encode",
           _otlp_seed_bytes, _gen_otlp_protobuf, run_otlp_protobuf),
    Target("otlp_json", "OTLP/JSON request: decode, join, OFU, re-encode", lambda: [
        base64.b64decode(b"e30=")], _gen_otlp_json, run_otlp_json),
    Target("otlp_http", "a live otlp receiver over HTTP: protobuf/JSON, gzip/deflate, truncated, oversized",
           lambda: [b"\x00" + s for s in _otlp_seed_bytes()], _gen_live, run_otlp_http, LIVE.start, LIVE.stop),
    Target("otlp_grpc", "a live otlp receiver over gRPC: protobuf, gzip, oversized",
           lambda: [b"\x00" + s for s in _otlp_seed_bytes()], _gen_live, run_otlp_grpc, LIVE.start, LIVE.stop),
    Target("prometheus_text", "a dcgm-exporter /metrics page (dcgm_exporter receiver)", _prom_seeds, _gen_prom,
           run_prometheus),
    Target("dmon", "a `dcgmi dmon` capture (replay receiver)", lambda: _replay_seeds("*dmon*"), _gen_dmon, run_dmon),
    Target("csv", "a CSV recording (replay receiver)", lambda: _replay_seeds("*.csv"), _gen_csv, run_csv),
    Target("otlp_json_lines", "OTLP JSON lines: the replay receiver and otel-ofu report",
           lambda: _replay_seeds("*.jsonl"), _gen_jsonl, run_jsonl),
    Target("otlp_proto_records", "OTLP protobuf records (the Collector's format: proto): replay and otel-ofu report",
           lambda: [b""], _gen_proto_records, run_proto_records),
    Target("config_yaml", "a YAML config with ${env:...}: load, substitute, validate", _config_seeds, _gen_config,
           run_config),
    Target("kubelet_pod_resources", "a kubelet pod-resources List reply", lambda: [b""], _gen_kubelet, run_kubelet),
    Target("proc_slurm", "/proc/PID/cgroup and environ: pod, container and Slurm job", lambda: [b""], _gen_proc,
           run_proc),
]}
