#!/usr/bin/env bash
# Build the otel-ofu image from the repository's Dockerfile and, with --push, push it to your
# registry: one command, tagged exactly as the Helm chart's defaults name it (docs/deploy.md,
# "The image"), so the install only needs the registry.
#
#   deploy/image.sh                                    # otel-ofu:<version>, local (kind, minikube, a node)
#   deploy/image.sh --push registry.example.com/gpu    # also registry.example.com/gpu/otel-ofu:<version>, pushed
#   deploy/image.sh --dcgm --push registry.example.com/gpu   # <version>-dcgm: with DCGM's bindings (source: dcgm)
#   deploy/image.sh --dry-run --push registry.example.com/gpu   # print the commands, run nothing
#
# then:
#   helm install ofu deploy/helm/otel-ofu -n gpu-monitoring --create-namespace --set image.registry=registry.example.com/gpu
#
# <version> is otel_ofu.__version__, the chart's appVersion (tests/test_version.py). DOCKER picks the
# client (docker by default; podman takes the same commands); extra arguments after -- go to its build.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DOCKER="${DOCKER:-docker}"
registry="" flavour="" dry_run=false build_args=()
usage() { sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while (($#)); do
  case "$1" in
    --push) registry="${2:?--push needs a registry, e.g. registry.example.com/gpu}"; registry="${registry%/}"; shift 2 ;;
    --dcgm) flavour="-dcgm"; build_args+=(--build-arg DCGM_STAGE=dcgm); shift ;;
    --dry-run) dry_run=true; shift ;;
    -h|--help) usage 0 ;;
    --) shift; build_args+=("$@"); break ;;
    *) echo "deploy/image.sh: unknown argument $1" >&2; usage 2 ;;
  esac
done
version="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$ROOT/otel_ofu/__init__.py")"
[[ -n "$version" ]] || { echo "deploy/image.sh: no __version__ in otel_ofu/__init__.py" >&2; exit 1; }
local_tag="otel-ofu:${version}${flavour}"

run() {
  printf '%q ' "$@"; echo
  if ! $dry_run; then "$@"; fi
}

run "$DOCKER" build -t "$local_tag" ${build_args[@]+"${build_args[@]}"} "$ROOT"
if [[ -n "$registry" ]]; then
  run "$DOCKER" tag "$local_tag" "$registry/$local_tag"
  run "$DOCKER" push "$registry/$local_tag"
  echo "install: helm install ofu deploy/helm/otel-ofu -n gpu-monitoring --create-namespace --set image.registry=$registry${flavour:+ --set source=dcgm}"
else
  echo "built $local_tag (local only: --push REGISTRY to push it)"
fi
