"""A serialized NumberDataPoint read as bytes: its layout, its attributes as label pairs.

Why bytes: reading labels through protobuf objects costs about 1 us each, and a
dcgm-exporter scrape's label values repeat across GPUs and requests. The join's hot path
(:class:`otel_ofu.otlp.join.points.Joiner`) reads a point's time and value at fixed offsets
and identifies its GPU by the bytes of its attributes; this module says where those lie and
decodes each distinct serialized label once. Anything laid out otherwise is left to protobuf.

Invariant: a point's label pairs read here equal its attributes as protobuf decodes them, each
value as :func:`label_text` writes the decoded value (tests/test_otlp_join_wire.py
``test_string_attributes_read_as_protobuf_does``, on random attribute values).
"""

from __future__ import annotations

import struct
from typing import Any

from otel_ofu.otlp.codec import from_any_value
from otel_ofu.pipeline.caches import Cache


def label_text(value: Any) -> str:
    """An attribute value as the label text a Prometheus scrape would have carried.

    Why: a Collector processor (transform, k8sattributes) or a non-Prometheus sender may put
    ``gpu`` as an int or ``UUID`` as bytes; read as strings only, they became "" and the GPU
    lost its index or identity. Whole doubles print as ints (``0.0`` -> ``"0"``).
    """
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def any_text(value: Any) -> str:
    """An OTLP AnyValue as label text (see :func:`label_text`)."""
    return label_text(from_any_value(value))


FIXED64_TAGS = frozenset({0x11, 0x19, 0x21, 0x31})  # NumberDataPoint start time, time, as_double, as_int
VALUE_TAGS = frozenset({0x21, 0x31})  # NumberDataPoint as_double, as_int
ATTRIBUTES_TAG = 0x3A  # NumberDataPoint.attributes, field 7
TIME_DOUBLE = struct.Struct("<BQBd")  # time_unix_nano then as_double, with their tags
TIME_INT = struct.Struct("<BQBq")  # time_unix_nano then as_int

KEY_VALUE_CACHE_SIZE = 32768  # distinct serialized label KeyValues kept decoded (bounded memory)
key_values: Cache = Cache("otlp join label pairs", KEY_VALUE_CACHE_SIZE)  # serialized KeyValue -> (key, value)


def string_key_value(data: bytes) -> tuple[str, str] | None:
    """(key, string value) of one serialized KeyValue field, if it is exactly that and short."""
    # 0x3a size | 0x0a key_size key | 0x12 value_size | 0x0a string_size string, every size < 128
    n = len(data)
    if n < 8 or data[1] != n - 2 or data[2] != 0x0A or not 0 < data[3] < 0x80:
        return None
    key_end = 4 + data[3]
    if key_end + 4 > n or data[key_end] != 0x12 or data[key_end + 1] != n - key_end - 2:
        return None  # the value (an AnyValue) must run to the end
    if data[key_end + 2] != 0x0A or data[key_end + 3] != n - key_end - 4:
        return None  # and hold nothing but its string_value
    return data[4:key_end].decode(), data[key_end + 4:].decode()


def string_attributes(data: bytes) -> list[tuple[str, str]] | None:
    """Each attribute's (key, string value) from a point's serialized attributes, or None.

    Why: reading labels through protobuf objects costs about 1 us each, and most label
    values (model, host, pod, driver, index) repeat across GPUs and requests; each distinct
    serialized KeyValue is decoded once. Anything but plain short string attributes (other
    value types, long values, trailing fields) gives None: the caller reads protobuf instead.
    """
    out = []
    cache = key_values
    i, n = 0, len(data)
    while i < n:
        size = data[i + 1] if i + 1 < n else 0x80
        if data[i] != ATTRIBUTES_TAG or size >= 0x80:
            return None
        end = i + 2 + size
        chunk = data[i:end]
        pair = cache.get(chunk)
        if pair is None:
            pair = string_key_value(chunk)
            if pair is None:
                return None
            cache.put(chunk, pair)
        out.append(pair)
        i = end
    return out


def attributes_part(point: bytes) -> bytes:
    """The part of a serialized NumberDataPoint from its first attribute on (the whole point if unusual).

    Protobuf writes fields in number order, so that part holds every attribute and, after
    them, only the flags: two points with the same bytes there have the same attributes.
    """
    i, n = 0, len(point)
    while i < n:
        tag = point[i]
        if tag in FIXED64_TAGS:
            i += 9
        elif tag == ATTRIBUTES_TAG:
            return point[i:]
        else:
            break
    return point
