#!/usr/bin/env bash
# make demo: start membrane-agent on a temporary socket and state dir with
# the fake datapath, drive a few endpoints through its REST API with
# membranectl, and show what happened at each step.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin}
dir=$(mktemp -d /tmp/membrane-demo.XXXXXX)
sock=$dir/membrane.sock
log=$dir/agent.log
agent_pid=
cleanup() {
	if [ -n "$agent_pid" ] && kill -0 "$agent_pid" 2>/dev/null; then kill -TERM "$agent_pid"; wait "$agent_pid" || true; fi
	rm -rf "$dir"
}
trap cleanup EXIT

step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@"; }
ctl() { "$BIN/membranectl" --socket "$sock" "$@"; }

echo "== starting membrane-agent (fake datapath) on $sock"
"$BIN/membrane-agent" --socket "$sock" --state-dir "$dir/state" --datapath fake \
	--ipv4-range 10.200.0.0/16 --ipv6-range fd00:200::/112 --http-addr 127.0.0.1:0 --log-format text >"$log" 2>&1 &
agent_pid=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
step "$BIN/membranectl" --socket "$sock" status

pods=(web-0 web-1 db-0)
apps=(web web db)
for i in 0 1 2; do
	pod=${pods[$i]}
	echo
	echo "== pod default/$pod: allocate addresses (POST /v1/ipam), then create its endpoint (PUT /v1/endpoint, sync)"
	ips=$(ctl -o json ipam allocate --owner "default/$pod")
	v4=$(printf '%s' "$ips" | sed -n 's/.*"ipv4": *"\([0-9.]*\)".*/\1/p' | head -1)
	v6=$(printf '%s' "$ips" | sed -n 's/.*"ipv6": *"\([0-9a-f:]*\)".*/\1/p' | head -1)
	echo "allocated $v4 $v6"
	step "$BIN/membranectl" --socket "$sock" -o json endpoint create "container-id:demo-$pod" \
		--namespace default --pod "$pod" --label "k8s:app=${apps[$i]}" \
		--label k8s:io.kubernetes.pod.namespace=default --ipv4 "$v4" --ipv6 "$v6" --sync
done

step "$BIN/membranectl" --socket "$sock" endpoint list
step "$BIN/membranectl" --socket "$sock" endpoint list --label k8s:app=web
step "$BIN/membranectl" --socket "$sock" endpoint list --selector 'app=web,tier!=db' --limit 1
echo; echo "== the actor tree: each actor publishes its state, operation and mailbox depth (GET /v1/actors)"
step "$BIN/membranectl" --socket "$sock" actors
step "$BIN/membranectl" --socket "$sock" identity list
echo; echo "== relabel db-0: it gets a new identity and a regeneration; membranectl monitor follows the events (GET /v1/events)"
ctl monitor --count 6 --timeout 10s >"$dir/events.txt" 2>&1 &
monitor_pid=$!
sleep 0.3
step "$BIN/membranectl" --socket "$sock" -o json endpoint labels pod-name:default/db-0 --add k8s:tier=backend
wait "$monitor_pid" || true
echo; echo "$ membranectl monitor --count 6"; cat "$dir/events.txt"
step "$BIN/membranectl" --socket "$sock" endpoint health pod-name:default/db-0
echo; echo "== network policy: web may reach db on TCP 5432 (PUT /v1/policy); only db regenerates, its policy map is realised"
cat >"$dir/policy.yaml" <<'YAML'
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata:
  name: web-to-db
  namespace: default
spec:
  endpointSelector:
    matchLabels:
      app: db
  ingress:
  - fromEndpoints:
    - matchLabels:
        app: web
    toPorts:
    - ports:
      - port: "5432"
        protocol: TCP
YAML
step "$BIN/membranectl" --socket "$sock" policy import "$dir/policy.yaml"
step "$BIN/membranectl" --socket "$sock" policy get
step "$BIN/membranectl" --socket "$sock" endpoint policy pod-name:default/db-0
step "$BIN/membranectl" --socket "$sock" ipcache list
step "$BIN/membranectl" --socket "$sock" policy delete default/web-to-db
echo; echo "== a duplicate container is refused with 409"
if ctl endpoint create container-id:demo-web-0 --namespace default --pod web-0 --label k8s:app=web --sync; then echo "unexpected success"; exit 1; fi
step "$BIN/membranectl" --socket "$sock" ipam status
echo; echo "== Prometheus metrics (GET /metrics; also on the read-only --http-addr listener)"
curl -s --unix-socket "$sock" http://membrane/metrics | grep -E '^membrane_(endpoints|identities|ipam_used|endpoint_regeneration_duration_seconds_count)' || true

echo; echo "== delete every endpoint (DELETE /v1/endpoint/{id}); their addresses and identities are released"
for pod in "${pods[@]}"; do step "$BIN/membranectl" --socket "$sock" endpoint delete "container-id:demo-$pod"; done
step "$BIN/membranectl" --socket "$sock" endpoint list
step "$BIN/membranectl" --socket "$sock" identity list
step "$BIN/membranectl" --socket "$sock" -o json status

echo; echo "== SIGTERM: the agent stops accepting, finishes in-flight requests and exits"
kill -TERM "$agent_pid"; wait "$agent_pid"; agent_pid=
echo "agent exited with status 0; its log:"
sed 's/^/  /' "$log"
echo; echo "demo finished"
