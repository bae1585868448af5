#!/usr/bin/env bash
# Build VictoriaMetrics single-node and vmalert (its rule evaluator) from Go modules once and
# cache them: the tests send OTLP straight into VictoriaMetrics (/opentelemetry/v1/metrics), run
# the dashboards' queries there and evaluate the recording and alerting rules with vmalert.
#
#   VICTORIAMETRICS=$(collector/build-victoriametrics.sh | tail -1)   # .../bin/victoria-metrics; vmalert beside it
#
# v1.151.0 builds with this machine's Go (1.26); newer releases may ask for a newer Go.
set -euo pipefail
VERSION=v1.151.0
exec "$(dirname "${BASH_SOURCE[0]}")/go-install-cached.sh" victoriametrics \
  "-X github.com/VictoriaMetrics/VictoriaMetrics/lib/buildinfo.Version=victoria-metrics-$VERSION" \
  "github.com/VictoriaMetrics/VictoriaMetrics/app/victoria-metrics@$VERSION" \
  "github.com/VictoriaMetrics/VictoriaMetrics/app/vmalert@$VERSION"
