#!/usr/bin/env bash
# Builds the real control plane Headroom's e2e tests and demo run against:
# kube-apiserver, kube-scheduler, kube-controller-manager, kubectl and etcd from
# the pinned Kubernetes release, and kwok/kwokctl. Binaries go to a cache
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

log() { printf '[controlplane] %s\n' "$*" >&2; }

build() { # module-dir ldflags "name pkg"...
  local dir=$1 ldflags=$2; shift 2
  local entry name pkg start
  for entry in "$@"; do
    read -r name pkg <<<"$entry"
    if [[ -x "$bin/$name" ]]; then
      log "$name: cached"
      continue
    fi
    start=$SECONDS
    log "$name: building $pkg ..."
    (cd "$dir" && CGO_ENABLED=0 go build -trimpath -ldflags="-s -w $ldflags" \
      -o "$bin/$name.tmp" "$pkg")
    mv "$bin/$name.tmp" "$bin/$name"
    log "$name: built in $((SECONDS - start))s"
  done
}

command -v go >/dev/null || { log "go is not installed; it is needed to build the control plane"; exit 1; }
mkdir -p "$bin"
total=$SECONDS
log "Kubernetes $k8s_version, KWOK $kwok_version -> $bin"
# Stamp the release into the binaries, as the upstream build does, so that
# /version and kubectl's skew checks see v1.x rather than v0.0.0-master.
minor=${k8s_version#v1.}; minor=${minor%%.*}
vpkg=k8s.io/component-base/version
stamp="-X $vpkg.gitVersion=$k8s_version -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor -X $vpkg.gitTreeState=clean"
build "$here/k8s" "$stamp" "${k8s_tools[@]}"
build "$here/kwok" "" "${kwok_tools[@]}"
log "ready in $((SECONDS - total))s"
echo "$bin"
