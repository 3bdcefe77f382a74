package egress

import (
	"errors"
	"net"
	"net/netip"
	"strings"

	"agentbox/internal/grant"
)

// errBadHost refuses a destination that is neither a host name nor an
// address literal.
var errBadHost = errors.New("the destination must be a host name or an IP address")

// checkHost returns the canonical form of a requested host: lowercase, no
// trailing dot, an address literal in its canonical text (IPv4-mapped IPv6
// as IPv4). Wildcards, zones and anything that is not a DNS name are
// refused, so the host is safe to match, log and answer with.
func checkHost(raw string) (string, error) {
	h := strings.ToLower(strings.TrimSuffix(raw, "."))
	if a, err := netip.ParseAddr(h); err == nil {
		if a.Zone() != "" {
			return "", errBadHost
		}
		return a.Unmap().String(), nil
	}
	if strings.HasPrefix(h, "*") || !grant.ValidEgress(h) {
		return "", errBadHost
	}
	return h, nil
}

// refusedRanges are refused besides what netip classifies (loopback,
// private, link-local, multicast, unspecified); reason is what the client
// is told. The documentation ranges (192.0.2/24, 198.51.100/24,
// 203.0.113/24, 2001:db8::/32) and the benchmarking one (198.18/15) are
// not refused: fake-address resolvers and test networks hand them out
// for public hosts (here, registry.npmjs.org resolves into 203.0.113/24),
// and what they may reach of the host is refused as its own addresses or
// a private network. Ranges that embed an IPv4 address (NAT64, 6to4, Teredo,
// IPv4-compatible, SIIT) are refused whole: a relay or translator on the
// path could carry them to the embedded address, loopback and private
// ones included.
var refusedRanges = []struct {
	prefix netip.Prefix
	reason string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "a reserved address"},              // "this network"
	{netip.MustParsePrefix("100.64.0.0/10"), "a shared address"},            // carrier-grade NAT
	{netip.MustParsePrefix("192.0.0.0/24"), "a reserved address"},           // IETF protocol assignments
	{netip.MustParsePrefix("168.63.129.16/32"), "a cloud platform address"}, // Azure's host endpoint: reached from its VMs only
	{netip.MustParsePrefix("240.0.0.0/4"), "a reserved address"},            // and the broadcast address
	{netip.MustParsePrefix("::/96"), "a translated address"},                // IPv4-compatible (deprecated)
	{netip.MustParsePrefix("::ffff:0:0:0/96"), "a translated address"},      // SIIT, IPv4-translated (not ::ffff:0:0/96, the IPv4-mapped, checked as IPv4)
	{netip.MustParsePrefix("64:ff9b::/96"), "a translated address"},         // NAT64: reaches IPv4 through a gateway
	{netip.MustParsePrefix("64:ff9b:1::/48"), "a translated address"},
	{netip.MustParsePrefix("100::/64"), "a reserved address"},    // discard-only
	{netip.MustParsePrefix("2001::/32"), "a translated address"}, // Teredo
	{netip.MustParsePrefix("2002::/16"), "a translated address"}, // 6to4
	{netip.MustParsePrefix("fec0::/10"), "a private address"},    // deprecated site-local
}

// refusal says why the proxy refuses to connect to a, "" when it does not:
// loopback, private (RFC 1918, ULA), link-local, unspecified, multicast,
// shared (CGNAT), reserved and translated addresses
// (refusedRanges), and the host's own networks (own: each interface's
// address and the network it is on), which reach the host's services and
// the machines beside it.
func refusal(a netip.Addr, own []netip.Prefix) string {
	a = a.Unmap()
	switch {
	case a.Zone() != "":
		return "a scoped address"
	case a.IsUnspecified():
		return "an unspecified address"
	case a.IsLoopback():
		return "a loopback address"
	case a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() || a.IsInterfaceLocalMulticast():
		return "a link-local address"
	case a.IsMulticast():
		return "a multicast address"
	}
	for _, o := range own {
		if o.Addr() == a {
			return "an address of this host"
		}
	}
	if a.IsPrivate() {
		return "a private address"
	}
	for _, r := range refusedRanges {
		if r.prefix.Contains(a) {
			return r.reason
		}
	}
	for _, o := range own {
		if o.Contains(a) {
			return "an address on this host's network"
		}
	}
	return ""
}

// Widest on-link networks refused: an interface configured with a wider
// one (a /8, or an IPv6 /48) would take a part of the internet with it,
// so only the network of this width around its address is refused.
const (
	widestOwnIPv4 = 16
	widestOwnIPv6 = 64
)

// hostAddrs returns the addresses of the host's interfaces, each with the
// network it is on (at most widestOwnIPv4 or widestOwnIPv6 wide).
func hostAddrs() ([]netip.Prefix, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	out := make([]netip.Prefix, 0, len(addrs))
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, ownNetwork(p))
		}
	}
	return out, nil
}

// ownNetwork is p (an interface's address and its prefix length) with
// its address unmapped and its width capped; its Addr stays the
// interface's own. On the documentation and benchmarking ranges it is the
// address alone: fake-address resolvers hand those out for public hosts
// and may sit on an interface of them (a TUN with 198.18.0.1/16), where
// refusing the network would refuse every destination.
func ownNetwork(p netip.Prefix) netip.Prefix {
	a := p.Addr().Unmap()
	widest := widestOwnIPv6
	if a.Is4() {
		widest = widestOwnIPv4
	}
	for _, r := range fakeAddressRanges {
		if r.Contains(a) {
			return netip.PrefixFrom(a, a.BitLen())
		}
	}
	return netip.PrefixFrom(a, max(p.Bits(), widest))
}

// fakeAddressRanges are the documentation and benchmarking ranges, never
// refused (see refusedRanges).
var fakeAddressRanges = []netip.Prefix{
	netip.MustParsePrefix("192.0.2.0/24"),
	netip.MustParsePrefix("198.51.100.0/24"),
	netip.MustParsePrefix("203.0.113.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("2001:db8::/32"),
}
