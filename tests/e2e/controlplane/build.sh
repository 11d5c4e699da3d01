#!/usr/bin/env bash
# Builds the real control plane Headroom's e2e tests and demo run against:
# kube-apiserver, kube-scheduler, kube-controller-manager, kubectl and etcd from
# the pinned Kubernetes release, kwok/kwokctl, and rulecheck (Prometheus's rule
# parser and engine: tests/headroom/test_monitoring.py checks and evaluates the
# PrometheusRule with it, as promtool would). Binaries go to a cache
# outside the repository, keyed by version, and are never rebuilt when present.
#
#   tests/e2e/controlplane/build.sh            # prints the bin directory last
#   HEADROOM_CACHE=/somewhere build.sh          # cache root (default ~/.cache/headroom)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
k8s_version=$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' "$here/k8s/go.mod")
kwok_version=$(awk '$1 == "require" && $2 == "sigs.k8s.io/kwok" {print $3; exit}' "$here/kwok/go.mod")
cache=${HEADROOM_CACHE:-$HOME/.cache/headroom}
bin="$cache/k8s-${k8s_version}-kwok-${kwok_version}/bin"

k8s_tools=(
  "kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver"
  "kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager"
  "kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler"
  "kubectl k8s.io/kubernetes/cmd/kubectl"
  "etcd go.etcd.io/etcd/server/v3"
)
kwok_tools=(
  "kwok sigs.k8s.io/kwok/cmd/kwok"
  "kwokctl sigs.k8s.io/kwok/cmd/kwokctl"
)

log_tag=controlplane
# shellcheck source=lib.sh
source "$here/lib.sh"

# Named by its sources (main.go is Headroom's own, and changes): once they change,
# a new name is built, and a rulecheck of the old ones is never taken for it.
prometheus_tools=(
  "rulecheck-$(sources_digest "$here/prometheus") headroom.dev/controlplane/prometheus/rulecheck"
)

command -v go >/dev/null || { log "go is not installed; it is needed to build the control plane"; exit 1; }
mkdir -p "$bin"
total=$SECONDS
log "Kubernetes $k8s_version, KWOK $kwok_version -> $bin"
build "$here/k8s" "$bin" "$(k8s_stamp "$k8s_version")" "${k8s_tools[@]}"
build "$here/kwok" "$bin" "" "${kwok_tools[@]}"
build "$here/prometheus" "$bin" "" "${prometheus_tools[@]}"
log "ready in $((SECONDS - total))s"
echo "$bin"
