#!/usr/bin/env bash
# Render the plain manifests in this folder from the Helm chart: default.yaml with the chart's
# default values (what `helm install` without values installs), and one file per example values
# file (deploy/helm/otel-ofu/examples/NAME.yaml -> deploy/kubernetes/NAME.yaml). Run after changing
# the chart or an example; tests/test_deploy_helm.py fails while a file is out of date.
#
#   deploy/kubernetes/render.sh
#
# Helm comes from collector/build-helm.sh (built from Go modules once, cached); $HELM overrides.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HELM="${HELM:-$("$ROOT/collector/build-helm.sh" | tail -1)}"
CHART="$ROOT/deploy/helm/otel-ofu"
OUT="$ROOT/deploy/kubernetes"
RELEASE=otel-ofu
NAMESPACE=gpu-monitoring
# helm template sees no cluster: a Helm built with a plain `go install` would assume Kubernetes 1.20,
# which the chart's kubeVersion refuses. The OTLP token's Secret is named, not rendered: a token in a
# file everybody has is no secret (tests/deploy_util.py: KUBE_VERSION, PLAIN_MANIFEST_SETS).
ARGS=(--namespace "$NAMESPACE" --kube-version 1.31.0 --set agent.otlpReceiver.auth.existingSecret=otel-ofu-otlp-token)
TOKEN_STEP="kubectl -n $NAMESPACE create secret generic otel-ofu-otlp-token --from-literal=token=\$(openssl rand -hex 24)"

rm -f "$OUT"/*.yaml
{
  echo "# Rendered from the Helm chart deploy/helm/otel-ofu with its default values by"
  echo "# deploy/kubernetes/render.sh (do not edit: change the chart, then re-run it)."
  echo "# Namespace $NAMESPACE; release $RELEASE. Create the namespace and the training jobs' OTLP token, then:"
  echo "#   $TOKEN_STEP"
  echo "#   kubectl apply -f deploy/kubernetes/default.yaml"
  "$HELM" template "$RELEASE" "$CHART" "${ARGS[@]}"
} > "$OUT/default.yaml"
echo "$OUT/default.yaml"
for values in "$CHART"/examples/*.yaml; do
  name="$(basename "$values" .yaml)"
  {
    echo "# Rendered from the Helm chart deploy/helm/otel-ofu with examples/$name.yaml by"
    echo "# deploy/kubernetes/render.sh (do not edit: change the chart or the example, then re-run it)."
    echo "# Namespace $NAMESPACE; release $RELEASE. Create the namespace and the training jobs' OTLP token, then:"
    echo "#   $TOKEN_STEP"
    echo "#   kubectl apply -f deploy/kubernetes/$name.yaml"
    "$HELM" template "$RELEASE" "$CHART" "${ARGS[@]}" -f "$values"
  } > "$OUT/$name.yaml"
  echo "$OUT/$name.yaml"
done
