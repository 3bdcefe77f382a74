#!/usr/bin/env bash
# Installs what agentbox's demo and tests need on a Debian 12 machine:
# git, bubblewrap, procps (ps, inside sandboxes and in tests), tmux (a
# child's agent runs in a tmux session in its sandbox) and sqlite3
# (for inspecting broker.db by hand) and acl (getfacl: the delegation
# tests compare its view of the ACLs branchbox sets). Go itself is expected at
# /usr/local/go or on PATH. Idempotent; needs root for apt.
set -euo pipefail

need=()
command -v git >/dev/null || need+=(git)
command -v bwrap >/dev/null || need+=(bubblewrap)
command -v sqlite3 >/dev/null || need+=(sqlite3)
command -v ps >/dev/null || need+=(procps)
command -v tmux >/dev/null || need+=(tmux)
command -v getfacl >/dev/null || need+=(acl)
if [ ${#need[@]} -gt 0 ]; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "install-deps: need ${need[*]}; run as root or install them" >&2
		exit 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq "${need[@]}" >/dev/null
fi
if ! command -v go >/dev/null; then
	if [ -x /usr/local/go/bin/go ]; then
		echo "install-deps: add /usr/local/go/bin to PATH" >&2
	else
		echo "install-deps: Go is not installed" >&2
	fi
	exit 1
fi
