#!/usr/bin/env bash
# Install etcd from Debian (apt-get install etcd-server) if it is not already on PATH.
# Idempotent. Prints the absolute path of the etcd binary as the LAST line of stdout;
# progress goes to stderr:   ETCD=$(collector/install-etcd.sh | tail -1)
# The Kubernetes API tests run etcd themselves under kube-apiserver (own data dir, own ports;
# tests/kube_apiserver.py); the Debian service is never started (collector/install-debian-package.sh).
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/install-debian-package.sh" etcd-server etcd
