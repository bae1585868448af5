#!/usr/bin/env bash
# Wheels for benchmarks/device_run.sh on the GPU machine, which has no network: otel-ofu's own
# wheel plus every runtime dependency in pyproject.toml (and theirs), for CPython 3.12 on
# manylinux x86-64, into benchmarks/.wheels (git-ignored; ~11 MB, carried by the device tool's
# `carry`). Run it here, where pip can reach PyPI, before the device call (see device_run.sh).
#
# Left out: matplotlib (and numpy, pillow, ... under it, ~40 MB): the GPU image has it, and
# only `otel-ofu report`'s plots import it. torch is the image's own.
#
#   benchmarks/device_wheels.sh                           # Python 3.12 (the GPU machine's)
#   DEVICE_PYTHON_VERSION=3.11 DEVICE_WHEELS=/tmp/w benchmarks/device_wheels.sh   # to try the install here
set -euo pipefail
cd "$(dirname "$0")/.."
wheels=${DEVICE_WHEELS:-benchmarks/.wheels}
pyver=${DEVICE_PYTHON_VERSION:-3.12}
py=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
leave_out='^(matplotlib)$'
max_mb=40

rm -rf "$wheels"
mkdir -p "$wheels"
mapfile -t deps < <("$py" - "$leave_out" <<'PY'
import re, sys, tomllib
for req in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]:
    name = re.split(r"[ <>=!~;\[]", req, maxsplit=1)[0]
    if not re.match(sys.argv[1], name, re.I):
        print(req)
PY
)
echo "device_wheels: otel-ofu and ${#deps[@]} dependencies for CPython $pyver into $wheels" >&2
"$py" -m pip wheel -q --no-deps --disable-pip-version-check -w "$wheels" .
"$py" -m pip download -q --disable-pip-version-check --only-binary=:all: --python-version "$pyver" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$wheels" "${deps[@]}"
"$py" benchmarks/device_run.py --manifest "$wheels" --manifest-python-version "$pyver"
size_mb=$(du -sm "$wheels" | cut -f1)
if [ "$size_mb" -gt "$max_mb" ]; then
    echo "device_wheels: $wheels is ${size_mb} MB, over ${max_mb} MB: the device tool carries 64 MiB in all" >&2
    exit 1
fi
ls "$wheels" >&2
echo "device_wheels: ${size_mb} MB in $(ls "$wheels"/*.whl | wc -l) wheels" >&2
echo "$wheels"
