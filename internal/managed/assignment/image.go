package assignment

import (
	"strconv"
	"strings"
	"unicode"
)

// Image references (service_images values and port_proxy_image).
//
// A valid reference is literal and immutable, in one of two forms:
//
//	registry[:port]/repository[/more][:tag]@sha256:<64 lowercase hex>
//	sha256:<64 lowercase hex>            (a local image content digest)
//
// The spec says "a literal lowercase registry/repository@sha256:..."; we
// read "registry/repository" literally and require at least two components
// (a registry host and a repository path), so a short name that Docker
// would silently qualify with its default registry is refused. The first
// component must be a registry host as Docker reads one: holding a '.'
// or a ':' (a port), or exactly "localhost"; myorg/app is docker.io's
// myorg/app to Docker, and is refused for the same reason. The reference
// implementation accepts a one-component name; the spec wins.
//
// Refused, each with its own message: interpolation ($), URL shapes (// or
// ://), whitespace and control characters, uppercase, a tag-only or
// otherwise unpinned reference, a digest of another algorithm, a malformed
// digest, more than one '@', and malformed registry, path or tag parts.

// ImageReferenceReason returns why ref is not a valid immutable image
// reference, or "" when it is. The reason never quotes the reference.
func ImageReferenceReason(ref string) string {
	switch {
	case ref == "":
		return "must not be empty"
	case len(ref) > MaxImageRefBytes:
		return "must be at most " + strconv.Itoa(MaxImageRefBytes) + " bytes"
	case strings.ContainsRune(ref, '$'):
		return "interpolation ($) is refused: the reference must be literal"
	case strings.IndexFunc(ref, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		return "must not contain whitespace or control characters"
	case strings.Contains(ref, "//"):
		return "URL-shaped references are refused: use registry/repository@sha256:<digest>"
	case strings.IndexFunc(ref, unicode.IsUpper) >= 0:
		return "must be lowercase"
	}
	if digest, ok := strings.CutPrefix(ref, "sha256:"); ok {
		if !isSHA256Hex(digest) {
			return "a local content digest must be sha256: followed by 64 lowercase hexadecimal characters"
		}
		return ""
	}
	switch strings.Count(ref, "@") {
	case 0:
		return "tag-only or unpinned reference: an @sha256:<digest> is required"
	case 1:
	default:
		return "must hold exactly one '@'"
	}
	name, digest, _ := strings.Cut(ref, "@")
	alg, hex, ok := strings.Cut(digest, ":")
	if !ok || alg != "sha256" {
		return "the digest must be sha256 (other algorithms are refused)"
	}
	if !isSHA256Hex(hex) {
		return "the sha256 digest must be 64 lowercase hexadecimal characters"
	}
	return imageNameReason(name)
}

func imageNameReason(name string) string {
	comps := strings.Split(name, "/")
	if len(comps) < 2 {
		return "must name a registry and a repository (registry/repository@sha256:<digest>)"
	}
	// Docker takes the first component for a registry host only when it
	// holds a '.' or a ':' or is "localhost"; otherwise (myorg/app) it
	// reads docker.io/myorg/app, a registry the reference does not name.
	if !strings.ContainsAny(comps[0], ".:") && comps[0] != "localhost" {
		return "must name a registry host (a name with '.' or a port, or localhost) before the repository: Docker would read the first component as a docker.io namespace"
	}
	host, port, hasPort := strings.Cut(comps[0], ":")
	if !isHostname(host) {
		return "the registry must be a lowercase host name"
	}
	if hasPort {
		p, err := strconv.Atoi(port)
		if err != nil || p < 1 || p > 65535 || port[0] == '0' || len(port) > 5 {
			return "the registry port must be a number from 1 to 65535"
		}
	}
	last := len(comps) - 1
	repo, tag, hasTag := strings.Cut(comps[last], ":")
	comps[last] = repo
	for _, c := range comps[1:] {
		if !isPathComponent(c) {
			return "repository path components must be lowercase letters and digits joined by '.', '_', '__' or dashes"
		}
	}
	if hasTag && !isTag(tag) {
		return "the tag must be 1-128 characters of a-z, 0-9, '_', '.' and '-', not starting with '.' or '-'"
	}
	return ""
}

// isHostname: dot-separated labels of [a-z0-9-], not starting or ending
// with '-'.
func isHostname(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !isLowerAlnum(c) && c != '-' {
				return false
			}
		}
	}
	return true
}

// isPathComponent follows the distribution grammar:
// [a-z0-9]+ ((\.|_|__|-+) [a-z0-9]+)*
func isPathComponent(c string) bool {
	if c == "" || !isLowerAlnum(c[0]) || !isLowerAlnum(c[len(c)-1]) {
		return false
	}
	for i := 0; i < len(c); {
		if isLowerAlnum(c[i]) {
			i++
			continue
		}
		j := i
		for j < len(c) && !isLowerAlnum(c[j]) {
			j++
		}
		sep := c[i:j]
		if sep != "." && sep != "_" && sep != "__" && strings.Trim(sep, "-") != "" {
			return false
		}
		i = j
	}
	return true
}

func isTag(t string) bool {
	if t == "" || len(t) > MaxImageTagBytes || t[0] == '.' || t[0] == '-' {
		return false
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !isLowerAlnum(c) && c != '_' && c != '.' && c != '-' {
			return false
		}
	}
	return true
}

func isLowerAlnum(c byte) bool { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') }
