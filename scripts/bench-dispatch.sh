#!/usr/bin/env bash
# Runs branchbox's tool-request dispatch benchmark
# (internal/managed/dispatch/bench_test.go, as root) COUNT rounds and
# prints, per sub-benchmark, min/median/max over the rounds of its ns/op
# and of its ratio to the bare relay plus one fsync measured in the same
# round (docs/benchmarks.md):
#
#   dispatch / bare-relay-fsync        (target <= 3x)
#   cached-replay / bare-relay-fsync
#
# Usage: scripts/bench-dispatch.sh [COUNT] [BENCHTIME]    (defaults: 5, 1s)
# Raw `go test` output goes to $OUT (default: a temp file, path printed).
set -euo pipefail
cd "$(dirname "$0")/.."
count=${1:-5}
benchtime=${2:-1s}
out=${OUT:-$(mktemp -t branchbox-bench-dispatch.XXXXXX)}
if [ "$(id -u)" != 0 ]; then
	echo "bench-dispatch: needs root (the consumer's files are chowned)" >&2
	exit 1
fi
tmp=$(go env GOTMPDIR)
tmp=${tmp:-${TMPDIR:-/tmp}}
echo "machine: $(nproc) CPUs, $(go version | cut -d' ' -f3-), temp dirs on $(df -T "$tmp" | awk 'NR==2{print $2}') ($tmp), load $(cut -d' ' -f1-3 /proc/loadavg)"
: >"$out"
for _ in $(seq "$count"); do
	go test -run '^$' -bench '^BenchmarkDispatch$' -benchtime "$benchtime" -count 1 ./internal/managed/dispatch | tee -a "$out" | grep -E '^(Benchmark|ok|FAIL)' >&2
done
echo "raw output: $out"

awk '
/^BenchmarkDispatch\// {
	name = $1; sub(/^BenchmarkDispatch\//, "", name); sub(/-[0-9]+$/, "", name)
	for (i = 2; i < NF; i++) if ($(i+1) == "ns/op") ns[name] = $i + 0
	if (name == "bare-relay-fsync") round++
	if (name != "bare-relay-fsync" && ns["bare-relay-fsync"] > 0) {
		k = ++n[name]; ratio[name, k] = ns[name] / ns["bare-relay-fsync"]; per[name, k] = ns[name]
	}
	if (name == "bare-relay-fsync") { k = ++n[name]; ratio[name, k] = 1; per[name, k] = ns[name] }
}
function sorted(arr, name, a,   k, j, t, m) {
	m = n[name]
	for (k = 1; k <= m; k++) a[k] = arr[name, k]
	for (k = 1; k <= m; k++) for (j = k + 1; j <= m; j++) if (a[j] < a[k]) { t = a[k]; a[k] = a[j]; a[j] = t }
	return m
}
function stats(arr, name, fmt,   a, m) {
	m = sorted(arr, name, a)
	return sprintf(fmt " / " fmt " / " fmt, a[1], (m % 2) ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2, a[m])
}
END {
	printf "%-18s %6s %30s   %s\n", "sub-benchmark", "rounds", "ms/op min / median / max", "x bare min / median / max"
	split("bare-relay-fsync dispatch cached-replay", names, " ")
	for (i = 1; i <= 3; i++) {
		s = names[i]
		if (!n[s]) continue
		for (k = 1; k <= n[s]; k++) ms[s, k] = per[s, k] / 1e6
		printf "%-18s %6d %30s   %s\n", s, n[s], stats(ms, s, "%.2f"), stats(ratio, s, "%.2fx")
	}
	print "(target: dispatch <= 3x the bare relay plus one fsync)"
}' "$out"
