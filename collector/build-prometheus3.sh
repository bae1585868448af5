#!/usr/bin/env bash
# Build Prometheus 3 (server and promtool) from Go modules once and cache it: the tests send OTLP
# straight into it (its native OTLP receiver) and run the dashboards' queries and the rules there.
# Debian's prometheus package (install-prometheus.sh) is 2.x, which has no such receiver.
#
#   PROMETHEUS3=$(collector/build-prometheus3.sh | tail -1)     # .../bin/prometheus; promtool beside it
#
# The Go module's v0.3xx.y is Prometheus 3.xx.y. The web UI's assets are not built (the API is
# all the tests use). -X stamps the version that /api/v1/status/buildinfo and --version report.
# The tag remove_all_sd leaves out every service discovery (AWS, Azure, GCE, Kubernetes, ...: most
# of the build) but static_configs, which is all the tests use.
set -euo pipefail
MODULE_VERSION=v0.316.0
RELEASE=3.16.0
VERSION_PKG=github.com/prometheus/common/version
GO_BUILD_TAGS=remove_all_sd exec "$(dirname "${BASH_SOURCE[0]}")/go-install-cached.sh" prometheus3 \
  "-X $VERSION_PKG.Version=$RELEASE -X $VERSION_PKG.Branch=HEAD -X $VERSION_PKG.Revision=$MODULE_VERSION" \
  "github.com/prometheus/prometheus/cmd/prometheus@$MODULE_VERSION" \
  "github.com/prometheus/prometheus/cmd/promtool@$MODULE_VERSION"
