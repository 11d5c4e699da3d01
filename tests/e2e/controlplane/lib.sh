# Sourced by build.sh and build-node.sh: Go builds into the cache outside the
# repository, each binary built once. The sourcing script sets log_tag first.

log() { printf '[%s] %s\n' "$log_tag" "$*" >&2; }

build() { # module-dir out-dir ldflags "name pkg"...
  local dir=$1 out=$2 ldflags=$3; shift 3
  local entry name pkg start
  for entry in "$@"; do
    read -r name pkg <<<"$entry"
    if [[ -x "$out/$name" ]]; then
      log "$name: cached"
      continue
    fi
    start=$SECONDS
    log "$name: building $pkg ..."
    (cd "$dir" && CGO_ENABLED=0 go build -trimpath -ldflags="-s -w $ldflags" \
      -o "$out/$name.tmp" "$pkg")
    mv "$out/$name.tmp" "$out/$name"
    log "$name: built in $((SECONDS - start))s"
  done
}

sources_digest() { # module-dir -> 12 hex digits of its go.mod, go.sum and *.go files,
  # for a tool named by its sources: a cached build of other sources is another name
  # (devcluster.binaries.rulecheck_tool works it out alike)
  (cd "$1" && find . -name go.mod -o -name go.sum -o -name '*.go' | LC_ALL=C sort |
    xargs sha256sum | sha256sum | cut -c1-12)
}

k8s_stamp() { # version -> ldflags stamping it into the binaries, as the upstream
  # build does, so that /version and kubectl's skew checks see v1.x, not v0.0.0-master.
  local version=$1 minor vpkg=k8s.io/component-base/version
  minor=${version#v1.}; minor=${minor%%.*}
  echo "-X $vpkg.gitVersion=$version -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor -X $vpkg.gitTreeState=clean"
}
