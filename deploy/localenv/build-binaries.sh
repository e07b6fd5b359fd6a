#!/usr/bin/env bash
# Builds the local environment's control-plane binaries from the Go module proxy, once per version.
#
# kube-apiserver, kube-controller-manager, kube-scheduler and kubectl come from k8s.io/kubernetes through
# the wrapper module in gomod/kubernetes (its staging modules replaced by their published releases); etcd
# and kwok/kwokctl from their own wrapper modules. Versions are the ones pinned in those go.mod files.
# Binaries are cached outside the repository in $TIDEPOOL_CACHE/bin/<component>-<version>/ and only a
# missing one is built. Prints the directory of each component on stdout as NAME=DIR lines.
#
# With --with-kubelet it also builds (or checks) the kubelet, from the same module, as its own component:
# the real nodes of `make demo` and of the realnode tests need it (deploy/localenv/realnode.py), and the
# Makefile asks for it.
#
# Users who already have the binaries set TIDEPOOL_BINARIES (or KUBEBUILDER_ASSETS) to a directory that
# holds them all; nothing is built then.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${TIDEPOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tidepool}"
prebuilt="${TIDEPOOL_BINARIES:-${KUBEBUILDER_ASSETS:-}}"
with_kubelet=0; [[ "${1:-}" == --with-kubelet ]] && with_kubelet=1

export GOTOOLCHAIN=local   # never fetch another Go toolchain
export GOSUMDB=off         # the committed go.sum files are the checksums we trust
export GOFLAGS=-mod=mod
export CGO_ENABLED=0       # as upstream builds them: static binaries

log() { echo "build-binaries: $*" >&2; }

if [[ -n "$prebuilt" ]]; then
  for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok kwokctl; do
    [[ -x "$prebuilt/$b" ]] || { log "TIDEPOOL_BINARIES=$prebuilt has no executable $b"; exit 1; }
  done
  echo "KUBERNETES=$prebuilt"; echo "ETCD=$prebuilt"; echo "KWOK=$prebuilt"
  if (( with_kubelet )); then
    [[ -x "$prebuilt/kubelet" ]] || { log "TIDEPOOL_BINARIES=$prebuilt has no executable kubelet"; exit 1; }
    echo "KUBELET=$prebuilt"
  fi
  exit 0
fi

command -v go >/dev/null || { log "Go is needed to build the control plane (https://go.dev/dl)"; exit 1; }

# version_of MODFILE MODULE: the version a wrapper go.mod pins for MODULE.
version_of() { awk -v m="$2" '$1 == m && $2 ~ /^v/ { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$1"; }

k8s_version="$(version_of "$here/gomod/kubernetes/go.mod" k8s.io/kubernetes)"
etcd_version="$(version_of "$here/gomod/etcd/go.mod" go.etcd.io/etcd/server/v3)"
kwok_version="$(version_of "$here/gomod/kwok/go.mod" sigs.k8s.io/kwok)"

# build_from_kubernetes OUT PACKAGE...: commands of the k8s.io/kubernetes wrapper module, built as upstream does.
build_from_kubernetes() {
  local out="$1" v="$k8s_version" major minor; shift
  major="${v#v}"; major="${major%%.*}"
  minor="${v#v*.}"; minor="${minor%%.*}"
  # Stamp the version as upstream's hack/lib/version.sh does; without it the binaries report v0.0.0.
  local pkg ldflags=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  (cd "$here/gomod/kubernetes" && go build -p 2 -trimpath -tags selinux,notest,grpcnotrace \
     -ldflags "-s -w$ldflags" -o "$out/" "$@")
}

build_kubernetes() {
  build_from_kubernetes "$1" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
}

build_kubelet() { build_from_kubernetes "$1" k8s.io/kubernetes/cmd/kubelet; }

build_etcd() {
  (cd "$here/gomod/etcd" && go build -trimpath -ldflags "-s -w" -o "$1/etcd" go.etcd.io/etcd/server/v3)
}

build_kwok() {
  (cd "$here/gomod/kwok" && go build -trimpath -ldflags "-s -w" -o "$1/" \
     sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwokctl)
}

# ensure NAME VERSION BUILDER BINARY...: the cached directory of a component, built when a binary is missing.
ensure() {
  local name="$1" version="$2" builder="$3"; shift 3
  local dir="$cache/bin/$name-$version" b missing=0
  for b in "$@"; do [[ -x "$dir/$b" ]] || missing=1; done
  if (( missing )); then
    log "building $name $version into $dir (a cold build of kubernetes took about 5 minutes on two cores)"
    local tmp start=$SECONDS
    mkdir -p "$cache/bin"
    tmp="$(mktemp -d "$cache/bin/.$name-$version.XXXXXX")"
    "$builder" "$tmp"
    rm -rf "$dir" && mv "$tmp" "$dir"   # appears whole or not at all
    log "built $name $version in $((SECONDS - start)) s"
  fi
  echo "${name^^}=$dir"
}

ensure etcd "$etcd_version" build_etcd etcd
ensure kwok "$kwok_version" build_kwok kwok kwokctl
ensure kubernetes "$k8s_version" build_kubernetes kube-apiserver kube-controller-manager kube-scheduler kubectl
# Only what runs a real node needs the kubelet (tests marked realnode); its own component, so that the
# control plane's cache stays valid and `make test` does not build it.
if (( with_kubelet )); then ensure kubelet "$k8s_version" build_kubelet kubelet; fi
