#!/usr/bin/env bash
# Runs the storage flood benchmark (internal/broker/storage_bench_test.go)
# COUNT rounds and prints min/median/max over the rounds of:
#
#   tree-MiB       MiB an orchestrator wrote into its 64 failed children's
#                  inboxes before the tree budget refused (budget 64 MiB)
#   read-left-MiB  MiB of read messages left after the retention sweep
#   full/empty     broker.db at its fullest / broker.db before the flood
#   after/empty    broker.db after every sandbox is deleted and the sweep
#                  ran / broker.db before the flood  (target < 2x)
#
# Usage: scripts/bench-storage.sh [COUNT]    (default: 3)
# Raw `go test` output goes to $OUT (default: a temp file, path printed).
set -euo pipefail
cd "$(dirname "$0")/.."
count=${1:-3}
out=${OUT:-$(mktemp -t jailbee-bench-storage.XXXXXX)}
echo "machine: $(nproc) CPUs, $(go version | cut -d' ' -f3-), load $(cut -d' ' -f1-3 /proc/loadavg)"
: >"$out"
for _ in $(seq "$count"); do
	go test -run '^$' -bench '^BenchmarkStorageFlood$' -benchtime 1x -count 1 ./internal/broker | tee -a "$out" | grep -E '^(Benchmark|ok|FAIL)' >&2
done
echo "raw output: $out"

awk '
/^BenchmarkStorageFlood/ {
	k = ++runs
	for (i = 2; i < NF; i++) if ($(i+1) ~ /^(tree-MiB|read-left-MiB|full\/empty|after\/empty)$/) v[$(i+1), k] = $i + 0
}
function stat(name,   k, j, t, a) {
	for (k = 1; k <= runs; k++) a[k] = v[name, k]
	for (k = 1; k <= runs; k++) for (j = k + 1; j <= runs; j++) if (a[j] < a[k]) { t = a[k]; a[k] = a[j]; a[j] = t }
	return sprintf("%10.2f %10.2f %10.2f", a[1], (runs % 2) ? a[(runs + 1) / 2] : (a[runs / 2] + a[runs / 2 + 1]) / 2, a[runs])
}
END {
	printf "%-14s %10s %10s %10s   (%d rounds)\n", "figure", "min", "median", "max", runs
	split("tree-MiB read-left-MiB full/empty after/empty", names, " ")
	for (i = 1; i <= 4; i++) printf "%-14s %s\n", names[i], stat(names[i])
	print "(target: tree-MiB <= 64, read-left-MiB 0, after/empty < 2)"
}' "$out"
