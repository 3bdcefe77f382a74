#!/usr/bin/env bash
# Runs the broker round-trip benchmarks (internal/broker/bench_test.go;
# the spawn benchmarks have scripts/bench-spawn.sh) COUNT rounds
# and prints the median ns/op of each benchmark and the
# ratios docs/benchmarks.md reports:
#
#   list / raw echo, read / raw echo       (target <= 3x)
#   send / raw SQLite commit               (target <= 1.5x)
#   a quiet send's p99 under another orchestrator's 7-connection flood /
#     its p99 alone                        (target <= 2x)
#   dispatch / bare relay + one fsync      (target <= 3x; as root, through
#                                          scripts/bench-dispatch.sh)
#   raw SQLite commit / concurrent send    (throughput, target >= 3x;
#                                           scripts/bench-groupcommit.sh
#                                           gives min/median/max and the
#                                           store-level figure)
#
# Usage: scripts/bench.sh [COUNT] [BENCHTIME]    (defaults: 5, 2s)
# Raw `go test` output goes to $OUT (default: a temp file, path printed).
# Run it on an otherwise idle machine: the figures are wall-clock times.
set -euo pipefail
cd "$(dirname "$0")/.."
count=${1:-5}
benchtime=${2:-2s}
out=${OUT:-$(mktemp -t jailbee-bench.XXXXXX)}

tmp=$(go env GOTMPDIR)
tmp=${tmp:-${TMPDIR:-/tmp}}
echo "machine: $(nproc) CPUs, $(go version | cut -d' ' -f3-), temp dirs on $(df -T "$tmp" | awk 'NR==2{print $2}') ($tmp), load $(cut -d' ' -f1-3 /proc/loadavg)"
# One full pass per round (not -count, which repeats each benchmark back to
# back), so a burst of outside disk or CPU load hits every benchmark alike.
: >"$out"
for _ in $(seq "$count"); do
	go test -run '^$' -bench '^Benchmark(Raw|List|Read|Send)' -benchtime "$benchtime" -count 1 ./internal/broker | tee -a "$out" | grep -E '^(Benchmark|ok|FAIL)' >&2
done
echo "raw output: $out"

awk '
/^Benchmark/ {
	name = $1; sub(/-[0-9]+$/, "", name); sub(/^Benchmark/, "", name)
	for (i = 2; i < NF; i++) {
		if ($(i+1) == "ns/op") { v[name, ++n[name]] = $i + 0 }
		if ($(i+1) == "p99-ns") { p = name "/p99"; v[p, ++n[p]] = $i + 0 }
	}
}
function median(name,   k, j, t, a, m) {
	m = n[name]
	if (m == 0) return 0
	for (k = 1; k <= m; k++) a[k] = v[name, k]
	for (k = 1; k <= m; k++) for (j = k + 1; j <= m; j++) if (a[j] < a[k]) { t = a[k]; a[k] = a[j]; a[j] = t }
	return (m % 2) ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
}
function ratio(a, b, target) {
	if (median(a) == 0 || median(b) == 0) return
	printf "%-44s %6.2fx   %s\n", a " / " b, median(a) / median(b), target
}
END {
	printf "%-44s %14s  %s\n", "benchmark", "median ns/op", "runs"
	for (name in n) printf "%-44s %14.0f  %d\n", name, median(name), n[name] | "sort"
	close("sort")
	print ""
	ratio("List", "RawEcho", "(target <= 3x)")
	ratio("Read", "RawEcho", "(target <= 3x)")
	ratio("SendMessage", "RawSQLiteCommit", "(target <= 1.5x)")
	ratio("SendMessage", "RawSQLiteCommitSchema", "")
	ratio("RawSQLiteCommitSchema", "RawSQLiteCommit", "")
	ratio("SendFairness/flood7/p99", "SendFairness/unloaded/p99", "(target <= 2x)")
	ratio("RawSQLiteCommit", "SendConcurrent", "(throughput, target >= 3x)")
}' "$out"

# branchbox's tool-request dispatch (root only: the consumer's files are
# chowned) has its own script; it runs the same number of rounds.
if [ "$(id -u)" = 0 ]; then
	OUT= scripts/bench-dispatch.sh "$count" # its own raw output file
fi
