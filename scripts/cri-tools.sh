#!/usr/bin/env bash
# Installs what test/cri needs: containerd and runc from Debian, crictl
# built from the Go module proxy (bookworm does not package it). crictl is
# cached in CACHE_DIR (default $HOME/.cache/membrane): a run with the
# binary present takes under a second. Building it took 20 minutes on a
# loaded 2-core machine (about 2.5 when idle); installing containerd and
# runc (28 MB) 15 seconds.
set -euo pipefail
CRICTL_VERSION=v1.30.0
CACHE_DIR=${CACHE_DIR:-$HOME/.cache/membrane}
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! command -v containerd >/dev/null; then
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 --no-install-recommends containerd runc >/dev/null
fi
bin=$CACHE_DIR/bin/crictl-$CRICTL_VERSION
if [ ! -x "$bin" ]; then
	mkdir -p "$CACHE_DIR/bin"
	export GOPATH=$CACHE_DIR/gopath GOFLAGS=-modcacherw CGO_ENABLED=0
	# `go install ...@version` needs the proxy's version list; the module
	# zip has no vendor/, so download it and build with -mod=mod.
	go mod download sigs.k8s.io/cri-tools@$CRICTL_VERSION
	src=$(mktemp -d)
	trap 'rm -rf "$src"' EXIT
	cp -r "$GOPATH/pkg/mod/sigs.k8s.io/cri-tools@$CRICTL_VERSION/." "$src"
	chmod -R u+w "$src"
	(cd "$src" && go build -mod=mod -trimpath \
		-ldflags "-s -w -X github.com/kubernetes-sigs/cri-tools/pkg/version.Version=$CRICTL_VERSION" \
		-o "$bin.tmp" ./cmd/crictl)
	mv "$bin.tmp" "$bin"
	go clean -modcache # the binary is all that is kept (the modules are ~0.5 GB)
fi
ln -sf "$bin" "$CACHE_DIR/bin/crictl"
echo "crictl: $CACHE_DIR/bin/crictl"
