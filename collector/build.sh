#!/usr/bin/env bash
# Build the otel-ofu OpenTelemetry Collector distribution (otelcol-ofu) once and cache it.
#
#   OTELCOL=$(collector/build.sh | tail -1)
#
# The binary's absolute path is the LAST line of stdout; all progress goes to stderr.
# Cache: ${OTEL_OFU_CACHE:-$HOME/.cache/otel-ofu}/otelcol-<sha256 of manifest>/otelcol-ofu
# A repo-relative symlink .cache/otelcol-ofu is (re)pointed at the cached binary.
#
# Environment:
#   OTEL_OFU_CACHE     cache root (default $HOME/.cache/otel-ofu)
#   OTEL_OFU_MANIFEST  builder manifest (default collector/manifest.yaml)
#   GOMODCACHE/GOCACHE are left at the go defaults so downloads/compiles are reused.
set -euo pipefail

# Everything goes to stderr except the final path (printed on the original stdout, fd 3).
exec 3>&1 1>&2

log() { printf '[otelcol-build] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MANIFEST="${OTEL_OFU_MANIFEST:-$REPO_ROOT/collector/manifest.yaml}"
[[ -f "$MANIFEST" ]] || die "manifest not found: $MANIFEST"
MANIFEST="$(cd "$(dirname "$MANIFEST")" && pwd)/$(basename "$MANIFEST")"

command -v sha256sum >/dev/null || die "sha256sum not found"
HASH="$(sha256sum "$MANIFEST" | cut -d' ' -f1)"
CACHE_ROOT="${OTEL_OFU_CACHE:-$HOME/.cache/otel-ofu}"
[[ "$CACHE_ROOT" == /* ]] || CACHE_ROOT="$PWD/$CACHE_ROOT"
DIST_DIR="$CACHE_ROOT/otelcol-$HASH"
BIN="$DIST_DIR/otelcol-ofu"

# The builder version lives in the manifest ("# builder-version: vX.Y.Z") so it is part of the key.
BUILDER_VERSION="$(sed -n 's/^# *builder-version: *\(v[0-9][^ ]*\).*$/\1/p' "$MANIFEST" | head -1)"
BUILDER_VERSION="${BUILDER_VERSION:-v0.161.0}"

link_and_print() {
  local link_dir="$REPO_ROOT/.cache"
  mkdir -p "$link_dir"
  ln -sfn "$BIN" "$link_dir/otelcol-ofu"
  printf '%s\n' "$BIN" >&3
}

binary_ok() {
  [[ -x "$BIN" ]] && "$BIN" --version >/dev/null 2>&1
}

# Fast path: cached binary present and runnable.
if binary_ok; then
  log "cached: $BIN"
  link_and_print
  exit 0
fi

command -v go >/dev/null || die "go not found on PATH (need Go >= 1.26)"
mkdir -p "$CACHE_ROOT"

# Serialise concurrent builds of the same manifest.
if command -v flock >/dev/null; then
  exec 9>"$CACHE_ROOT/.lock-$HASH"
  flock 9
  if binary_ok; then   # someone else finished it while we waited
    log "cached (built concurrently): $BIN"
    link_and_print
    exit 0
  fi
fi

START=$(date +%s)

# 1. Install the pinned builder (ocb) into a GOBIN inside the cache.
GOBIN_DIR="$CACHE_ROOT/builder-$BUILDER_VERSION/bin"
BUILDER="$GOBIN_DIR/builder"
if [[ ! -x "$BUILDER" ]]; then
  log "installing go.opentelemetry.io/collector/cmd/builder@$BUILDER_VERSION into $GOBIN_DIR"
  mkdir -p "$GOBIN_DIR"
  GOBIN="$GOBIN_DIR" go install "go.opentelemetry.io/collector/cmd/builder@$BUILDER_VERSION"
fi
"$BUILDER" version >&2 || true

# 2. Build into a staging dir, then move into place atomically.
#    Builder v0.161.0 has no --output-path flag, so a copy of the manifest with
#    dist.output_path rewritten to the staging dir is handed to it.
STAGE="$CACHE_ROOT/.stage-$HASH-$$"
rm -rf "$STAGE"
mkdir -p "$STAGE"
trap 'rm -rf "$STAGE"' EXIT
STAGE_MANIFEST="$STAGE/manifest.yaml"
sed "s|^\(  output_path:\).*$|\1 $STAGE/dist|" "$MANIFEST" > "$STAGE_MANIFEST"
grep -q "^  output_path: $STAGE/dist\$" "$STAGE_MANIFEST" \
  || die "manifest must contain a 'dist:' key with an indented '  output_path:' line"

log "building otelcol-ofu (manifest sha256 $HASH); this takes minutes on a cold cache"
"$BUILDER" --config "$STAGE_MANIFEST" >&2

[[ -x "$STAGE/dist/otelcol-ofu" ]] || die "builder finished but $STAGE/dist/otelcol-ofu is missing"
cp "$MANIFEST" "$STAGE/dist/manifest.source.yaml"

# 3. Verify the binary runs before publishing it.
"$STAGE/dist/otelcol-ofu" --version >&2 || die "built binary fails --version"
"$STAGE/dist/otelcol-ofu" components > "$STAGE/dist/components.txt" \
  || die "built binary fails 'components'"

rm -rf "$DIST_DIR"
mv "$STAGE/dist" "$DIST_DIR"
log "built in $(( $(date +%s) - START ))s: $BIN"
binary_ok || die "binary at $BIN is not runnable after move"
link_and_print
