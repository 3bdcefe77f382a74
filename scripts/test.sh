#!/usr/bin/env bash
# Runs the whole test suite: installs what the tests need, then
# go vet and go test with the race detector.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
bash scripts/install-deps.sh
go vet ./...
go test -race -count=1 ./...
