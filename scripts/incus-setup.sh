#!/usr/bin/env bash
# Installs and starts Incus for jailbee's Incus backend on a Debian 12
# machine, then builds the sandbox image (docs/incus.md):
#   - Incus from bookworm-backports, whose apt source is derived from the
#     machine's own (the URIs of /etc/apt/sources.list.d/debian.sources);
#   - incusd started without systemd when it is not running;
#   - a "dir" storage pool named default and the default profile's root disk;
#   - where the kernel has btrfs, a btrfs pool named jailbee on a loop file
#     (new sandboxes are snapshots of the unpacked image there: about 0.4 s
#     to create instead of 3-5 s on dir), and it holds each sandbox to its
#     disk limit (limits.disk), which dir cannot; `jailbee broker
#     --incus-pool jailbee` and the tests use it when it exists;
#   - `jailbee image build` (kept by Incus between runs: idempotent).
# Usage: scripts/incus-setup.sh [JAILBEE_BINARY]   (needs root)
set -euo pipefail
jailbee=${1:-}

if [ "$(id -u)" -ne 0 ]; then
	echo "incus-setup: run as root" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive

if ! command -v incus >/dev/null || ! command -v debootstrap >/dev/null; then
	src=/etc/apt/sources.list.d/debian.sources
	if [ ! -f /etc/apt/sources.list.d/bookworm-backports.sources ]; then
		uri=$(awk '/^URIs:/ {print $2; exit}' "$src")
		key=$(awk '/^Signed-By:/ {print $2; exit}' "$src")
		if [ -z "$uri" ]; then
			echo "incus-setup: no Debian mirror in $src" >&2
			exit 1
		fi
		cat >/etc/apt/sources.list.d/bookworm-backports.sources <<EOT
Types: deb
URIs: $uri
Suites: bookworm-backports
Components: main
Signed-By: ${key:-/usr/share/keyrings/debian-archive-keyring.gpg}
EOT
	fi
	apt-get update -qq
	apt-get install -y -qq -t bookworm-backports incus >/dev/null
	apt-get install -y -qq debootstrap >/dev/null
fi
if ! command -v mkfs.btrfs >/dev/null && grep -qw btrfs /proc/filesystems; then
	apt-get install -y -qq btrfs-progs >/dev/null || true
fi

if ! incus admin waitready --timeout 2 >/dev/null 2>&1; then
	nohup /usr/libexec/incus/incusd --group root >/var/log/incusd.log 2>&1 &
	incus admin waitready --timeout 60
fi
incus storage show default >/dev/null 2>&1 || incus storage create default dir >/dev/null
incus profile device show default 2>/dev/null | grep -q '^root:' ||
	incus profile device add default root disk path=/ pool=default >/dev/null
if ! incus storage show jailbee >/dev/null 2>&1 && command -v mkfs.btrfs >/dev/null &&
	grep -qw btrfs /proc/filesystems; then
	incus storage create jailbee btrfs size=30GiB >/dev/null ||
		echo "incus-setup: no btrfs pool (sandboxes go to the dir pool, slower to create)" >&2
fi

if [ -n "$jailbee" ]; then
	"$jailbee" image build
	# The btrfs pool unpacks an image once, at its first sandbox: do it now.
	if incus storage show jailbee >/dev/null 2>&1; then
		incus delete --force jailbee-warm-pool >/dev/null 2>&1 || true # a killed run's
		if incus init jailbee jailbee-warm-pool --storage jailbee -q >/dev/null 2>&1; then
			incus delete jailbee-warm-pool >/dev/null
		fi
	fi
fi
echo "incus-setup: Incus $(incus version | awk '/^Server version/ {print $3}') ready"
