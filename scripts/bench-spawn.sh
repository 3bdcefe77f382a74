#!/usr/bin/env bash
# Runs the fork spawn benchmarks (internal/broker/spawn_bench_test.go)
# COUNT rounds of ITERS ops each and prints the median ms/op of each and,
# per repository size, ForkSpawn / ForkSpawnBare (target <= 1.3x).
#
# Usage: scripts/bench-spawn.sh [COUNT] [ITERS]    (defaults: 3, 5)
# Raw `go test` output goes to $OUT (default: a temp file, path printed).
set -euo pipefail
cd "$(dirname "$0")/.."
count=${1:-3}
iters=${2:-5}
out=${OUT:-$(mktemp -t jailbee-bench-spawn.XXXXXX)}
echo "machine: $(nproc) CPUs, $(go version | cut -d' ' -f3-), load $(cut -d' ' -f1-3 /proc/loadavg)"
: >"$out"
for _ in $(seq "$count"); do
	go test -run '^$' -bench '^BenchmarkForkSpawn' -benchtime "${iters}x" -count 1 -timeout 60m ./internal/broker | tee -a "$out" | grep -E '^(Benchmark|ok|FAIL)' >&2
done
echo "raw output: $out"

awk '
/^BenchmarkForkSpawn/ {
	name = $1; sub(/-[0-9]+$/, "", name); sub(/^Benchmark/, "", name)
	for (i = 2; i < NF; i++) if ($(i+1) == "ms/op") { v[name, ++n[name]] = $i + 0 }
}
function median(name,   k, j, t, a, m) {
	m = n[name]
	if (m == 0) return 0
	for (k = 1; k <= m; k++) a[k] = v[name, k]
	for (k = 1; k <= m; k++) for (j = k + 1; j <= m; j++) if (a[j] < a[k]) { t = a[k]; a[k] = a[j]; a[j] = t }
	return (m % 2) ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
}
END {
	printf "%-36s %14s  %s\n", "benchmark", "median ms/op", "runs"
	for (name in n) printf "%-36s %14.1f  %d\n", name, median(name), n[name] | "sort"
	close("sort")
	print ""
	split("1 100 10000", sizes, " ")
	for (k = 1; k <= 3; k++) {
		a = "ForkSpawn/files=" sizes[k]; b = "ForkSpawnBare/files=" sizes[k]
		if (median(a) && median(b)) printf "%-44s %6.2fx   (target <= 1.3x)\n", a " / bare", median(a) / median(b)
	}
}' "$out"
