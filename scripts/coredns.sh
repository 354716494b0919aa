#!/usr/bin/env bash
# Builds CoreDNS (tools/coredns: upstream's coremain with the plugins of a
# cluster DNS) as a static binary into a per-machine cache, once, from the
# Go module proxy. Prints the binary's path on stdout; a no-op when it
# exists. test/e2e packages it as the kube-dns image (make e2e, make
# e2e-smoke).
#   COREDNS_DIR  cache root (default $HOME/.cache/membrane/coredns-v1.15.0)
# test/e2e finds the binary there, or in E2E_COREDNS.
set -euo pipefail
V=v1.15.0
COREDNS_DIR=${COREDNS_DIR:-$HOME/.cache/membrane/coredns-$V}
OUT=$COREDNS_DIR/coredns
if [ -x "$OUT" ]; then
	echo "$OUT"
	exit 0
fi
mkdir -p "$COREDNS_DIR"
# One build per machine: a second caller waits for the first.
exec 9>"$COREDNS_DIR/.lock"
flock 9
if [ -x "$OUT" ]; then
	echo "$OUT"
	exit 0
fi
cd "$(dirname "$0")/../tools/coredns"
export GOCACHE=$COREDNS_DIR/gocache
export GOFLAGS=-buildvcs=false
export CGO_ENABLED=0
start=$(date +%s)
# Build beside the target and rename: an interrupted build never leaves a
# binary that makes the next run a no-op.
tmp=$(mktemp "$COREDNS_DIR/coredns.XXXXXX")
trap 'rm -f "$tmp"' EXIT
go build -trimpath -ldflags="-s -w -X github.com/coredns/coredns/coremain.GitCommit=$V" -o "$tmp" .
mv "$tmp" "$OUT"
echo "coredns: built in $(($(date +%s) - start))s (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
echo "$OUT"
