#!/usr/bin/env bash
# Prints every headline number of BENCHMARKS.md and issue 39's table from
# one run, as one markdown table with its targets, the same-run baseline
# in the value, the date and the load average (overall, and per part in
# the last column):
#   cni: CNI ADD/DEL against ptp + host-local (test/cnibench, root),
#   put: sync PUT p99 and create+delete cycles/s on ext4 (pkg/agent/api),
#   sim: membrane-sim lifecycles/s with 1% faults and heap per live endpoint,
#   restore: restore time (test/crash, root),
#   policy: policy regeneration (test/policybench, root),
#   l7: HTTP through the L7 proxy against direct (test/l7, root),
#   dns: DNS answers through the DNS proxy against direct (test/fqdn, root),
#   relabel: 100 simultaneous pod relabels until realised (test/k8sbench,
#     root, kube-apiserver),
#   samenode: same-node stream and request/response against plain veths
#     (test/multinode TestSameNodeNumbers, root),
#   xnode: cross-node round trip against plain veths, native and tunnel
#     (test/multinode TestCrossNodeNumbers, root; 3 x 256 MiB per mode),
#   mem: the agent process's resident memory (test/agentmem, root,
#     kube-apiserver for the Kubernetes row),
#   bpf: kernel memory per endpoint (datapath TestBPFBench, root).
# HEADLINE_PARTS (comma-separated, default all of the above) picks parts.
# A part whose prerequisite is missing (root, the kube binaries of
# scripts/kube-bin.sh) is a "skipped (why)" row; a part whose output
# does not parse is "FAILED (see its log)". Each part's full output goes
# to $LOGDIR; the table also to $BENCH_OUT when set.
#
# Sizes (environment): HEADLINE_CNI_N (default 200 calls per arm: the
# nearest-rank p99 of 1-at-a-time ADDs is then the 198th, where of 100 it
# would be the 99th, next to the slowest), HEADLINE_PUT_N (20000 cycles
# per client count: several seconds, so that the state journal's
# checkpoints run inside the measurement), HEADLINE_SIM_DURATION (30s),
# HEADLINE_RESTORE_N (100), HEADLINE_POLICY_ENDPOINTS (200),
# HEADLINE_L7_ROUNDS and HEADLINE_L7_N (5 rounds of 400 GETs per arm),
# HEADLINE_RELABEL_PODS (100), HEADLINE_MEM_PODS (110),
# HEADLINE_MEM_REMOTE (5000 remote endpoints), HEADLINE_MEM_SETTLE (15s
# idle before each reading), HEADLINE_BPF_N (50 endpoints). The DNS
# part's 400 queries per series and the same- and cross-node sizes are
# their tests' constants.
set -uo pipefail

cd "$(dirname "$0")/.."
GO=${GO:-go}
LOGDIR=${LOGDIR:-$(mktemp -d /tmp/membrane-headline.XXXXXX)}
mkdir -p "$LOGDIR"
CNI_N=${HEADLINE_CNI_N:-200}
PUT_N=${HEADLINE_PUT_N:-20000}
SIM_DURATION=${HEADLINE_SIM_DURATION:-30s}
RESTORE_N=${HEADLINE_RESTORE_N:-100}
POLICY_N=${HEADLINE_POLICY_ENDPOINTS:-200}
L7_ROUNDS=${HEADLINE_L7_ROUNDS:-5}
L7_N=${HEADLINE_L7_N:-400}
RELABEL_PODS=${HEADLINE_RELABEL_PODS:-100}
MEM_PODS=${HEADLINE_MEM_PODS:-110}
MEM_REMOTE=${HEADLINE_MEM_REMOTE:-5000}
MEM_SETTLE=${HEADLINE_MEM_SETTLE:-15s}
BPF_N=${HEADLINE_BPF_N:-50}
PARTS=${HEADLINE_PARTS:-cni,put,sim,restore,policy,l7,dns,relabel,samenode,xnode,mem,bpf}

rows=()
partload=
row() { rows+=("| $1 | $2 | $3 | $partload |"); }
load() { cut -d' ' -f1-3 /proc/loadavg; }
# part <name>: whether HEADLINE_PARTS has it; records the load at its start.
part() {
	case ",$PARTS," in
	*",$1,"*) partload=$(cut -d' ' -f1 /proc/loadavg); return 0 ;;
	esac
	return 1
}
root=0
[ "$(id -u)" = 0 ] && root=1
# The kube-apiserver and etcd test/kubetest runs (scripts/kube-bin.sh).
kubebin=${KUBETEST_BIN:-${KUBE_DIR:-$HOME/.cache/membrane/kube-v1.35.4}/bin}
kube=0
[ -x "$kubebin/kube-apiserver" ] && [ -x "$kubebin/etcd-embed" ] && kube=1

start_date=$(date -u '+%Y-%m-%d %H:%M UTC')
start_load=$(load)
echo "membrane headline run, $start_date, load average $start_load; logs in $LOGDIR" >&2

# 1. CNI ADD/DEL against ptp + host-local, both attach modes.
if ! part cni; then
	:
elif [ $root = 1 ]; then
	echo "cni bench (BENCH_N=$CNI_N)..." >&2
	BENCH_OUT= MEMBRANE_BENCH_CNI=1 BENCH_N=$CNI_N BENCH_CONC=8 \
		$GO test -run '^TestCNIBench$' -count=1 -v -timeout 30m ./test/cnibench/ >"$LOGDIR/cni.txt" 2>&1
	found=0
	while IFS='|' read -r what value target; do
		what=${what#headline: }
		row "${what% }" "${value// /}" "${target# }"
		found=1
	done < <(grep '^headline: ' "$LOGDIR/cni.txt")
	[ $found = 1 ] || row "CNI ADD/DEL vs ptp" "FAILED (see $LOGDIR/cni.txt)" ""
else
	row "CNI ADD/DEL vs ptp" "skipped (needs root)" ""
fi

# 2. Sync PUT on ext4 (a loop-mounted image when the temp dir is not ext4).
metric() { # metric <benchmark line> <unit>: the value before unit
	awk -v unit="$2" '{for (i = 2; i <= NF; i++) if ($i == unit) print $(i-1)}' <<<"$1"
}
if part put; then
echo "sync PUT bench ($PUT_N cycles per client count)..." >&2
MEMBRANE_BENCH_EXT4=1 $GO test -run '^$' -bench 'Lifecycle/clients=(8|64)$' -benchtime "${PUT_N}x" \
	./pkg/agent/api/ >"$LOGDIR/put.txt" 2>&1
# The result line of a client count: the first line with cycles/s after
# its name (the benchmark prints its phase breakdown in between).
result() { awk -v name="Lifecycle/clients=$1-" 'index($0, name) { on = 1 } on && /cycles\/s/ { print; exit }' "$LOGDIR/put.txt"; }
c8=$(result 8)
c64=$(result 64)
if [ -n "$c8" ] && [ -n "$c64" ]; then
	row "sync PUT p99, 8 clients, state on ext4 (ms)" "$(metric "$c8" put-p99-ms)" "<= 5"
	row "create+delete cycles/s, 64 clients, state on ext4" "$(metric "$c64" cycles/s)" ">= 2,500"
else
	row "sync PUT on ext4" "FAILED (see $LOGDIR/put.txt)" ""
fi
fi

# 3. membrane-sim: 10,000 live endpoints, 1% faults.
if part sim; then
echo "membrane-sim ($SIM_DURATION of churn, 1% faults)..." >&2
mkdir -p bin
$GO build -trimpath -o bin/ ./cmd/membrane-sim &&
	bin/membrane-sim --scenario sim/scenarios/default.json --fault-rate 0.01 --duration "$SIM_DURATION" \
		--progress never >"$LOGDIR/sim.txt" 2>&1
lc=$(grep '^lifecycles:' "$LOGDIR/sim.txt")
heap=$(sed -n 's/^heap: *\([0-9]*\) bytes per live endpoint.*/\1/p' "$LOGDIR/sim.txt")
if [ -n "$lc" ]; then
	row "membrane-sim lifecycles/s, 10,000 live, 1% faults" "$(sed -n 's/.*, \([0-9]*\)\/s during churn.*/\1/p' <<<"$lc")" ">= 2,500"
	row "membrane-sim slowest 5 s window (lifecycles/s)" "$(sed -n 's/.*slowest 5s: \([0-9]*\)\/s.*/\1/p' <<<"$lc")" ">= 2,000"
	row "heap per live endpoint (bytes)" "$heap" "<= 8,192"
	row "membrane-sim CPU per lifecycle (ms)" "$(sed -n 's/^CPU: *\([0-9.]*\) ms per lifecycle.*/\1/p' "$LOGDIR/sim.txt")" "<= 0.8 for 2,500/s on 2 cores"
else
	row "membrane-sim" "FAILED (see $LOGDIR/sim.txt)" ""
fi
fi

# 4. Restore time, 5. policy regeneration (root).
if ! part restore; then
	:
elif [ $root = 1 ]; then
	echo "restore bench ($RESTORE_N endpoints)..." >&2
	MEMBRANE_BENCH_RESTORE=1 RESTORE_N=$RESTORE_N \
		$GO test -run '^TestRestoreTime$' -count=1 -v -timeout 10m ./test/crash/ >"$LOGDIR/restore.txt" 2>&1
	r=$(grep '^restart after SIGKILL' "$LOGDIR/restore.txt" | head -1)
	if [ -n "$r" ]; then
		row "restore after SIGKILL, $RESTORE_N pods: process start to all ready" "$(sed -n 's/.*to all ready \(.*\)$/\1/p' <<<"$r")" ""
		row "restore after SIGKILL: restore inside the agent" "$(sed -n 's/.*restore in the agent \([^,]*\),.*/\1/p' <<<"$r")" ""
	else
		row "restore time" "FAILED (see $LOGDIR/restore.txt)" ""
	fi
else
	row "restore time" "skipped (needs root)" ""
fi
if ! part policy; then
	:
elif [ $root = 1 ]; then
	echo "policy bench ($POLICY_N endpoints)..." >&2
	MEMBRANE_BENCH_POLICY=1 BENCH_ENDPOINTS=$POLICY_N BENCH_ROUNDS=5 \
		$GO test -run '^TestPolicyBench$' -count=1 -v -timeout 30m ./test/policybench/ >"$LOGDIR/policy.txt" 2>&1
	p=$(grep '^PUT /v1/policy until' "$LOGDIR/policy.txt" | head -1)
	if [ -n "$p" ]; then
		row "PUT /v1/policy until $POLICY_N endpoints with BPF realised it, median / p99" \
			"$(sed -n 's/.* median \([^ ]*\) p90 [^ ]* p99 \([^ ]*\) .*/\1 \/ \2/p' <<<"$p")" ""
	else
		row "policy regeneration" "FAILED (see $LOGDIR/policy.txt)" ""
	fi
else
	row "policy regeneration" "skipped (needs root)" ""
fi

# 6. L7 HTTP through the proxy against the same GETs without L7 policy.
if ! part l7; then
	:
elif [ $root = 1 ]; then
	echo "L7 HTTP bench ($L7_ROUNDS rounds of $L7_N GETs per arm)..." >&2
	MEMBRANE_BENCH_L7=1 BENCH_ROUNDS=$L7_ROUNDS BENCH_N=$L7_N \
		$GO test -run '^TestBenchHTTPLatency$' -count=1 -v -timeout 20m ./test/l7/ >"$LOGDIR/l7.txt" 2>&1
	lat=$(grep -m1 '^HTTP GET A->B:80 kept-alive' "$LOGDIR/l7.txt")
	rps=$(grep -m1 '^requests/s, ' "$LOGDIR/l7.txt")
	if [ -n "$lat" ] && [ -n "$rps" ]; then
		row "L7 HTTP through the proxy / direct, p50; p99; requests/s" \
			"$(sed -n 's/.*ratio p50 \([0-9.]*x\) p99 \([0-9.]*x\).*/\1; \2/p' <<<"$lat"); $(sed -n 's/.*(\([0-9.]*\)x)$/\1/p' <<<"$rps") (direct p50 $(sed -n 's/.*without L7 p50 \([^ ]*\) .*/\1/p' <<<"$lat"), $(sed -n 's/.*without L7 \([0-9]*\), .*/\1/p' <<<"$rps") req/s)" \
			"<= 2.5x; <= 3x; >= 0.7"
	else
		row "L7 HTTP through the proxy / direct" "FAILED (see $LOGDIR/l7.txt)" "<= 2.5x; <= 3x; >= 0.7"
	fi
else
	row "L7 HTTP through the proxy / direct" "skipped (needs root)" "<= 2.5x; <= 3x; >= 0.7"
fi

# 7. DNS answers through the proxy against the same queries direct.
if ! part dns; then
	:
elif [ $root = 1 ]; then
	echo "DNS proxy bench..." >&2
	$GO test -run '^$' -bench '^BenchmarkDNSProxyDelay$' -benchtime 1x -count=1 -timeout 20m ./test/fqdn/ >"$LOGDIR/dns.txt" 2>&1
	d=$(grep -m1 '^BenchmarkDNSProxyDelay' "$LOGDIR/dns.txt")
	kp=$(metric "$d" cached-proxy-p50-us)
	kd=$(metric "$d" cached-direct-p50-us)
	np=$(metric "$d" new-proxy-p50-us)
	nd=$(metric "$d" new-direct-p50-us)
	if [ -n "$kp" ] && [ -n "$kd" ] && [ -n "$np" ] && [ -n "$nd" ]; then
		row "DNS answer through the proxy / direct, p50: known name; new address" \
			"$(awk -v a="$kp" -v b="$kd" -v c="$np" -v e="$nd" 'BEGIN { printf "%.1fx; %.1fx (direct %.0f; %.0f µs)", a/b, c/e, b, e }')" "<= 2x; <= 4x"
	else
		row "DNS answer through the proxy / direct" "FAILED (see $LOGDIR/dns.txt)" "<= 2x; <= 4x"
	fi
else
	row "DNS answer through the proxy / direct" "skipped (needs root)" "<= 2x; <= 4x"
fi

# 8. Simultaneous pod relabels in Kubernetes mode with real BPF.
if ! part relabel; then
	:
elif [ $root = 0 ]; then
	row "$RELABEL_PODS simultaneous pod relabels -> realised, p99" "skipped (needs root)" "<= 300 ms"
elif [ $kube = 0 ]; then
	row "$RELABEL_PODS simultaneous pod relabels -> realised, p99" "skipped (no kube-apiserver in $kubebin: scripts/kube-bin.sh)" "<= 300 ms"
else
	echo "relabel bench ($RELABEL_PODS pods)..." >&2
	MEMBRANE_BENCH_K8S=1 BENCH_RELABEL_PODS=$RELABEL_PODS BENCH_POLICY_ENDPOINTS=$RELABEL_PODS BENCH_POLICY_ROUNDS=1 \
		$GO test -run '^TestK8sBench$' -count=1 -v -timeout 30m ./test/k8sbench/ >"$LOGDIR/relabel.txt" 2>&1
	r=$(grep -m1 '^all [0-9]* pods relabelled at once' "$LOGDIR/relabel.txt")
	if [ -n "$r" ]; then
		row "$RELABEL_PODS simultaneous pod relabels -> realised, p99 (median)" \
			"$(sed -n 's/.* median \([^ ]*\) p90 [^ ]* p99 \([^ ]*\) .*/\2 (\1)/p' <<<"$r")" "<= 300 ms"
	else
		row "$RELABEL_PODS simultaneous pod relabels -> realised" "FAILED (see $LOGDIR/relabel.txt)" "<= 300 ms"
	fi
fi

# 9. Same-node pod to pod against plain veths and routes.
if ! part samenode; then
	:
elif [ $root = 1 ]; then
	echo "same-node bench..." >&2
	MEMBRANE_XNODE_BENCH=1 $GO test -run '^TestSameNodeNumbers$' -count=1 -v -timeout 15m ./test/multinode/ >"$LOGDIR/samenode.txt" 2>&1
	sn=$(grep -m1 'SUMMARY same-node stream' "$LOGDIR/samenode.txt")
	if [ -n "$sn" ]; then
		row "same-node pod to pod / plain veth + routes: request/response rate; stream throughput" \
			"$(sed -n 's/.*plain \([0-9]*\) transactions\/s = \([0-9.]*\).*/\2/p' <<<"$sn"); $(sed -n 's/.*plain \([0-9.]*\) Gbit\/s = \([0-9.]*\);.*/\2/p' <<<"$sn") (plain $(sed -n 's/.*plain \([0-9]*\) transactions\/s.*/\1/p' <<<"$sn")/s; $(sed -n 's/.*plain \([0-9.]*\) Gbit\/s.*/\1/p' <<<"$sn") Gbit/s)" \
			">= 0.95 both"
	else
		row "same-node pod to pod / plain veth + routes" "FAILED (see $LOGDIR/samenode.txt)" ">= 0.95 both"
	fi
else
	row "same-node pod to pod / plain veth + routes" "skipped (needs root)" ">= 0.95 both"
fi

# 10. Cross-node round trip against plain veths and routes.
if ! part xnode; then
	:
elif [ $root = 1 ]; then
	echo "cross-node bench..." >&2
	MEMBRANE_XNODE_BENCH=1 $GO test -run '^TestCrossNodeNumbers$' -count=1 -v -timeout 15m ./test/multinode/ >"$LOGDIR/xnode.txt" 2>&1
	# The table's rows: | mode | Gbit/s | vs baseline | RTT p50 | RTT p99 | p50 vs baseline |
	xrow() { grep -E "^ *\\| $1 \\|" "$LOGDIR/xnode.txt" | head -1 | awk -F'|' '{gsub(/ /, "", $5); gsub(/ /, "", $7); print $7 " (p50 " $5 ")"}'; }
	nat=$(xrow native)
	tun=$(xrow tunnel)
	base=$(grep -E '^ *\| baseline \|' "$LOGDIR/xnode.txt" | head -1 | awk -F'|' '{gsub(/ /, "", $5); print $5}')
	if [ -n "$nat" ] && [ -n "$tun" ]; then
		row "cross-node round trip p50 / plain veth + routes: native; tunnel" "$nat; $tun (plain $base)" "<= 1.1x; <= 1.3x"
	else
		row "cross-node round trip / plain veth + routes" "FAILED (see $LOGDIR/xnode.txt)" "<= 1.1x; <= 1.3x"
	fi
else
	row "cross-node round trip / plain veth + routes" "skipped (needs root)" "<= 1.1x; <= 1.3x"
fi

# 11. The agent process's resident memory.
if ! part mem; then
	:
elif [ $root = 0 ]; then
	row "agent resident memory" "skipped (needs root)" "<= 48 MiB; <= 64 MiB"
else
	run='^TestMemStandalone$'
	[ $kube = 1 ] && run='^TestMem(Standalone|Kubernetes)$'
	echo "agent memory ($MEM_PODS pods, $MEM_REMOTE remote endpoints)..." >&2
	MEMBRANE_BENCH_MEM=1 MEM_PODS=$MEM_PODS MEM_REMOTE=$MEM_REMOTE MEM_SETTLE=$MEM_SETTLE \
		$GO test -run "$run" -count=1 -v -timeout 30m ./test/agentmem/ >"$LOGDIR/mem.txt" 2>&1
	found=0
	while IFS='|' read -r what value target; do
		[ -n "${target// /}" ] || continue # the idle readings: context in the log
		what=${what#headline: }
		value=${value# }
		row "${what% }" "${value% }" "${target# }"
		found=1
	done < <(grep '^headline: agent VmRSS' "$LOGDIR/mem.txt")
	[ $found = 1 ] || row "agent resident memory" "FAILED (see $LOGDIR/mem.txt)" "<= 48 MiB; <= 64 MiB"
	[ $kube = 1 ] || row "agent VmRSS, Kubernetes mode" "skipped (no kube-apiserver in $kubebin: scripts/kube-bin.sh)" "<= 64"
fi

# 12. Kernel memory per endpoint (maps; programs are per node).
if ! part bpf; then
	:
elif [ $root = 1 ]; then
	echo "BPF bench ($BPF_N endpoints)..." >&2
	MEMBRANE_BENCH_BPF=1 BENCH_N=$BPF_N $GO test -run '^TestBPFBench$' -count=1 -v -timeout 30m ./datapath/ >"$LOGDIR/bpf.txt" 2>&1
	km=$(grep -m1 'kernel memory per endpoint: ' "$LOGDIR/bpf.txt")
	if [ -n "$km" ]; then
		row "kernel memory per endpoint (maps, programs, links)" \
			"$(sed -n 's/.*per endpoint [0-9]* bytes (\([0-9.]*\) KiB).*per node (shared by every endpoint) [0-9]* bytes (\([0-9.]*\) KiB).*/\1 KiB (per node, shared: \2 KiB)/p' <<<"$km")" "<= 16 KiB"
	else
		row "kernel memory per endpoint" "FAILED (see $LOGDIR/bpf.txt)" "<= 16 KiB"
	fi
else
	row "kernel memory per endpoint" "skipped (needs root)" "<= 16 KiB"
fi

out=$(
	echo "Headline run of $start_date (commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)), kernel $(uname -r), $(nproc) CPUs,"
	echo "load average $start_load at the start, $(load) at the end ($(date -u '+%H:%M UTC'))."
	echo
	echo "| what | value | target | load (1 min) at the part's start |"
	echo "|---|---|---|---|"
	printf '%s\n' "${rows[@]}"
)
echo "$out"
if [ -n "${BENCH_OUT:-}" ]; then
	echo "$out" >"$BENCH_OUT"
fi
