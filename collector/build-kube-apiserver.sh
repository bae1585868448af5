#!/usr/bin/env bash
# Build a real kube-apiserver from Go modules once and cache it (the Kubernetes API tests run
# otel-ofu's pod watch against it).
#
#   KUBE_APISERVER=$(collector/build-kube-apiserver.sh | tail -1)
#
# The binary's absolute path is the LAST line of stdout; all progress goes to stderr.
# Cache: ${OTEL_OFU_CACHE:-$HOME/.cache/otel-ofu}/kube-apiserver-<sha256 of this script>/kube-apiserver
#
# `go install k8s.io/kubernetes/cmd/kube-apiserver@vX` is refused because k8s.io/kubernetes's
# go.mod replaces its staging modules (k8s.io/api, apimachinery, client-go, ...) with local
# paths. So a throwaway module requires k8s.io/kubernetes and replaces every staging module
# named in that go.mod's replace block with the published module at the matching v0.x tag.
# About 5 minutes on 2 cores with a cold Go cache.
#
# Environment:
#   OTEL_OFU_CACHE   cache root (default $HOME/.cache/otel-ofu)
#   GOMODCACHE/GOCACHE are left at the go defaults so downloads/compiles are reused.
set -euo pipefail
exec 3>&1 1>&2

# The version is part of this file, so the cache key (this file's hash) changes with it.
KUBERNETES_VERSION="v1.34.4"
STAGING_VERSION="v0.${KUBERNETES_VERSION#v1.}"   # v1.34.4 -> v0.34.4

log() { printf '[kube-apiserver-build] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

SCRIPT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
HASH="$(sha256sum "$SCRIPT" | cut -d' ' -f1)"
CACHE_ROOT="${OTEL_OFU_CACHE:-$HOME/.cache/otel-ofu}"
[[ "$CACHE_ROOT" == /* ]] || CACHE_ROOT="$PWD/$CACHE_ROOT"
DIST_DIR="$CACHE_ROOT/kube-apiserver-$HASH"
BIN="$DIST_DIR/kube-apiserver"

binary_ok() { [[ -x "$BIN" ]] && "$BIN" --version >/dev/null 2>&1; }

if binary_ok; then
  log "cached: $BIN"
  printf '%s\n' "$BIN" >&3
  exit 0
fi

command -v go >/dev/null || die "go not found on PATH"
mkdir -p "$CACHE_ROOT"
if command -v flock >/dev/null; then
  exec 9>"$CACHE_ROOT/.lock-kube-apiserver-$HASH"
  flock 9
  if binary_ok; then
    log "cached (built concurrently): $BIN"
    printf '%s\n' "$BIN" >&3
    exit 0
  fi
fi

START=$(date +%s)
STAGE="$CACHE_ROOT/.stage-kube-apiserver-$HASH-$$"
rm -rf "$STAGE"
mkdir -p "$STAGE/src"
trap 'rm -rf "$STAGE"' EXIT
cd "$STAGE/src"

log "reading the staging modules from k8s.io/kubernetes@$KUBERNETES_VERSION's go.mod"
GOMOD_FILE="$(go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" \
  | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')"
[[ -f "$GOMOD_FILE" ]] || die "could not download k8s.io/kubernetes@$KUBERNETES_VERSION's go.mod"
mapfile -t STAGING < <(sed -n '/^replace (/,/^)/s|^[[:space:]]*\(k8s\.io/[^ ]*\) => \./staging/.*$|\1|p' "$GOMOD_FILE")
(( ${#STAGING[@]} > 0 )) || die "no staging replacements found in $GOMOD_FILE"
log "${#STAGING[@]} staging modules pinned at $STAGING_VERSION"

GO_VERSION="$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$GOMOD_FILE" | head -1)"
{
  printf 'module otel-ofu.local/kube-apiserver\n\ngo %s\n\n' "${GO_VERSION:-1.24}"
  printf 'require k8s.io/kubernetes %s\n\nreplace (\n' "$KUBERNETES_VERSION"
  for module in "${STAGING[@]}"; do
    printf '\t%s => %s %s\n' "$module" "$module" "$STAGING_VERSION"
  done
  printf ')\n'
} > go.mod
cat > tools.go <<'EOF'
//go:build tools

package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
EOF

log "go mod tidy"
go mod tidy >&2
log "go build k8s.io/kubernetes/cmd/kube-apiserver (minutes on a cold cache)"
mkdir -p "$STAGE/dist"
MINOR="${KUBERNETES_VERSION#v1.}"; MINOR="${MINOR%%.*}"
VERSION_PKG=k8s.io/component-base/version
CGO_ENABLED=0 go build -trimpath -o "$STAGE/dist/kube-apiserver" \
  -ldflags="-s -w -X $VERSION_PKG.gitVersion=$KUBERNETES_VERSION -X $VERSION_PKG.gitMajor=1 -X $VERSION_PKG.gitMinor=$MINOR" \
  k8s.io/kubernetes/cmd/kube-apiserver
"$STAGE/dist/kube-apiserver" --version >&2 || die "built binary fails --version"
cp go.mod "$STAGE/dist/go.mod.source"

rm -rf "$DIST_DIR"
mv "$STAGE/dist" "$DIST_DIR"
log "built in $(( $(date +%s) - START ))s: $BIN"
binary_ok || die "binary at $BIN is not runnable after move"
printf '%s\n' "$BIN" >&3
