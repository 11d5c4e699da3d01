#!/usr/bin/env bash
# Builds what the local cluster's real node runs besides the container runtime:
# kubelet from the pinned Kubernetes release, the CNI plugins bridge, host-local,
# loopback and portmap from their pinned Go module, and the pause image
# (registry.k8s.io/pause:3.10, pause.c from the Kubernetes module, static) as an
# OCI archive. Outputs go to a cache outside the repository, keyed by version,
# and are never rebuilt when present.
#
#   tests/e2e/controlplane/build-node.sh      # prints the node's bin directory last
#   HEADROOM_CACHE=/somewhere build-node.sh    # cache root (default ~/.cache/headroom)
#
# Layout: $cache/node-k8s-<v>-cni-<v>/bin/kubelet, .../cni/{bridge,host-local,...},
# $cache/images/pause-3.10.oci.tar.
#
# The runtime is Debian's: containerd 1.6.20 and runc 1.1.5, installed here with
# apt-get when missing. containerd 1.6 speaks CRI v1, which kubelet 1.34 needs,
# installs in seconds and is what a Debian 12 node runs; building containerd v2
# from its Go module would add minutes of compilation to a cold CI run and a
# daemon we would then have to package ourselves, for no behaviour the tests use.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
k8s_version=$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' "$here/k8s/go.mod")
cni_version=$(awk '$1 == "require" && $2 == "github.com/containernetworking/plugins" {print $3; exit}' "$here/cni/go.mod")
pause_tag=3.10
cache=${HEADROOM_CACHE:-$HOME/.cache/headroom}
root="$cache/node-k8s-${k8s_version}-cni-${cni_version}"
bin="$root/bin"
cni="$root/cni"
images="$cache/images"
pause_archive="$images/pause-${pause_tag}.oci.tar"

cni_plugins=(
  "bridge github.com/containernetworking/plugins/plugins/main/bridge"
  "host-local github.com/containernetworking/plugins/plugins/ipam/host-local"
  "loopback github.com/containernetworking/plugins/plugins/main/loopback"
  "portmap github.com/containernetworking/plugins/plugins/meta/portmap"
)

log_tag=node
# shellcheck source=lib.sh
source "$here/lib.sh"

# Debian packages the node needs: the runtime, the network tools kubelet and the
# CNI plugins call, and the compiler and image builder for the pause image.
ensure_packages() {
  local wanted=() entry cmd pkg
  for entry in containerd:containerd runc:runc iptables:iptables ip:iproute2 \
    gcc:gcc buildah:buildah; do
    cmd=${entry%%:*}; pkg=${entry#*:}
    command -v "$cmd" >/dev/null || PATH=$PATH:/usr/sbin:/sbin command -v "$cmd" >/dev/null \
      || wanted+=("$pkg")
  done
  # A static pause needs libc.a.
  [[ -e /usr/lib/x86_64-linux-gnu/libc.a || -e /usr/lib/libc.a ]] || wanted+=(libc6-dev)
  ((${#wanted[@]})) || return 0
  if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
    # Not fatal: `make test` goes on, and the real node's tests skip, saying why.
    log "missing ${wanted[*]}; install them (Debian: apt-get install ${wanted[*]});"
    log "until then the real node cannot run and its tests are skipped"
    exit 0
  fi
  log "installing ${wanted[*]} with apt-get ..."
  local start=$SECONDS
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${wanted[@]}" >/dev/null
  # Debian starts its own containerd service where systemd runs; ours has its own
  # socket and directories, so the two do not meet.
  log "installed in $((SECONDS - start))s"
}

build_pause() {
  if [[ -s "$pause_archive" ]]; then
    log "pause:$pause_tag: cached"
    return
  fi
  local start=$SECONDS work src
  log "pause:$pause_tag: building $pause_archive ..."
  # Downloaded first: with kubelet cached, the module cache may have been cleaned.
  (cd "$here/k8s" && go mod download k8s.io/kubernetes)
  src=$(cd "$here/k8s" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c
  work=$(mktemp -d)
  # A private buildah store, so nothing is left in (or taken from) the machine's.
  local -a bh=(buildah --root "$work/root" --runroot "$work/runroot" --storage-driver vfs)
  (
    set -e
    trap 'rm -rf "$work"' EXIT
    mkdir -p "$work/rootfs"
    gcc -Os -Wall -Werror -static -DVERSION="v${pause_tag}-headroom" -o "$work/rootfs/pause" "$src"
    strip "$work/rootfs/pause"
    ctr=$("${bh[@]}" from scratch)
    "${bh[@]}" copy "$ctr" "$work/rootfs/pause" /pause >/dev/null
    "${bh[@]}" config --entrypoint '["/pause"]' --user 65535:65535 \
      --os linux --arch amd64 "$ctr"
    "${bh[@]}" commit --quiet "$ctr" "registry.k8s.io/pause:$pause_tag" >/dev/null
    mkdir -p "$images"
    rm -f "$pause_archive.tmp"
    "${bh[@]}" push --quiet "registry.k8s.io/pause:$pause_tag" \
      "oci-archive:$pause_archive.tmp:registry.k8s.io/pause:$pause_tag"
    mv "$pause_archive.tmp" "$pause_archive"
  )
  log "pause:$pause_tag: built in $((SECONDS - start))s"
}

command -v go >/dev/null || { log "go is not installed; it is needed to build the node"; exit 1; }
total=$SECONDS
ensure_packages
mkdir -p "$bin" "$cni"
log "kubelet $k8s_version, CNI plugins $cni_version -> $root"
build "$here/k8s" "$bin" "$(k8s_stamp "$k8s_version")" "kubelet k8s.io/kubernetes/cmd/kubelet"
build "$here/cni" "$cni" "-X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$cni_version" \
  "${cni_plugins[@]}"
build_pause
log "ready in $((SECONDS - total))s"
echo "$bin"
