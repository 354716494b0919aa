#!/usr/bin/env bash
# Builds kube-apiserver and etcd-embed (tools/kube, a module of its own that
# requires k8s.io/kubernetes) into a per-machine cache, once. A no-op when both
# binaries exist. Prints the bin directory on stdout.
#   KUBE_DIR  cache root (default $HOME/.cache/membrane/kube-v1.35.4)
# The k8s integration tests find the binaries in $KUBE_DIR/bin, or in KUBETEST_BIN.
set -euo pipefail
V=v1.35.4
KUBE_DIR=${KUBE_DIR:-$HOME/.cache/membrane/kube-$V}
BIN=$KUBE_DIR/bin
if [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/etcd-embed" ]; then
	echo "$BIN"
	exit 0
fi
mkdir -p "$BIN"
# One build per machine: a second caller waits for the first, then finds the
# binaries.
exec 9>"$KUBE_DIR/.lock"
flock 9
if [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/etcd-embed" ]; then
	echo "$BIN"
	exit 0
fi
cd "$(dirname "$0")/../tools/kube"
# The Kubernetes build cache (~2 GB) stays apart from the project's.
export GOCACHE=$KUBE_DIR/gocache
export GOFLAGS=-buildvcs=false
LDF="-s -w -X k8s.io/component-base/version.gitVersion=$V -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=35 -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=$V"
start=$(date +%s)
# Build into a temporary directory and rename, so an interrupted build never
# leaves a binary that makes the next run a no-op.
tmp=$(mktemp -d "$KUBE_DIR/build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
go build -trimpath -ldflags="$LDF" -o "$tmp/" k8s.io/kubernetes/cmd/kube-apiserver ./cmd/etcd-embed
mv "$tmp/kube-apiserver" "$tmp/etcd-embed" "$BIN/"
echo "kube-bin: built in $(( $(date +%s) - start ))s" >&2
echo "$BIN"
