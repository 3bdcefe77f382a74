#!/usr/bin/env bash
# End-to-end demo on the local (bubblewrap) backend: a broker, an
# orchestrator sandbox that spawns two children, each running a scripted
# agent (testdata/agent/agent.sh) that commits and reports done; the
# reports arrive with the children's commits imported into the
# orchestrator's repository, and the children are destroyed. Then an
# orchestrator and a child made on the host exchange messages, and the
# orchestrator's branch, with a child's work merged, comes back into the
# host repository with jailbee fetch.
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
# shown prints a command as it can be pasted into a shell: each word that
# needs it in single quotes.
shown() {
	local words=() w
	for w in "$@"; do
		if [[ $w =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
			words+=("$w")
		else
			words+=("'${w//\'/\'\\\'\'}'")
		fi
	done
	printf '$ %s\n' "${words[*]}"
}
run() { shown "$@"; "$@"; }

step "build jailbee (static: CGO_ENABLED=0)"
CGO_ENABLED=0 go build -o "$work/bin/jailbee" ./cmd/jailbee
ln -s jailbee "$work/bin/jb"
export PATH="$work/bin:$PATH"
export JAILBEE_STATE_DIR="$work/state"
# The commands below, pasted into another shell while the demo runs, need:
printf '$ export PATH=%s:"$PATH" JAILBEE_STATE_DIR=%s\n' "$work/bin" "$work/state"

step "a host repository, whose default agent is the scripted one"
git init -q -b main "$work/repo"
mkdir "$work/repo/.jailbee"
cp testdata/agent/agent.sh "$work/repo/.jailbee/agent.sh"
cat >"$work/repo/.jailbee/config.yaml" <<'YAML'
agents:
  scripted:
    command: "sh .jailbee/agent.sh"
    prompt_args: ["{prompt}"]
default_agent: scripted
YAML
git -C "$work/repo" add -A
git -C "$work/repo" -c user.name=demo -c user.email=demo@example.com commit -q -m "initial commit"
echo "repo: $work/repo"
cat "$work/repo/.jailbee/config.yaml"

step "start the broker"
flags=()
if [ "$(id -u)" -ne 0 ]; then
	# Per-sandbox cgroups need root (or a delegated cgroup v2 subtree).
	echo "not root: sandboxes run as your uid, without per-sandbox limits"
	flags=(--no-limits)
fi
if [ "${DEMO_BACKEND:-local}" != local ]; then
	# DEMO_BACKEND=incus: the same demo on Incus containers (docs/incus.md).
	flags+=(--backend "$DEMO_BACKEND")
	# The btrfs pool scripts/incus-setup.sh makes, where there is one.
	if [ "$DEMO_BACKEND" = incus ] && incus storage show jailbee >/dev/null 2>&1; then
		flags+=(--incus-pool jailbee)
	fi
fi
shown jailbee broker "${flags[@]}"
jailbee broker "${flags[@]}" >"$work/broker.log" 2>&1 &
broker_pid=$!
for _ in $(seq 50); do [ -S "$work/state/admin.sock" ] && break; sleep 0.1; done
if ! kill -0 "$broker_pid" 2>/dev/null; then
	echo "the broker did not start:" >&2
	cat "$work/broker.log" >&2
	broker_pid=
	exit 1
fi

step "an orchestrator, which spawns two children from inside its sandbox"
run jb new lead --repo "$work/repo" --orchestrator
run jb exec lead -- jailbee inbox send spawn --branch fix/parser --id spawn-parser --wait --text "Fix the parser"
run jb exec lead -- jailbee inbox send spawn --branch docs/intro --id spawn-intro --wait --text "Write the intro"
run jb ls

step "each child's agent commits and reports done; the reports arrive imported"
for _ in $(seq 600); do
	[ "$(jb exec lead -- jailbee inbox ls | grep -c 'done: done:')" -ge 2 ] && break
	sleep 0.1
done
run jb exec lead -- jailbee inbox ls
id=$(jb exec lead -- jailbee inbox ls | awk '/from fix-parser/{print $1}')
run jb exec lead -- jailbee inbox read --json "$id"
run jb exec lead -- git log --oneline --all
run jb logs fix-parser

step "both children are destroyed once their work is imported (on_done: destroy)"
for _ in $(seq 100); do
	[ "$(jb ls | grep -c child)" -eq 0 ] && break
	sleep 0.1
done
run jb ls
sleep 1.2 # status reads the snapshot of the last broker round (every second)
run jb exec lead -- jailbee inbox status

step "a child made on the host: messages both ways"
run jb new fix-lexer --branch fix/lexer --parent lead
run jb exec lead -- jailbee inbox send message --child fix-lexer --id reply-0004 --wait --text "Use the existing lexer, do not add a new one."
run jb exec fix-lexer -- jailbee inbox wait --wake-on msg:note,question --timeout 10s
id=$(jb exec fix-lexer -- jailbee inbox ls | awk 'NR==1{print $1}')
run jb exec fix-lexer -- sh -c "echo 'Which lexer do you mean?' | jailbee inbox send message --kind question --reply-to $id --id msg-0002 --wait"
qid=$(jb exec lead -- jailbee inbox ls | awk '/question/{print $1}')
run jb exec lead -- jailbee inbox read --json "$qid"
run jb exec lead -- jailbee inbox children
run jb exec lead -- jailbee inbox grant

step "the work back in the host repository: the orchestrator takes a child's commits, jailbee fetch brings its branch home"
run jb exec lead -- git merge --ff-only refs/jailbee/from/fix-parser/fix/parser
run jb fetch lead
run git -C "$work/repo" log --oneline refs/jailbee/sandboxes/lead/main

step "clean up"
run jb destroy lead --force
run jb ls
echo
echo "demo finished"
