#!/usr/bin/env bash
# Builds upstream's Kubernetes e2e suite and agnhost at v1.35.4 from the Go
# module proxy (tools/e2e, a module of its own that requires
# k8s.io/kubernetes) into a per-machine cache, once. Prints the bin
# directory on stdout; a no-op when both binaries exist.
#   $E2E_DIR/bin/e2e.test  upstream's test/e2e restricted to the network
#                          tests: its own e2e.go, suites.go and e2e_test.go,
#                          unchanged but for e2e_test.go's test source
#                          imports, cut to test/e2e/network (providers.go,
#                          which only loads the cloud providers, is left
#                          out: the suite runs with --provider=skeleton)
#   $E2E_DIR/bin/agnhost   k8s.io/kubernetes/test/images/agnhost, static,
#                          with its porter's localhost.crt and .key (the
#                          image has them at /, as upstream's Dockerfile)
# e2e.test is built with scripts/kube-bin.sh's settings (cgo as the go
# tool defaults, -trimpath), so the packages it shares with the kube
# binaries come from the build cache.
#   E2E_DIR      cache root (default $HOME/.cache/membrane/e2e-v1.35.4)
#   E2E_GOCACHE  Go build cache (default the Kubernetes binaries' one,
#                $HOME/.cache/membrane/kube-v1.35.4/gocache: most packages
#                are shared with kube-apiserver and the kubelet)
# test/conformance finds the binaries there (make conformance).
set -euo pipefail
V=v1.35.4
E2E_DIR=${E2E_DIR:-$HOME/.cache/membrane/e2e-$V}
BIN=$E2E_DIR/bin
missing() {
	local n
	for n in e2e.test agnhost; do [ -x "$BIN/$n" ] && [ "$n" != agnhost -o -f "$BIN/localhost.key" ] || echo "$n"; done
}
if [ -z "$(missing)" ]; then
	echo "$BIN"
	exit 0
fi
mkdir -p "$BIN"
# One build per machine: a second caller waits for the first, then finds
# the binaries.
exec 9>"$E2E_DIR/.lock"
flock 9
todo=$(missing)
if [ -z "$todo" ]; then
	echo "$BIN"
	exit 0
fi
cd "$(dirname "$0")/../tools/e2e"
export GOCACHE=${E2E_GOCACHE:-$HOME/.cache/membrane/kube-$V/gocache}
export GOFLAGS=-buildvcs=false
LDF="-s -w -X k8s.io/component-base/version.gitVersion=$V -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=35 -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=$V"
# Build into temporary directories and rename, so an interrupted build
# never leaves a binary that makes the next run a no-op. The suite's
# package is assembled in a directory the go tool's ./... skips (_suite.*).
tmp=$(mktemp -d "$E2E_DIR/build.XXXXXX")
suite=$(mktemp -d "$PWD/_suite.XXXXXX")
trap 'rm -rf "$tmp" "$suite"' EXIT
for n in $todo; do
	start=$(date +%s)
	case "$n" in
	e2e.test)
		up=$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)/test/e2e
		cp "$up/e2e.go" "$up/suites.go" "$suite/"
		# Keep the "// test sources" import block's network line only.
		awk '/\/\/ test sources/ { src = 1; print; next }
			src && /^$/ { src = 0 }
			src && !/"k8s.io\/kubernetes\/test\/e2e\/network"$/ { next }
			{ print }' "$up/e2e_test.go" >"$suite/e2e_test.go"
		if ! grep -q '_ "k8s.io/kubernetes/test/e2e/network"$' "$suite/e2e_test.go" ||
			grep -q '_ "k8s.io/kubernetes/test/e2e/apps"$' "$suite/e2e_test.go"; then
			echo "e2e-bin: cutting $up/e2e_test.go's imports failed" >&2
			exit 1
		fi
		chmod u+w "$suite"/*.go
		go test -c -vet=off -trimpath -ldflags="$LDF" -o "$tmp/e2e.test" "./$(basename "$suite")"
		;;
	agnhost)
		# Static: it runs in an image without a libc of its own.
		CGO_ENABLED=0 go build -trimpath -ldflags="$LDF" -o "$tmp/agnhost" k8s.io/kubernetes/test/images/agnhost
		porter=$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)/test/images/agnhost/porter
		install -m 0644 "$porter/localhost.crt" "$porter/localhost.key" "$BIN/"
		;;
	esac
	mv "$tmp/$n" "$BIN/"
	echo "e2e-bin: $n built in $(($(date +%s) - start))s (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
done
echo "$BIN"
