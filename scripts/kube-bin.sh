#!/usr/bin/env bash
# Builds Kubernetes binaries (tools/kube, a module of its own that requires
# k8s.io/kubernetes) into a per-machine cache, once. Prints the bin directory
# on stdout; a no-op when the wanted binaries exist.
#   scripts/kube-bin.sh                  kube-apiserver, etcd-embed (test/kubetest)
#   scripts/kube-bin.sh kubelet kube-scheduler kube-controller-manager
#                                        also test/e2e's nodes and control plane
#                                        (.ci/run, make e2e-smoke, make e2e)
#   ... kubectl                          also kubectl (make e2e: debugging a kept cluster)
#   KUBE_DIR  cache root (default $HOME/.cache/membrane/kube-v1.35.4)
# The k8s integration tests find the binaries in $KUBE_DIR/bin, or in KUBETEST_BIN.
set -euo pipefail
V=v1.35.4
KUBE_DIR=${KUBE_DIR:-$HOME/.cache/membrane/kube-$V}
BIN=$KUBE_DIR/bin
# name -> package, in build order.
declare -A PKG=(
	[etcd-embed]=./cmd/etcd-embed
	[kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
	[kubelet]=k8s.io/kubernetes/cmd/kubelet
	[kubectl]=k8s.io/kubernetes/cmd/kubectl
	[kube-scheduler]=k8s.io/kubernetes/cmd/kube-scheduler
	[kube-controller-manager]=k8s.io/kubernetes/cmd/kube-controller-manager
)
WANT=(etcd-embed kube-apiserver)
for extra in "$@"; do
	case "$extra" in
	kubelet | kubectl | kube-scheduler | kube-controller-manager) WANT+=("$extra") ;;
	*)
		echo "usage: $0 [kubelet] [kubectl] [kube-scheduler] [kube-controller-manager]" >&2
		exit 2
		;;
	esac
done
missing() {
	local n
	for n in "${WANT[@]}"; do [ -x "$BIN/$n" ] || echo "$n"; done
}
if [ -z "$(missing)" ]; then
	echo "$BIN"
	exit 0
fi
mkdir -p "$BIN"
# One build per machine: a second caller waits for the first, then finds the
# binaries.
exec 9>"$KUBE_DIR/.lock"
flock 9
todo=$(missing)
if [ -z "$todo" ]; then
	echo "$BIN"
	exit 0
fi
cd "$(dirname "$0")/../tools/kube"
# The Kubernetes build cache (~2 GB) stays apart from the project's.
export GOCACHE=$KUBE_DIR/gocache
export GOFLAGS=-buildvcs=false
LDF="-s -w -X k8s.io/component-base/version.gitVersion=$V -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=35 -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=$V"
# Build into a temporary directory and rename, so an interrupted build never
# leaves a binary that makes the next run a no-op.
tmp=$(mktemp -d "$KUBE_DIR/build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
for n in $todo; do
	start=$(date +%s)
	go build -trimpath -ldflags="$LDF" -o "$tmp/$n" "${PKG[$n]}"
	mv "$tmp/$n" "$BIN/"
	echo "kube-bin: $n built in $(($(date +%s) - start))s (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
done
echo "$BIN"
