"""Run ``otel-ofu`` as a container of a pod runs it, for tests: the service account mount at a test's path.

In a pod the kubelet mounts the service account's token and the cluster CA at
/var/run/secrets/kubernetes.io/serviceaccount, and the Kubernetes client reads them from there
(``load_incluster_config``). Here that directory is ``MOUNT``, the token a real one the test
API server issued for the chart's ServiceAccount; everything else is otel-ofu's own command line.

    python -m tests.pod_process MOUNT run --config config.yaml
"""

from __future__ import annotations

import sys
from pathlib import Path

from kubernetes.config import incluster_config


def main() -> int:
    mount, args = Path(sys.argv[1]), sys.argv[2:]
    incluster_config.SERVICE_TOKEN_FILENAME = str(mount / "token")
    incluster_config.SERVICE_CERT_FILENAME = str(mount / "ca.crt")
    from otel_ofu.cli.main import main as otel_ofu

    return otel_ofu(args)


if __name__ == "__main__":
    raise SystemExit(main())
