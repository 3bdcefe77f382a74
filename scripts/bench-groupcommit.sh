#!/usr/bin/env bash
# Runs the group-commit benchmarks COUNT rounds and prints, over the
# rounds, the min / median / max of each ratio, each taken within one round
# (docs/benchmarks.md):
#
#   RawSQLiteCommit / SendConcurrent    8 sandboxes sending at once over their
#                                       sockets, throughput (target >= 3x)
#   RawSQLiteCommit / DeliverConcurrent 8 senders calling the store's durable
#   BareCommit / DeliverConcurrent      delivery directly, throughput
#   SendMessage / RawSQLiteCommit       one sender, time per send (target <= 1.5x)
#
# RawSQLiteCommit and BareCommit are one INSERT and COMMIT at
# synchronous=FULL: one fsync per commit.
#
# Usage: scripts/bench-groupcommit.sh [COUNT] [BENCHTIME]    (defaults: 5, 2s)
# Raw `go test` output goes to $OUT (default: a temp file, path printed).
set -euo pipefail
cd "$(dirname "$0")/.."
count=${1:-5}
benchtime=${2:-2s}
out=${OUT:-$(mktemp -t jailbee-bench-gc.XXXXXX)}
echo "machine: $(nproc) CPUs, $(go version | cut -d' ' -f3-), load $(cut -d' ' -f1-3 /proc/loadavg)"
: >"$out"
for r in $(seq "$count"); do
	echo "round $r" >>"$out"
	go test -run '^$' -bench '^Benchmark(RawSQLiteCommit|SendMessage|SendConcurrent)$' -benchtime "$benchtime" -count 1 ./internal/broker | tee -a "$out" | grep -E '^(Benchmark|ok|FAIL)' >&2
	go test -run '^$' -bench '^Benchmark(BareCommit|DeliverMessage|DeliverConcurrent)$' -benchtime "$benchtime" -count 1 ./internal/store | tee -a "$out" | grep -E '^(Benchmark|ok|FAIL)' >&2
done
echo "raw output: $out"

awk '
/^round / { r = $2; rounds = r }
/^Benchmark/ {
	name = $1; sub(/-[0-9]+$/, "", name); sub(/^Benchmark/, "", name)
	for (i = 2; i < NF; i++) if ($(i+1) == "ns/op") ns[name, r] = $i + 0
}
# ratio prints min / median / max over the rounds of a/b.
function ratio(a, b, target,   k, m, j, t, v) {
	m = 0
	for (k = 1; k <= rounds; k++) if (ns[a, k] > 0 && ns[b, k] > 0) v[++m] = ns[a, k] / ns[b, k]
	if (m == 0) return
	for (k = 1; k <= m; k++) for (j = k + 1; j <= m; j++) if (v[j] < v[k]) { t = v[k]; v[k] = v[j]; v[j] = t }
	printf "%-38s %6.2fx %6.2fx %6.2fx   %s\n", a " / " b, v[1], (m % 2) ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2, v[m], target
}
END {
	printf "%-38s %7s %7s %7s\n", "ratio (per round)", "min", "median", "max"
	ratio("RawSQLiteCommit", "SendConcurrent", "(throughput, target >= 3x)")
	ratio("RawSQLiteCommit", "DeliverConcurrent", "(throughput, store level)")
	ratio("BareCommit", "DeliverConcurrent", "(throughput, store level)")
	ratio("SendMessage", "RawSQLiteCommit", "(target <= 1.5x)")
	ratio("DeliverMessage", "BareCommit", "")
}' "$out"
