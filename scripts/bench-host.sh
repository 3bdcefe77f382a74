#!/usr/bin/env bash
# Runs the host command benchmark (internal/broker/hostcmd_bench_test.go)
# COUNT rounds of ITERS ops each and prints, over the rounds, the
# min/median/max of:
#
#   new at 1,000 sandboxes / new at 1 sandbox      (target <= 1.2x)
#   broker VmRSS at 1,000 sandboxes, 8 idle connections each (target < 128 MiB)
#
# Each round is one `go test` run: two broker processes, one serving 1
# sandbox and one 1,000, one `new` on each in turn per op
# (docs/benchmarks.md says what the 1,000 sandboxes are). It also prints
# each broker's own CPU time per op. As root, with bubblewrap installed.
#
# Usage: scripts/bench-host.sh [COUNT] [ITERS]    (defaults: 3, 10)
# Raw `go test` output goes to $OUT (default: a temp file, path printed).
set -euo pipefail
cd "$(dirname "$0")/.."
count=${1:-3}
iters=${2:-10}
out=${OUT:-$(mktemp -t jailbee-bench-host.XXXXXX)}
echo "machine: $(nproc) CPUs, $(go version | cut -d' ' -f3-), load $(cut -d' ' -f1-3 /proc/loadavg)"
: >"$out"
for _ in $(seq "$count"); do
	go test -run '^$' -bench '^BenchmarkHostNew$' -benchtime "${iters}x" -count 1 -timeout 60m ./internal/broker | tee -a "$out" | grep -E '^(Benchmark|ok|FAIL)' >&2
done
echo "raw output: $out"

awk '
/^BenchmarkHostNew/ {
	k = ++rounds
	for (i = 2; i < NF; i++) {
		if ($(i+1) == "new1-ms/op") one[k] = $i + 0
		if ($(i+1) == "new1000-ms/op") many[k] = $i + 0
		if ($(i+1) == "new1000/new1") ratio[k] = $i + 0
		if ($(i+1) == "cpu1-ms/op") cpu1[k] = $i + 0
		if ($(i+1) == "cpu1000-ms/op") cpu[k] = $i + 0
		if ($(i+1) == "rss1-MiB") mem1[k] = $i + 0
		if ($(i+1) == "rss1000-MiB") mem[k] = $i + 0
	}
}
function sort(arr,   k, j, t) {
	for (k = 1; k <= rounds; k++) for (j = k + 1; j <= rounds; j++) if (arr[j] < arr[k]) { t = arr[k]; arr[k] = arr[j]; arr[j] = t }
}
function mid(arr) { return (rounds % 2) ? arr[(rounds + 1) / 2] : (arr[rounds / 2] + arr[rounds / 2 + 1]) / 2 }
function line(what, arr, fmt, target) {
	sort(arr)
	printf "%-40s " fmt " / " fmt " / " fmt "   %s\n", what, arr[1], mid(arr), arr[rounds], target
}
END {
	if (!rounds) { print "no complete round"; exit 1 }
	printf "%d rounds: min / median / max\n", rounds
	line("new, 1 sandbox (ms/op)", one, "%7.1f", "")
	line("new, 1,000 sandboxes (ms/op)", many, "%7.1f", "")
	line("new at 1,000 / new at 1", ratio, "%6.2fx", "(target <= 1.2x)")
	line("broker CPU per new, 1 sandbox (ms)", cpu1, "%7.1f", "")
	line("broker CPU per new, 1,000 (ms)", cpu, "%7.1f", "(its rounds included)")
	line("broker VmRSS, 1 sandbox (MiB)", mem1, "%7.1f", "")
	line("broker VmRSS, 1,000 sandboxes (MiB)", mem, "%7.1f", "(target < 128 MiB)")
}' "$out"
