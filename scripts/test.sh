#!/usr/bin/env bash
# Runs the whole test suite: installs what the tests need, then go vet,
# staticcheck, go test with the race detector, and every fuzz target for a
# few seconds (scripts/fuzz.sh). With JAILBEE_TEST_INCUS=1 (.ci/run sets
# it once scripts/incus-setup.sh has set Incus up) the Incus backend's own
# tests must run, and the broker's and the host commands' suites run a
# second time with their sandboxes on Incus containers, from the same test
# code (JAILBEE_TEST_BACKEND=incus). That pass goes without the race
# detector: the first pass already ran the same code under it, and on
# Incus the time goes to incusd, not to Go. With BRANCHBOX_TEST_DOCKER=1
# (.ci/run sets it once scripts/docker-setup.sh has set Docker up) the
# branchbox launch tests must run rather than skip, and the README's
# launch demo (scripts/launch-demo.sh) runs at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
bash scripts/install-deps.sh
go vet ./...
# staticcheck, pinned and built once into the user's cache: the bugs go
# vet does not look for (a value never used, a comparison always true).
sc="${XDG_CACHE_HOME:-$HOME/.cache}/agentbox/staticcheck-v0.8.2"
if [ ! -x "$sc/staticcheck" ]; then
	GOBIN="$sc" go install honnef.co/go/tools/cmd/staticcheck@v0.8.2
fi
"$sc/staticcheck" ./...
# One package near the default 10-minute limit on a loaded 2-core
# machine (internal/broker under the race detector) must not fail CI by
# the clock alone: 30 minutes still ends a hang well inside CI's time.
go test -race -count=1 -timeout 30m ./...
# Every fuzz target for a few seconds: a failing input fails the run.
bash scripts/fuzz.sh
if [ "${JAILBEE_TEST_INCUS:-}" = 1 ]; then
	echo "test.sh: the broker and host-command suites again, on Incus" >&2
	JAILBEE_TEST_BACKEND=incus go test -count=1 -timeout 45m ./internal/broker ./cmd/jailbee
else
	echo "test.sh: no Incus pass (set Incus up with scripts/incus-setup.sh, then JAILBEE_TEST_INCUS=1)" >&2
fi
if [ "${BRANCHBOX_TEST_DOCKER:-}" = 1 ]; then
	echo "test.sh: the branchbox launch demo, on the Docker engine" >&2
	if ! out=$(bash scripts/launch-demo.sh 2>&1); then
		printf '%s\n' "$out" >&2
		exit 1
	fi
fi
