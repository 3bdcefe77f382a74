package egress

import (
	"fmt"
	"net/netip"

	"agentbox/internal/grant"
)

// Policy decides each connection the proxy is asked for: the right that
// allows host:port, or the refusal, whose text is the reason the client is
// answered. host is a checked host name or address literal (lowercase, no
// trailing dot, no brackets), port 1 to 65535. Allow is called with the
// proxy's lock held: it must not block.
type Policy interface {
	Allow(host string, port uint16) (right string, err error)
}

// Rights is the Policy of a sandbox's current rights: its egress entries
// and loose, under its repository's cap (the rights rule, decided by
// grant's own matcher). Rights name hosts, not ports: a host they allow is
// allowed on every port.
type Rights struct {
	Rights grant.Rights
	Cap    grant.Cap
}

// Allow returns the right of r that allows host (grant.Rights.EgressRight).
func (r Rights) Allow(host string, port uint16) (string, error) {
	if port == 0 {
		return "", fmt.Errorf("port 0 is not a destination")
	}
	if right := r.Rights.EgressRight(r.Cap, host); right != "" {
		return right, nil
	}
	return "", fmt.Errorf("egress to %s is not granted to this sandbox", host)
}

// Deny is the Policy that allows nothing: a proxy's policy until the
// broker sets the sandbox's rights.
type Deny struct{}

// Allow refuses every destination.
func (Deny) Allow(host string, port uint16) (string, error) {
	return "", fmt.Errorf("egress to %s is not granted to this sandbox", host)
}

// grantedLiteral reports whether right is the address literal host itself,
// granted as such: only then may the destination be an address the proxy
// otherwise refuses (loopback, private, this host's own ...). A wildcard
// or loose never grants one.
func grantedLiteral(host, right string) bool {
	a, err := netip.ParseAddr(host)
	return err == nil && right == host && a.String() == host
}
