#!/usr/bin/env bash
# Build programs with `go install PKG@VERSION` once and cache them, for servers the tests run
# that are published as Go modules (Prometheus 3, VictoriaMetrics and its vmalert):
#
#   [GO_BUILD_TAGS=tag,...] collector/go-install-cached.sh NAME LDFLAGS PKG@VERSION [PKG@VERSION ...]
#
# The FIRST package's binary path is the LAST line of stdout (the others lie beside it, in the
# same bin/ folder); all progress goes to stderr.
# Cache: ${OTEL_OFU_CACHE:-$HOME/.cache/otel-ofu}/NAME-<sha256 of the arguments, tags and this file>/bin/
# so a new version, new flags or a change here builds once, and concurrent callers wait on a lock
# for the one build. Used by build-prometheus3.sh and build-victoriametrics.sh.
#
# Environment:
#   OTEL_OFU_CACHE     cache root (default $HOME/.cache/otel-ofu)
#   GOMODCACHE/GOCACHE are left at the go defaults so downloads/compiles are reused.
set -euo pipefail
exec 3>&1 1>&2

[[ $# -ge 3 ]] || { echo "usage: $0 NAME LDFLAGS PKG@VERSION [PKG@VERSION ...]" >&2; exit 2; }
NAME="$1"; LDFLAGS="$2"; shift 2
PACKAGES=("$@")
TAGS="${GO_BUILD_TAGS:-}"

log() { printf '[%s-build] %s\n' "$NAME" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
HASH="$( { cat "$SELF"; printf '%s\n' "$NAME" "$LDFLAGS" "tags=$TAGS" "${PACKAGES[@]}"; } | sha256sum | cut -d' ' -f1)"
CACHE_ROOT="${OTEL_OFU_CACHE:-$HOME/.cache/otel-ofu}"
[[ "$CACHE_ROOT" == /* ]] || CACHE_ROOT="$PWD/$CACHE_ROOT"
DIST_DIR="$CACHE_ROOT/$NAME-$HASH"

binaries=()
for pkg in "${PACKAGES[@]}"; do
  path="${pkg%@*}"
  binaries+=("${path##*/}")
done
BIN="$DIST_DIR/bin/${binaries[0]}"

binary_ok() {
  local b
  for b in "${binaries[@]}"; do
    [[ -x "$DIST_DIR/bin/$b" ]] && "$DIST_DIR/bin/$b" --version >/dev/null 2>&1 || return 1
  done
}

if binary_ok; then
  log "cached: $BIN"
  printf '%s\n' "$BIN" >&3
  exit 0
fi

command -v go >/dev/null || die "go not found on PATH"
mkdir -p "$CACHE_ROOT"
if command -v flock >/dev/null; then
  exec 9>"$CACHE_ROOT/.lock-$NAME-$HASH"
  flock 9
  if binary_ok; then
    log "cached (built concurrently): $BIN"
    printf '%s\n' "$BIN" >&3
    exit 0
  fi
fi

START=$(date +%s)
STAGE="$CACHE_ROOT/.stage-$NAME-$HASH-$$"
rm -rf "$STAGE"
mkdir -p "$STAGE/bin"
trap 'rm -rf "$STAGE"' EXIT
for pkg in "${PACKAGES[@]}"; do
  log "go install $pkg (minutes on a cold Go cache)"
  GOBIN="$STAGE/bin" go install -tags "$TAGS" -ldflags "$LDFLAGS" "$pkg"
done
for b in "${binaries[@]}"; do
  "$STAGE/bin/$b" --version >&2 || die "built $b fails --version"
done
rm -rf "$DIST_DIR"
mv "$STAGE" "$DIST_DIR"
log "built in $(( $(date +%s) - START ))s: $BIN"
binary_ok || die "binaries in $DIST_DIR/bin are not runnable after the move"
printf '%s\n' "$BIN" >&3
