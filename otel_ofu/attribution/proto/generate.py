"""Regenerate the pod-resources Python stubs: ``python -m otel_ofu.attribution.proto.generate``.

Needs grpcio-tools (a development dependency only; the generated code needs just grpcio and
protobuf). protoc writes ``import podresources_v1_pb2`` in the gRPC stub; it is rewritten to a
package-relative import so the stubs work from inside ``otel_ofu``, and each file gets a
``# ruff: noqa`` header (generated code is not ours to lint).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO = "podresources_v1.proto"
NOQA = "# ruff: noqa\n"


def main() -> int:
    from grpc_tools import protoc  # development dependency

    rc = protoc.main(["grpc_tools.protoc", f"-I{HERE}", f"--python_out={HERE}", f"--pyi_out={HERE}",
                      f"--grpc_python_out={HERE}", str(HERE / PROTO)])
    if rc != 0:
        return rc
    for name in ("podresources_v1_pb2.py", "podresources_v1_pb2.pyi", "podresources_v1_pb2_grpc.py"):
        path = HERE / name
        text = re.sub(r"^import podresources_v1_pb2 as", "from . import podresources_v1_pb2 as", path.read_text(),
                      flags=re.MULTILINE)
        path.write_text(NOQA + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
