#!/usr/bin/env bash
# A managed Dev Container launch from start to teardown, as a user runs it
# on their own machine: a repository with a devcontainer config and a
# Compose file, a version 3 assignment laid out the way the rules require
# (owner-only files, digests, a trusted tool endpoint's socket), then
# `branchbox feature start`, a command and the provider in the container,
# one tool request from the consumer's file to its response, status, and
# `feature teardown`.
#
# Needs root (the workspace is delegated to another uid), a Docker engine
# with the Compose v2 plugin, the Dev Containers CLI and a local image
# whose user 1000:1000 exists (scripts/docker-setup.sh provides all of
# them, and the image agentbox-test/service:1). Set DEMO_IMAGE to use
# another local image (its id or name; it is never pulled).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
image_ref="${DEMO_IMAGE:-agentbox-test/service:1}"
image=$(docker image inspect --format '{{.Id}}' "$image_ref") || {
	echo "launch-demo: no local image $image_ref (run: sudo bash scripts/docker-setup.sh)" >&2
	exit 1
}

work=$(mktemp -d /tmp/branchbox-launch-demo.XXXXXX)
bin="$work/branchbox"
endpoint_pid=
# A failed step still leaves no container, volume, network or endpoint behind.
trap '[ -n "$endpoint_pid" ] && kill "$endpoint_pid" 2>/dev/null
[ -e "$work/state/features/demo" ] && "$bin" feature teardown demo --force >/dev/null 2>&1; rm -rf "$work"' EXIT
go build -o "$bin" ./cmd/branchbox

say() { printf '\n== %s\n' "$*"; }

say "a repository with a devcontainer config and a Compose file"
repo="$work/src/project"
mkdir -p "$repo/.devcontainer"
cat >"$repo/.devcontainer/devcontainer.json" <<'EOF'
{
	// The managed launch keeps this service, runs it as the consumer
	// (1000:1000, which remoteUser must be), and replaces the rest.
	"dockerComposeFile": ["../compose.yaml"],
	"service": "app",
	"remoteUser": "1000",
}
EOF
cat >"$repo/compose.yaml" <<'EOF'
services:
  app:
    build: .                     # reset: the assignment binds a preloaded image
    command: ["sleep", "infinity"]
    ports: ["8080:8080"]         # reset: the host is not reachable this way
EOF
echo "hello from the worktree" >"$repo/README"
git -C "$repo" init -q -b main
git -C "$repo" add -A
git -C "$repo" -c user.name=demo -c user.email=demo@example.invalid commit -qm "the project"
rev=$(git -C "$repo" rev-parse HEAD)

say "the assignment: run directory, value files and their digests, all owner-only"
managed="$work/managed"
run="$managed/demo-run"
mkdir -p "$run/materializations" "$run/tool-endpoints"
chmod 0700 "$run" "$run/materializations" "$run/tool-endpoints"
chmod 0755 "$managed"
token="$run/materializations/delivery-token"
printf 'demo-delivery-token-value' >"$token"
chmod 0600 "$token"
digest=$(sha256sum "$token" | cut -d' ' -f1)
capability="$run/materializations/tool-capability"
head -c 64 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' | head -c 40 >"$capability"
chmod 0600 "$capability"
cap_digest=$(sha256sum "$capability" | cut -d' ' -f1)

say "the trusted tool endpoint, outside the container: one handler run per request"
cat >"$work/handler.sh" <<'EOF'
#!/bin/sh
# The request frame is on stdin; stdout is the response's payload.
frame=$(cat)
printf '{"handled":"%s","frame_bytes":%d}' "$BRANCHBOX_TOOL_REQUEST_ID" "${#frame}"
EOF
chmod 0755 "$work/handler.sh"
socket="$run/tool-endpoints/demo.sock"
"$bin" tool-endpoint serve --socket "$socket" --handler "$work/handler.sh" 2>"$work/endpoint.log" &
endpoint_pid=$!
for _ in $(seq 100); do [ -S "$socket" ] && break; sleep 0.05; done
cat >"$run/assignment.json" <<EOF
{
  "version": "3",
  "run_id": "demo-run",
  "lease_id": "demo-assignment",
  "outer_runtime_id": "demo-outer",
  "workspace": "$work/src",
  "repository": {"path": "$repo", "revision": "$rev"},
  "task_branch": "task/demo",
  "tunnel_placement": "outer",
  "published_ports": [],
  "service_images": {"app": "$image"},
  "workspace_consumer": {"uid": 1000, "gid": 1000},
  "leases": [
    {"lease_id": "model", "scope": "model-identity", "consumer": "agent",
     "executable": "/usr/bin/env", "inherited_environment": ["DEMO_MODEL_TOKEN"],
     "expires_at": "2099-01-01T00:00:00Z", "materializations": []},
    {"lease_id": "delivery", "scope": "provider-environment", "consumer": "agent",
     "expires_at": "2099-01-01T00:00:00Z", "materializations": [
       {"source_path": "$token", "environment_name": "DEMO_DELIVERY_TOKEN", "sha256": "$digest"}]},
    {"lease_id": "demo-endpoint", "scope": "tool-endpoint", "consumer": "agent",
     "expires_at": "2099-01-01T00:00:00Z", "materializations": [
       {"source_path": "$socket", "target_path": "/run/branchbox/leases/tool-endpoints/demo.sock"}]},
    {"lease_id": "demo-requests", "scope": "tool-request", "consumer": "agent", "consumer_uid": 1000,
     "endpoint_lease_id": "demo-endpoint", "request_spool_target": "/run/branchbox/leases/tool-requests/demo",
     "replay_policy": "exact-digest-replay-v1", "expires_at": "2099-01-01T00:00:00Z", "materializations": [
       {"source_path": "$capability", "target_path": "/run/branchbox/leases/tool-requests/demo/.capability", "sha256": "$cap_digest"}]}
  ]
}
EOF
chmod 0600 "$run/assignment.json"
export BRANCHBOX_MANAGED_ROOT="$managed" BRANCHBOX_STATE_DIR="$work/state"
"$bin" managed validate "$run/assignment.json" --require-launch

say "branchbox feature start demo"
"$bin" feature start demo --repo "$repo" --runtime in-guest --runtime-manifest "$run/assignment.json"

say "a command in the container, as the consumer, in the worktree"
"$bin" feature exec demo --json -- sh -c 'id -u; cat README; touch new-file && ls -l new-file'

say "the provider: its whole environment (values are the demo's, printed here on purpose)"
DEMO_MODEL_TOKEN=demo-model-token "$bin" feature exec-provider demo --provider /usr/bin/env --inherit-env DEMO_MODEL_TOKEN --

say "one tool request: the consumer writes requests/hello.json in its spool"
spool=/run/branchbox/leases/tool-requests/demo
"$bin" feature exec demo -- sh -c 'cd '$spool' && cat .binding.json && umask 077 &&
  printf "{\"version\":\"1\",\"run_id\":\"demo-run\",\"lease_id\":\"demo-requests\",\"consumer\":\"agent\",\"request_id\":\"hello\",\"capability\":\"%s\",\"payload\":{\"say\":\"hello\"}}" "$(cat .capability)" >requests/.hello.tmp &&
  mv requests/.hello.tmp requests/hello.json'

say "branchbox feature dispatch-tool: staged, claimed, relayed, recorded, answered"
"$bin" feature dispatch-tool demo --lease demo-requests --request-id hello --wait-seconds 10 --json

say "the consumer reads responses/hello.json (its own, mode 0400)"
"$bin" feature exec demo -- sh -c "ls -l $spool/responses/hello.json && cat $spool/responses/hello.json"

say "status"
"$bin" feature status demo

say "teardown"
"$bin" feature teardown demo --force --json
echo
echo "launch-demo: ok"
