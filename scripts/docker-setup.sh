#!/usr/bin/env bash
# Installs and starts what branchbox's Docker tests need on a Debian 12
# machine (package internal/managed/dockertest uses it; .ci/run runs this,
# then sets BRANCHBOX_TEST_DOCKER=1 so those tests fail rather than skip):
#   - the Docker engine (Debian's docker.io: Engine 20.10, API 1.41; a newer
#     docker client earlier on PATH is fine, it negotiates the API down),
#     with dockerd started without systemd when it is not running;
#   - Docker Compose v2 as a CLI plugin, built from its Go module (Debian's
#     docker-compose is v1, too old) and cached in /var/cache/agentbox;
#   - the Dev Containers CLI, from npm;
#   - a Debian bookworm minbase rootfs, debootstrapped from the machine's
#     own mirror (the URIs of /etc/apt/sources.list.d/debian.sources) and
#     cached as a tarball in /var/cache/agentbox;
#   - two local images, imported with `docker import` (never pulled):
#     agentbox-test/service:1 (the rootfs, a user dev 1000:1000 and
#     /usr/local/bin/agentbox-probe) and agentbox-test/tcp-proxy:1 (only
#     /tcp-proxy). Each carries a label agentbox.source, a hash of the Go
#     sources (and recipe) it was built from; a differing label rebuilds it.
# Idempotent, and about a second when everything is there already.
# Usage: scripts/docker-setup.sh   (needs root)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
export DEBIAN_FRONTEND=noninteractive

compose_version=2.40.3
devcontainer_version=0.89.0
cache=/var/cache/agentbox
plugin=/usr/local/lib/docker/cli-plugins/docker-compose
compose_cache=$cache/docker-compose-v$compose_version
rootfs_tar=$cache/debian-minbase-rootfs.tar
service_tag=agentbox-test/service:1
proxy_tag=agentbox-test/tcp-proxy:1
probe_src=internal/managed/dockertest/probe
proxy_src=internal/managed/dockertest/tcpproxy
# Bump when the service image's recipe (user, files, config) changes: it is
# part of the image's source hash, so existing images are rebuilt.
service_recipe=1

if [ "$(id -u)" -ne 0 ]; then
	echo "docker-setup: run as root" >&2
	exit 1
fi

work=
tmps=()
cleanup() {
	if [ -n "$work" ]; then rm -rf "$work"; fi
	if [ ${#tmps[@]} -gt 0 ]; then rm -f "${tmps[@]}"; fi
}
trap cleanup EXIT
# workdir makes (once) the scratch directory that the trap removes. It is
# on disk (/var/tmp), not a possibly small tmpfs: a rootfs goes there.
workdir() {
	if [ -z "$work" ]; then work=$(mktemp -d /var/tmp/docker-setup.XXXXXX); fi
}

# --- packages: the engine and debootstrap -----------------------------------
need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v debootstrap >/dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
	echo "docker-setup: installing ${need[*]}" >&2
	apt-get update -qq
	apt-get install -y -qq "${need[@]}" >/dev/null
fi
if ! command -v go >/dev/null; then
	echo "docker-setup: Go is not installed (expected at /usr/local/go or on PATH)" >&2
	exit 1
fi
# Not from apt: Debian's npm would replace a newer Node.js with its 18,
# and the Dev Containers CLI wants Node.js 20 or later.
if ! command -v devcontainer >/dev/null && ! command -v npm >/dev/null; then
	echo "docker-setup: npm is not installed (the Dev Containers CLI needs Node.js 20 or later and npm)" >&2
	exit 1
fi

# --- dockerd ----------------------------------------------------------------
if ! docker info >/dev/null 2>&1; then
	echo "docker-setup: starting dockerd (log: /var/log/dockerd.log)" >&2
	# Its own session: stopping this script (or its process group) leaves
	# the engine running for the tests. dockerd starts its own containerd.
	setsid nohup dockerd >/var/log/dockerd.log 2>&1 </dev/null &
	for _ in $(seq 60); do
		docker info >/dev/null 2>&1 && break
		sleep 1
	done
	if ! docker info >/dev/null 2>&1; then
		echo "docker-setup: dockerd did not answer within 60 s; the end of /var/log/dockerd.log:" >&2
		tail -n 20 /var/log/dockerd.log >&2
		exit 1
	fi
fi

# --- Docker Compose v2 --------------------------------------------------------
mkdir -p "$cache"
compose_works() { [ -x "$1" ] && [ "$("$1" version --short 2>/dev/null)" = "$compose_version" ]; }
if ! compose_works "$compose_cache"; then
	tmp=$(mktemp "$cache/.tmp.compose.XXXXXX")
	tmps+=("$tmp")
	if compose_works "$plugin"; then
		# Already built (by an earlier run or by hand): keep that build.
		cp "$plugin" "$tmp"
	else
		echo "docker-setup: building docker compose v$compose_version from its Go module (about 2 min)" >&2
		workdir
		dir=$(cd "$work" && go mod download -json "github.com/docker/compose/v2@v$compose_version" |
			sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
		if [ -z "$dir" ] || [ ! -d "$dir" ]; then
			echo "docker-setup: go mod download of docker compose v$compose_version gave no directory" >&2
			exit 1
		fi
		# Built in a writable copy: the module cache is read-only, and
		# `go install` refuses the module's exclude directives.
		cp -r "$dir" "$work/compose"
		chmod -R u+w "$work/compose"
		(cd "$work/compose" && CGO_ENABLED=0 go build -trimpath \
			-ldflags "-s -w -X github.com/docker/compose/v2/internal.Version=v$compose_version" \
			-o "$tmp" ./cmd)
		rm -rf "$work/compose"
	fi
	chmod 755 "$tmp"
	mv -f "$tmp" "$compose_cache"
fi
if ! cmp -s "$compose_cache" "$plugin"; then
	mkdir -p "$(dirname "$plugin")"
	tmps+=("$plugin.tmp.$$")
	cp "$compose_cache" "$plugin.tmp.$$"
	chmod 755 "$plugin.tmp.$$"
	mv -f "$plugin.tmp.$$" "$plugin"
fi
if [ "$(docker compose version --short 2>/dev/null)" != "$compose_version" ]; then
	echo "docker-setup: \`docker compose version --short\` does not print $compose_version" >&2
	exit 1
fi

# --- Dev Containers CLI -----------------------------------------------------
if [ "$(devcontainer --version 2>/dev/null)" != "$devcontainer_version" ]; then
	echo "docker-setup: installing @devcontainers/cli@$devcontainer_version" >&2
	npm install -g --no-fund --no-audit --loglevel=error "@devcontainers/cli@$devcontainer_version" >/dev/null
	hash -r
	if [ "$(devcontainer --version 2>/dev/null)" != "$devcontainer_version" ]; then
		echo "docker-setup: \`devcontainer --version\` does not print $devcontainer_version" >&2
		exit 1
	fi
fi

# --- the Debian minbase rootfs ------------------------------------------------
if [ ! -s "$rootfs_tar" ]; then
	# The machine's own Debian mirror: the first stanza's URIs in
	# debian.sources, else the first deb line of sources.list.
	if [ -f /etc/apt/sources.list.d/debian.sources ]; then
		mirror=$(awk '/^[[:space:]]*$/ { if (seen) exit; next } { seen = 1 }
			/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources)
	else
		mirror=$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) { print $i; exit } }' \
			/etc/apt/sources.list 2>/dev/null || true)
	fi
	if [ -z "${mirror:-}" ]; then
		echo "docker-setup: no Debian mirror in /etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list" >&2
		exit 1
	fi
	echo "docker-setup: debootstrap bookworm (minbase) from $mirror" >&2
	workdir
	mkdir "$work/rootfs"
	if ! debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1; then
		echo "docker-setup: debootstrap failed; the end of its log:" >&2
		tail -n 20 "$work/debootstrap.log" >&2
		exit 1
	fi
	rm -rf "$work"/rootfs/var/cache/apt/archives/*.deb "$work"/rootfs/var/cache/apt/*.bin \
		"$work"/rootfs/var/lib/apt/lists/* "$work"/rootfs/var/log/bootstrap.log
	tmp=$(mktemp "$cache/.tmp.rootfs.XXXXXX")
	tmps+=("$tmp")
	tar --numeric-owner -C "$work/rootfs" -cf "$tmp" .
	chmod 644 "$tmp"
	mv -f "$tmp" "$rootfs_tar"
	rm -rf "$work/rootfs"
fi

# --- the test images ----------------------------------------------------------
# source_hash hashes the non-test Go files of the given directories (and
# any extra words), in a stable order.
source_hash() {
	local extra=$1
	shift
	{
		echo "$extra"
		find "$@" -maxdepth 1 -name '*.go' ! -name '*_test.go' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
	} | sha256sum | cut -c1-64
}
# image_label prints TAG's agentbox.source label, or nothing.
image_label() {
	docker image inspect --format '{{index .Config.Labels "agentbox.source"}}' "$1" 2>/dev/null || true
}
# old_image prints TAG's id, or nothing.
old_image() {
	docker image inspect --format '{{.Id}}' "$1" 2>/dev/null || true
}
# drop_old removes an image replaced by a rebuild (when nothing uses it).
drop_old() {
	if [ -n "$1" ] && [ "$1" != "$(old_image "$2")" ]; then
		docker image rm "$1" >/dev/null 2>&1 || true
	fi
}
# build_static builds a Go command of this module as a static binary.
build_static() {
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$2" "./$1"
}

service_hash=$(source_hash "recipe $service_recipe" "$probe_src")
if [ "$(image_label "$service_tag")" != "$service_hash" ]; then
	echo "docker-setup: building $service_tag" >&2
	old=$(old_image "$service_tag")
	workdir
	root="$work/service"
	mkdir "$root"
	tar --numeric-owner -C "$root" -xpf "$rootfs_tar"
	echo 'dev:x:1000:1000::/home/dev:/bin/sh' >>"$root/etc/passwd"
	echo 'dev:x:1000:' >>"$root/etc/group"
	echo 'dev:*:19000:0:99999:7:::' >>"$root/etc/shadow"
	if [ -f "$root/etc/gshadow" ]; then echo 'dev:!::' >>"$root/etc/gshadow"; fi
	mkdir -p "$root/home/dev"
	chown 1000:1000 "$root/home/dev"
	chmod 755 "$root/home/dev"
	build_static "$probe_src" "$root/usr/local/bin/agentbox-probe"
	chmod 755 "$root/usr/local/bin/agentbox-probe"
	tar --numeric-owner -C "$root" -c . | docker import \
		--change 'CMD ["/bin/sh"]' \
		--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
		--change "LABEL agentbox.source=$service_hash" \
		- "$service_tag" >/dev/null
	rm -rf "$root"
	drop_old "$old" "$service_tag"
fi

proxy_hash=$(source_hash "" "$proxy_src")
if [ "$(image_label "$proxy_tag")" != "$proxy_hash" ]; then
	echo "docker-setup: building $proxy_tag" >&2
	old=$(old_image "$proxy_tag")
	workdir
	mkdir "$work/proxy"
	build_static "$proxy_src" "$work/proxy/tcp-proxy"
	chmod 755 "$work/proxy/tcp-proxy"
	tar --numeric-owner --owner=0 --group=0 -C "$work/proxy" -c tcp-proxy | docker import \
		--change 'ENTRYPOINT ["/tcp-proxy"]' \
		--change "LABEL agentbox.source=$proxy_hash" \
		- "$proxy_tag" >/dev/null
	rm -rf "$work/proxy"
	drop_old "$old" "$proxy_tag"
fi

echo "docker-setup: engine $(docker version --format '{{.Server.Version}}')," \
	"compose $(docker compose version --short)," \
	"devcontainer $(devcontainer --version)," \
	"$service_tag $(old_image "$service_tag")," \
	"$proxy_tag $(old_image "$proxy_tag")"
