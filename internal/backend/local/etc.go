package local

import (
	"fmt"
	"path/filepath"

	"agentbox/internal/backend"
	"agentbox/internal/secfs"
)

// hostEtcFiles are the host's /etc entries a sandbox may read: none holds
// a secret, and tools need them (the dynamic linker's cache, Debian's
// alternatives symlinks, CA certificates, DNS and git's system config).
// Everything else in /etc, /etc/shadow first, stays out of the sandbox.
var hostEtcFiles = []string{
	"/etc/alternatives",
	"/etc/ld.so.cache",
	"/etc/ld.so.conf",
	"/etc/ld.so.conf.d",
	"/etc/localtime",
	"/etc/resolv.conf",
	"/etc/ssl/certs",
	"/etc/ssl/openssl.cnf",
	"/etc/ca-certificates.conf",
	"/etc/gitconfig",
	"/etc/protocols",
	"/etc/services",
	"/etc/mime.types",
}

// generatedEtcFiles are written per sandbox and bound read-only.
var generatedEtcFiles = []string{"passwd", "group", "hosts", "hostname", "nsswitch.conf"}

// writeEtc creates dir with the sandbox's generated /etc files.
func writeEtc(dir, name string) error {
	if err := secfs.MkdirFresh(dir); err != nil {
		return err
	}
	// The sandbox's uid binds these files: it must reach them.
	if err := secfs.Chmod(dir, 0o755); err != nil {
		return err
	}
	files := map[string]string{
		"passwd": fmt.Sprintf("root:x:0:0:root:/root:/bin/sh\n"+
			"%s:x:%d:%d:%s:%s:/bin/sh\n"+
			"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
			AgentUser, backend.AgentUID, backend.AgentGID, AgentUser, HomePath),
		"group": fmt.Sprintf("root:x:0:\n%s:x:%d:\nnogroup:x:65534:\n", AgentUser, backend.AgentGID),
		"hosts": fmt.Sprintf("127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\tlocalhost ip6-localhost ip6-loopback\n", name),
		// The name of the sandbox is valid as a hostname.
		"hostname":      name + "\n",
		"nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\n",
	}
	for _, f := range generatedEtcFiles {
		if err := secfs.WriteFileAtomic(filepath.Join(dir, f), []byte(files[f]), 0o644); err != nil {
			return err
		}
	}
	return nil
}
