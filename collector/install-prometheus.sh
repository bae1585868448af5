#!/usr/bin/env bash
# Install Prometheus (and promtool) from Debian (apt-get install prometheus) if it is not already
# on PATH. Idempotent. Prints the absolute path of the prometheus binary as the LAST line of
# stdout; progress goes to stderr:   PROMETHEUS=$(collector/install-prometheus.sh | tail -1)
# The tests run prometheus themselves; the Debian service is never started
# (collector/install-debian-package.sh).
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/install-debian-package.sh" prometheus prometheus
