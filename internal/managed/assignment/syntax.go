package assignment

import (
	"path"
	"strconv"
	"strings"
	"unicode"
)

// Syntax rules for identifiers, labels, digests, revisions, branches and
// paths. Each returns a reason ("" when valid) that never quotes the value.

// opaqueIDReason: 1-128 characters of [A-Za-z0-9._:-], and not "." or ".."
// (a run id names a directory; the reference allows those two, we do not).
func opaqueIDReason(s string) string {
	if s == "" || len(s) > MaxIDBytes {
		return "must be an opaque identifier of 1-128 characters"
	}
	if s == "." || s == ".." {
		return "must not be \".\" or \"..\""
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !isAlnum(c) && c != '.' && c != '_' && c != ':' && c != '-' {
			return "must use only A-Z, a-z, 0-9, '.', '_', ':' and '-'"
		}
	}
	return ""
}

// labelReason: a non-secret label of 1-128 characters: no "//" (not a
// URL), no '=' (not a NAME=value), no whitespace or control character.
func labelReason(s string) string {
	if s == "" || len(s) > MaxLabelBytes {
		return "must be a label of 1-128 bytes"
	}
	if strings.Contains(s, "//") || strings.ContainsRune(s, '=') {
		return "must be a plain label, not a URL or NAME=value"
	}
	for _, r := range s {
		if unicode.IsSpace(r) || unicode.IsControl(r) || r == unicode.ReplacementChar {
			return "must not contain whitespace or control characters"
		}
	}
	return ""
}

// executableReason: a label that is either a bare command name, looked up
// in the fixed safe PATH, or an absolute clean path. A relative path with a
// slash would depend on the working directory, so it is refused (stricter
// than the reference, which accepts any label).
func executableReason(s string) string {
	if r := labelReason(s); r != "" {
		return r
	}
	if strings.ContainsRune(s, '/') && !isAbsClean(s) {
		return "must be a bare command name or an absolute, clean path"
	}
	if s == "." || s == ".." {
		return "must be a bare command name or an absolute, clean path"
	}
	return ""
}

// isSHA256Hex: exactly 64 lowercase hexadecimal characters.
func isSHA256Hex(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// revisionReason: a full Git object id, 40 (SHA-1) or 64 (SHA-256)
// hexadecimal characters (reference: either case).
func revisionReason(s string) string {
	if len(s) != 40 && len(s) != 64 {
		return "must be a full Git object id of 40 or 64 hexadecimal characters"
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') && (c < 'A' || c > 'F') {
			return "must be a full Git object id of 40 or 64 hexadecimal characters"
		}
	}
	return ""
}

// taskBranchReason applies git check-ref-format's rules for a branch name
// (the reference only compares the branch at launch; we refuse a name Git
// itself would refuse, and one starting with '-' that a command line could
// read as an option).
func taskBranchReason(s string) string {
	if s == "" || len(s) > MaxTaskBranchBytes {
		return "must be a branch name of 1-255 bytes"
	}
	if s[0] == '-' || s[0] == '/' || s[len(s)-1] == '/' || s[len(s)-1] == '.' ||
		strings.HasSuffix(s, ".lock") || strings.Contains(s, "..") ||
		strings.Contains(s, "//") || strings.Contains(s, "@{") || s == "@" ||
		strings.Contains(s, "/.") || s[0] == '.' {
		return "must be a valid Git branch name (see git check-ref-format)"
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f || r == ' ' || strings.ContainsRune("~^:?*[\\", r) {
			return "must be a valid Git branch name (see git check-ref-format)"
		}
	}
	for _, c := range strings.Split(s, "/") {
		if strings.HasSuffix(c, ".lock") {
			return "must be a valid Git branch name (see git check-ref-format)"
		}
	}
	return ""
}

// isAbsClean: absolute, already clean (no ".", "..", "//", trailing
// slash), no NUL byte, at most MaxPathBytes.
func isAbsClean(p string) bool {
	return p != "" && len(p) <= MaxPathBytes && p[0] == '/' &&
		path.Clean(p) == p && strings.IndexByte(p, 0) < 0
}

// within reports whether p is root itself or below it (both clean).
func within(p, root string) bool {
	return p == root || strictlyWithin(p, root)
}

// strictlyWithin reports whether p is below root, not root itself.
func strictlyWithin(p, root string) bool {
	if root == "/" {
		return p != "/" && strings.HasPrefix(p, "/")
	}
	return strings.HasPrefix(p, root+"/")
}

// overlaps reports whether one of two clean paths is the other or below it.
func overlaps(a, b string) bool { return within(a, b) || within(b, a) }

// ambientMarkers name supervisor authority (container engine sockets and
// state, engine endpoint variables) and ambient secret locations that no
// source or target may reach (reference list).
var ambientMarkers = []string{
	"docker-outside-of-docker", "docker-in-docker", "docker-from-docker",
	"docker.sock", "containerd.sock", "podman.sock", "buildkit.sock", "buildkitd.sock",
	"/var/run/docker", "/run/docker", "/var/lib/docker", "/run/containerd",
	"/var/lib/containerd", "/run/podman", "/run/buildkit",
	"docker_host", "container_host", "containerd_address", "buildkit_host",
	"/.gnupg", "/.ssh", "/run/secrets", "/var/run/secrets", "ssh_auth_sock",
	"serviceaccount",
}

// ambientReference reports whether p names supervisor authority or an
// ambient secret path (case-insensitive substring match, as the reference).
func ambientReference(p string) bool {
	l := strings.ToLower(p)
	for _, m := range ambientMarkers {
		if strings.Contains(l, m) {
			return true
		}
	}
	return false
}

func isAlnum(c byte) bool {
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}

// composeServiceNameReason: 1-128 characters, first alphanumeric, then
// [A-Za-z0-9._-] (reference).
func composeServiceNameReason(s string, max int) string {
	if s == "" || len(s) > max {
		return "service names must be 1-" + strconv.Itoa(max) + " characters"
	}
	if !isAlnum(s[0]) {
		return "service names must start with a letter or digit"
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if !isAlnum(c) && c != '.' && c != '_' && c != '-' {
			return "service names may only use A-Z, a-z, 0-9, '.', '_' and '-'"
		}
	}
	return ""
}
