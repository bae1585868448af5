#!/usr/bin/env bash
# Build Helm from Go modules once and cache it (Helm is not a Debian package here).
#
#   HELM=$(collector/build-helm.sh | tail -1)
#
# The binary's absolute path is the LAST line of stdout; all progress goes to stderr.
# Cache: ${OTEL_OFU_CACHE:-$HOME/.cache/otel-ofu}/helm-<version>/bin/helm
# The version pinned below is the cache key: changing it builds the new version once.
#
# Environment:
#   OTEL_OFU_CACHE     cache root (default $HOME/.cache/otel-ofu)
#   GOMODCACHE/GOCACHE are left at the go defaults so downloads/compiles are reused.
set -euo pipefail
exec 3>&1 1>&2

HELM_VERSION=v3.22.0
K8S_MINOR=37   # helm v3.22.0's go.mod: k8s.io/client-go v0.37.0

log() { printf '[helm-build] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

CACHE_ROOT="${OTEL_OFU_CACHE:-$HOME/.cache/otel-ofu}"
[[ "$CACHE_ROOT" == /* ]] || CACHE_ROOT="$PWD/$CACHE_ROOT"
DIST_DIR="$CACHE_ROOT/helm-$HELM_VERSION-k8s1.$K8S_MINOR"
BIN="$DIST_DIR/bin/helm"

binary_ok() { [[ -x "$BIN" ]] && "$BIN" version --template '{{.Version}}' 2>/dev/null | grep -qx "$HELM_VERSION"; }

if binary_ok; then
  log "cached: $BIN"
  printf '%s\n' "$BIN" >&3
  exit 0
fi

command -v go >/dev/null || die "go not found on PATH"
mkdir -p "$CACHE_ROOT"
if command -v flock >/dev/null; then
  exec 9>"$CACHE_ROOT/.lock-helm-$HELM_VERSION-k8s1.$K8S_MINOR"
  flock 9
  if binary_ok; then
    log "cached (built concurrently): $BIN"
    printf '%s\n' "$BIN" >&3
    exit 0
  fi
fi

START=$(date +%s)
STAGE="$CACHE_ROOT/.stage-helm-$HELM_VERSION-$$"
rm -rf "$STAGE"
mkdir -p "$STAGE/bin"
trap 'rm -rf "$STAGE"' EXIT
log "go install helm.sh/helm/v3/cmd/helm@$HELM_VERSION (a few minutes on a cold cache)"
# Helm's Makefile stamps, with -X, its version (else `helm version` says only "v3.22") and the
# Kubernetes version that `helm template` and `helm lint` assume (else 1.20): client-go's v0.N is
# Kubernetes 1.N.
LDFLAGS="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
  LDFLAGS+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$K8S_MINOR"
done
GOBIN="$STAGE/bin" go install -ldflags "$LDFLAGS" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
"$STAGE/bin/helm" version >&2 || die "built helm fails 'version'"
rm -rf "$DIST_DIR"
mv "$STAGE" "$DIST_DIR"
log "built in $(( $(date +%s) - START ))s: $BIN"
binary_ok || die "binary at $BIN is not runnable after move"
printf '%s\n' "$BIN" >&3
