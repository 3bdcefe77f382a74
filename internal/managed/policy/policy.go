// Package policy is the managed launch's one rule set for what a service
// container may hold: the capabilities each kind of service gets, the
// security options every service runs with, and the names that point at
// a container engine. The Compose check, the facade and the final
// inspection all read these tables, so what the check lets through and
// what the inspection accepts cannot drift apart (a gap between two such
// lists is how a hostile repository once got a capability the inspection
// would have refused).
package policy

import (
	"slices"
	"strings"
)

// PrimaryCapabilities are the capabilities the primary (Dev Container)
// service keeps after dropping all: none. Its main process, its
// lifecycle commands and every exec run as the non-root workspace
// consumer, which holds no capability whatever the set; an empty set also
// leaves a root process there (none is ever started) without any.
var PrimaryCapabilities = []string{}

// ServiceCapabilities are the capabilities every other service keeps
// after dropping all. Service images (databases, caches, queues) commonly
// start as root to prepare their data directory and then drop to their
// own user: CHOWN, DAC_OVERRIDE and FOWNER for the preparation, SETUID and
// SETGID for the drop, KILL to signal their own workers, NET_BIND_SERVICE
// for a port below 1024. None of them reaches past the container: such a
// service has no host path, no device and no shared namespace. Left out
// of Docker's defaults: MKNOD, NET_RAW, SYS_CHROOT, AUDIT_WRITE, SETFCAP,
// SETPCAP and FSETID.
var ServiceCapabilities = []string{"CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "NET_BIND_SERVICE", "SETGID", "SETUID"}

// Capabilities is the set a service keeps: PrimaryCapabilities for the
// primary, ServiceCapabilities for the others.
func Capabilities(primary bool) []string {
	if primary {
		return PrimaryCapabilities
	}
	return ServiceCapabilities
}

// CapabilityName is a capability as the engine and Compose spell it,
// without the CAP_ prefix and upper case, so "cap_chown" and "CHOWN"
// compare equal.
func CapabilityName(c string) string {
	return strings.TrimPrefix(strings.ToUpper(strings.TrimSpace(c)), "CAP_")
}

// Allowed reports whether capability c is in set.
func Allowed(set []string, c string) bool {
	return slices.Contains(set, CapabilityName(c))
}

// NoNewPrivileges is the security option every service runs with: no
// process in it gains privileges through a setuid or setgid file or file
// capabilities.
const NoNewPrivileges = "no-new-privileges:true"

// EngineSocketNames are base names of container engine and builder API
// sockets: a bind of such a file hands the container the engine, and a
// Compose file that names one is refused.
var EngineSocketNames = []string{
	"docker.sock", "containerd.sock", "podman.sock", "buildkitd.sock",
	"crio.sock", "cri-dockerd.sock", "dockershim.sock",
}

// EngineEnv are variables that point a client at a container engine or
// builder: none may be set in a Compose file or a container, whatever
// its value.
var EngineEnv = []string{
	"DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_CERT_PATH", "DOCKER_TLS_VERIFY",
	"CONTAINERD_ADDRESS", "CONTAINER_HOST", "BUILDKIT_HOST", "PODMAN_HOST",
}

// providerGID is the group a container-mode provider runs in. The kernel
// lets a process read another's /proc/PID/environ (and its memory, or
// attach to it) without CAP_SYS_PTRACE only when their real, effective and
// saved uids and gids all match. The provider keeps the consumer's uid
// (the spool and the workspace are the consumer's) but runs in this group,
// so the consumer's other processes, which hold the consumer's gid, no
// capability and no-new-privileges, can never become able to read the
// signed values; the provider's own children inherit the group and stay
// out of reach too. It is a group no account uses, so it grants nothing
// on any file.
const providerGID = 2147483646

// ProviderGID is the gid a container-mode provider of the model-identity
// lease at index identity runs with: providerGID minus the index, one
// group per lease, since two leases (two consumers) may run providers in
// one container at once and one's tree (which runs the repository's
// code) must not read the other's values; stepping one further down past
// the consumer's own gid, so that none is ever the consumer's.
func ProviderGID(consumerGID uint32, identity int) uint32 {
	g := providerGID - uint32(identity)
	if consumerGID >= g && consumerGID <= providerGID {
		g--
	}
	return g
}
