#!/usr/bin/env bash
# Runs the fork spawn benchmark (internal/broker/spawn_bench_test.go)
# COUNT rounds of ITERS ops each (each op: one bare clone-and-start, then
# one fork spawn) and prints, per repository size, the medians over the
# rounds of spawn-ms/op, bare-ms/op and spawn/bare (target <= 1.3x on
# the local backend, <= 1.2x on Incus). JAILBEE_TEST_BACKEND=incus runs it
# on Incus containers (docs/benchmarks.md).
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
	go test -run '^$' -bench '^BenchmarkForkSpawn$' -benchtime "${iters}x" -count 1 -timeout 60m ./internal/broker | tee -a "$out" | grep -E '^(Benchmark|ok|FAIL)' >&2
done
echo "raw output: $out"

awk '
/^BenchmarkForkSpawn\// {
	size = $1; sub(/^.*files=/, "", size); sub(/-[0-9]+$/, "", size)
	k = ++runs[size]
	for (i = 2; i < NF; i++) {
		if ($(i+1) == "spawn-ms/op") spawn[size, k] = $i + 0
		if ($(i+1) == "bare-ms/op") bare[size, k] = $i + 0
		if ($(i+1) == "spawn/bare") ratio[size, k] = $i + 0
	}
}
function median(arr, size,   k, j, t, a, m) {
	m = runs[size]
	for (k = 1; k <= m; k++) a[k] = arr[size, k]
	for (k = 1; k <= m; k++) for (j = k + 1; j <= m; j++) if (a[j] < a[k]) { t = a[k]; a[k] = a[j]; a[j] = t }
	return (m % 2) ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
}
END {
	printf "%-8s %6s %16s %15s %12s\n", "files", "rounds", "spawn ms/op", "bare ms/op", "spawn/bare"
	split("1 100 10000", sizes, " ")
	for (i = 1; i <= 3; i++) {
		s = sizes[i]
		if (!runs[s]) continue
		printf "%-8s %6d %16.1f %15.1f %11.2fx\n", s, runs[s], median(spawn, s), median(bare, s), median(ratio, s)
	}
	print "(medians over the rounds; target spawn/bare <= " target ")"
}' target="$([ "${JAILBEE_TEST_BACKEND:-local}" = incus ] && echo 1.2x || echo 1.3x)" "$out"
