#!/usr/bin/env bash
# Headroom on kind, for users with Docker. NOT exercised by CI here (CI has no
# Docker engine; it runs the same manifests against a real control plane built
# from source, see tests/e2e). kind nodes have no GPUs and no
# nvidia.com/gpu.present label, so the agent DaemonSet runs no pod at all; label
# and fake a node as docs/kind.md shows to try scheduling.
#
#   hack/kind-up.sh            # cluster "headroom", image built and loaded
#   CLUSTER=name hack/kind-up.sh
set -euo pipefail

cluster=${CLUSTER:-headroom}
image=ghcr.io/headroom-dev/headroom:0.1.0
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

for tool in docker kind kubectl; do
  command -v "$tool" >/dev/null || { echo "kind-up: $tool is required" >&2; exit 1; }
done

if ! kind get clusters 2>/dev/null | grep -qx "$cluster"; then
  kind create cluster --name "$cluster" --wait 120s
fi
docker build -t "$image" "$root"
kind load docker-image --name "$cluster" "$image"
# The CRDs first: one apply cannot create them and the GPUSharingPolicies that use them.
kubectl --context "kind-$cluster" apply --server-side -f "$root/manifests/base/crds/"
kubectl --context "kind-$cluster" wait --for=condition=Established --timeout=60s -f "$root/manifests/base/crds/"
kubectl --context "kind-$cluster" apply --server-side -k "$root/manifests/base"
kubectl --context "kind-$cluster" -n headroom-system wait --for=condition=complete job/headroom-certs --timeout=120s
kubectl --context "kind-$cluster" -n headroom-system rollout status deployment/headroom-webhook --timeout=180s
kubectl --context "kind-$cluster" -n headroom-system rollout status deployment/headroom-scheduler --timeout=180s
echo "Headroom is up on kind-$cluster. Try: kubectl label namespace default headroom.dev/policy=gpu-shared"
