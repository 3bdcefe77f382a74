#!/usr/bin/env bash
# End-to-end demo on the local (bubblewrap) backend: a broker, an
# orchestrator sandbox and its child exchange messages with the inbox
# client, through their own broker sockets.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
bash scripts/install-deps.sh

work=$(mktemp -d /tmp/jb-demo.XXXXXX)
broker_pid=
cleanup() {
	if [ -n "$broker_pid" ]; then
		# Sandboxes outlive the broker: destroy what a failed run left
		# (its child with it) before the broker and the directory go.
		JAILBEE_STATE_DIR="$work/state" "$work/bin/jailbee" destroy lead --force >/dev/null 2>&1 || true
		kill "$broker_pid" 2>/dev/null && wait "$broker_pid" 2>/dev/null
	fi
	rm -rf "$work"
}
trap cleanup EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }

step "build jailbee (static: CGO_ENABLED=0)"
CGO_ENABLED=0 go build -o "$work/bin/jailbee" ./cmd/jailbee
ln -s jailbee "$work/bin/jb"
export PATH="$work/bin:$PATH"
export JAILBEE_STATE_DIR="$work/state"

step "a host repository"
git init -q -b main "$work/repo"
git -C "$work/repo" -c user.name=demo -c user.email=demo@example.com commit -q --allow-empty -m "initial commit"
echo "repo: $work/repo"

step "start the broker"
flags=()
if [ "$(id -u)" -ne 0 ]; then
	# Per-sandbox cgroups need root (or a delegated cgroup v2 subtree).
	echo "not root: sandboxes run as your uid, without per-sandbox limits"
	flags=(--no-limits)
fi
jailbee broker "${flags[@]}" >"$work/broker.log" 2>&1 &
broker_pid=$!
for _ in $(seq 50); do [ -S "$work/state/admin.sock" ] && break; sleep 0.1; done
if ! kill -0 "$broker_pid" 2>/dev/null; then
	echo "the broker did not start:" >&2
	cat "$work/broker.log" >&2
	broker_pid=
	exit 1
fi

step "create an orchestrator and a child"
run jb new lead --repo "$work/repo" --orchestrator
run jb new fix-parser --branch fix/parser --parent lead
run jb ls

step "the orchestrator messages its child (inside its sandbox, as uid 1000)"
run jb exec lead -- jailbee inbox send message --to fix-parser --id reply-0004 --wait --text "Use the existing parser, do not add a new one."

step "the child waits for mail, reads it, and asks a question back"
run jb exec fix-parser -- jailbee inbox wait --wake-on msg:note,question --timeout 10s
id=$(jb exec fix-parser -- jailbee inbox ls | awk 'NR==1{print $1}')
run jb exec fix-parser -- jailbee inbox read "$id"
run jb exec fix-parser -- sh -c "echo 'Which parser do you mean?' | jailbee inbox send message --kind question --reply-to $id --id msg-0002 --wait"

step "the orchestrator sees the question; in_reply_to is its own manifest id"
qid=$(jb exec lead -- jailbee inbox ls | awk '/question/{print $1}')
run jb exec lead -- jailbee inbox read --json "$qid"
run jb exec lead -- jailbee inbox send message --to fix-parser --reply-to "$qid" --id reply-0005 --text "The one in parse.go."

step "the child's copy of the answer points at the child's own question id (msg-0002)"
aid=$(jb exec fix-parser -- jailbee inbox ls | awk 'NR==1{print $1}')
run jb exec fix-parser -- jailbee inbox read --json "$aid"

step "statuses, children and grant, from the orchestrator's side"
sleep 1.2 # status reads the snapshot of the last broker round (every second)
run jb exec lead -- jailbee inbox status
run jb exec lead -- jailbee inbox children
run jb exec lead -- jailbee inbox grant

step "clean up"
run jb destroy lead --force
run jb ls
echo
echo "demo finished"
