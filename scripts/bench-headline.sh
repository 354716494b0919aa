#!/usr/bin/env bash
# Prints every headline number of BENCHMARKS.md from one run, as one
# markdown table with its targets, the date and the load average:
#   CNI ADD/DEL against ptp + host-local (test/cnibench, root),
#   sync PUT p99 and create+delete cycles/s on ext4 (pkg/agent/api),
#   membrane-sim lifecycles/s with 1% faults and heap per live endpoint,
#   restore time (test/crash, root), policy regeneration (test/policybench, root).
# Root-only parts are reported as skipped when not root. Each part's full
# output goes to $LOGDIR; the table also to $BENCH_OUT when set.
#
# Sizes (environment): HEADLINE_CNI_N (default 200 calls per arm: the
# nearest-rank p99 of 1-at-a-time ADDs is then the 198th, where of 100 it
# would be the 99th, next to the slowest), HEADLINE_PUT_N (20000 cycles
# per client count: several seconds, so that the state journal's
# checkpoints run inside the measurement), HEADLINE_SIM_DURATION (30s),
# HEADLINE_RESTORE_N (100), HEADLINE_POLICY_ENDPOINTS (200).
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

rows=()
row() { rows+=("| $1 | $2 | $3 |"); }
load() { cut -d' ' -f1-3 /proc/loadavg; }
root=0
[ "$(id -u)" = 0 ] && root=1

start_date=$(date -u '+%Y-%m-%d %H:%M UTC')
start_load=$(load)
echo "membrane headline run, $start_date, load average $start_load; logs in $LOGDIR" >&2

# 1. CNI ADD/DEL against ptp + host-local, both attach modes.
if [ $root = 1 ]; then
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
echo "sync PUT bench ($PUT_N cycles per client count)..." >&2
MEMBRANE_BENCH_EXT4=1 $GO test -run '^$' -bench 'Lifecycle/clients=(8|64)$' -benchtime "${PUT_N}x" \
	./pkg/agent/api/ >"$LOGDIR/put.txt" 2>&1
metric() { # metric <benchmark line> <unit>: the value before unit
	awk -v unit="$2" '{for (i = 2; i <= NF; i++) if ($i == unit) print $(i-1)}' <<<"$1"
}
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

# 3. membrane-sim: 10,000 live endpoints, 1% faults.
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

# 4. Restore time, 5. policy regeneration (root).
if [ $root = 1 ]; then
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
	row "restore time, policy regeneration" "skipped (needs root)" ""
fi

out=$(
	echo "Headline run of $start_date (commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)), kernel $(uname -r), $(nproc) CPUs,"
	echo "load average $start_load at the start, $(load) at the end ($(date -u '+%H:%M UTC'))."
	echo
	echo "| what | value | target |"
	echo "|---|---|---|"
	printf '%s\n' "${rows[@]}"
)
echo "$out"
if [ -n "${BENCH_OUT:-}" ]; then
	echo "$out" >"$BENCH_OUT"
fi
