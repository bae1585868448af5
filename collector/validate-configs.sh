#!/usr/bin/env bash
# Validate every collector-config/otelcol-*.yaml with the otelcol-ofu binary.
#
#   collector/validate-configs.sh            # builds/locates the collector via collector/build.sh
#   OTELCOL=/path/to/otelcol-ofu collector/validate-configs.sh
#
# Env vars the configs reference without a default get a throwaway placeholder if unset
# (OFU_COLLECTOR_FILE_PATH, OFU_JOBS_ENDPOINTS), so validation does not depend on the caller's environment.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CONFIG_DIR="$REPO_ROOT/collector-config"

shopt -s nullglob
configs=("$CONFIG_DIR"/otelcol-*.yaml)
if [[ ! -d "$CONFIG_DIR" || ${#configs[@]} -eq 0 ]]; then
  echo "validate-configs: no collector-config/otelcol-*.yaml files; nothing to validate"
  exit 0
fi

if [[ -z "${OTELCOL:-}" ]]; then
  OTELCOL="$("$REPO_ROOT/collector/build.sh" | tail -1)"
fi
[[ -x "$OTELCOL" ]] || { echo "validate-configs: OTELCOL=$OTELCOL is not executable" >&2; exit 1; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export OFU_COLLECTOR_FILE_PATH="${OFU_COLLECTOR_FILE_PATH:-$tmp/validate-sink.jsonl}"
export OFU_JOBS_ENDPOINTS="${OFU_JOBS_ENDPOINTS:-[127.0.0.1:14317, 127.0.0.1:14327]}"

failed=0
for cfg in "${configs[@]}"; do
  rel="${cfg#"$REPO_ROOT"/}"
  if out="$("$OTELCOL" validate --config="file:$cfg" 2>&1)"; then
    echo "ok      $rel"
  else
    echo "FAILED  $rel"
    printf '%s\n' "$out" | sed 's/^/    /'
    failed=$((failed + 1))
  fi
done

echo "validate-configs: $(( ${#configs[@]} - failed )) valid, $failed invalid"
[[ $failed -eq 0 ]]
