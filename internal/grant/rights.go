package grant

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
)

// Rights is a set of sandbox rights: named mounts, network looseness and
// egress hosts. It is the shape of a grant's grantable block, of a spawn's
// rights and of a rights manifest's grant/revoke items.
type Rights struct {
	Mounts []string `json:"mounts"`
	Loose  bool     `json:"loose"`
	Egress []string `json:"egress"`
}

// MarshalJSON writes empty lists as [] (never null), as the spec shows them.
func (r Rights) MarshalJSON() ([]byte, error) {
	type plain Rights
	p := plain(r)
	if p.Mounts == nil {
		p.Mounts = []string{}
	}
	if p.Egress == nil {
		p.Egress = []string{}
	}
	return json.Marshal(p)
}

// Empty reports whether r names no item at all.
func (r Rights) Empty() bool { return len(r.Mounts) == 0 && !r.Loose && len(r.Egress) == 0 }

var (
	mountRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	labelRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
)

// ValidMount reports whether name is a valid mount name.
func ValidMount(name string) bool { return mountRE.MatchString(name) }

// ValidEgress reports whether host is a valid egress entry: a lowercase DNS
// name (or IPv4 address), optionally a wildcard "*.example.com" that covers
// every name below example.com.
func ValidEgress(host string) bool {
	if len(host) == 0 || len(host) > MaxHostLen {
		return false
	}
	host = strings.TrimPrefix(host, "*.")
	for _, label := range strings.Split(host, ".") {
		if !labelRE.MatchString(label) {
			return false
		}
	}
	return true
}

// Covers reports whether the egress entry covers host: the same name, or a
// wildcard entry "*.example.com" and a host (or narrower wildcard) strictly
// below example.com.
func Covers(entry, host string) bool {
	if entry == host {
		return true
	}
	suffix, ok := strings.CutPrefix(entry, "*")
	if !ok || !strings.HasPrefix(suffix, ".") {
		return false
	}
	return len(host) > len(suffix) && strings.HasSuffix(host, suffix)
}

func coveredByAny(entries []string, host string) bool {
	for _, e := range entries {
		if Covers(e, host) {
			return true
		}
	}
	return false
}

// LooseRight names the loose right where a right that allowed egress is
// named (EgressRight). No egress entry may be a host of this name
// (CheckSyntax): its connections would be remembered under the same right
// as loose's, and revoking either would cut both.
const LooseRight = "loose"

// NamesLooseRight reports whether an egress entry would name LooseRight:
// "loose" in any case, with or without a trailing dot (hosts are compared
// lowercase and without one). Such an entry stored before CheckSyntax
// refused it allows nothing (EgressRight) and cuts nothing when it goes.
func NamesLooseRight(entry string) bool {
	return strings.EqualFold(strings.TrimSuffix(entry, "."), LooseRight)
}

// EgressRight returns the right in r that allows egress to host under the
// repository's cap, "" when none does: an egress entry equal to host, else
// the first wildcard entry that covers it, else LooseRight when r.Loose
// and the repository's egress cap covers host or the repository sets no
// egress cap. The rights rule (CheckRights, on grantable rights) and the
// egress proxy (on a sandbox's rights) both decide with it.
func (r Rights) EgressRight(repo Cap, host string) string {
	if contains(r.Egress, host) && !NamesLooseRight(host) {
		return host
	}
	for _, e := range r.Egress {
		if Covers(e, host) && !NamesLooseRight(e) {
			return e
		}
	}
	if r.Loose && (repo.Egress == nil || coveredByAny(repo.Egress, host)) {
		return LooseRight
	}
	return ""
}

// CheckRights applies the spec's rights rule: every mount is in
// effective.Grantable.Mounts, loose only if effective.Grantable.Loose, and
// each egress host is covered by a grantable entry, or effective loose
// permission allows it within the repo's egress cap (any host when the repo
// sets no egress cap). effective must already be capped by repo (see
// Capped). The error's text is the refusal detail.
func CheckRights(effective Grant, repo Cap, r Rights) error {
	g := effective.Grantable
	for _, m := range r.Mounts {
		if !contains(g.Mounts, m) {
			return fmt.Errorf("mount `%s` is not grantable", m)
		}
	}
	if r.Loose && !g.Loose {
		return fmt.Errorf("loose is not grantable")
	}
	for _, h := range r.Egress {
		if isAddress(h) {
			// A sandbox's address entry is granted as such: its proxy
			// lets it reach the address even where it refuses one
			// (loopback, private, the host's own). So only an entry
			// naming the address passes it on, never loose or a
			// wildcard, or a loose orchestrator could give a child the
			// host's loopback it cannot reach itself.
			if !contains(g.Egress, h) {
				return fmt.Errorf("egress `%s` is not grantable: an address is granted only by a grantable entry that names it", h)
			}
			continue
		}
		if g.EgressRight(repo, h) == "" {
			return fmt.Errorf("egress `%s` is not grantable", h)
		}
	}
	return nil
}

// isAddress reports whether an egress entry is an IP address literal
// rather than a host name.
func isAddress(entry string) bool {
	_, err := netip.ParseAddr(entry)
	return err == nil
}

// CheckSyntax validates each item of r and its list sizes; field names the
// block in the message ("rights", "grant", "revoke").
func (r Rights) CheckSyntax(field string) error {
	if len(r.Mounts) > MaxItems {
		return fmt.Errorf("%s.mounts has more than %d items", field, MaxItems)
	}
	if len(r.Egress) > MaxItems {
		return fmt.Errorf("%s.egress has more than %d items", field, MaxItems)
	}
	for _, m := range r.Mounts {
		if !ValidMount(m) {
			return fmt.Errorf("%s.mounts has an invalid mount name (want [A-Za-z0-9][A-Za-z0-9._-]{0,63})", field)
		}
	}
	for _, h := range r.Egress {
		if NamesLooseRight(h) {
			return fmt.Errorf("%s.egress has a host named `loose` (in any case, with or without a trailing dot): that is the name of the loose right, not a host; ask for loose egress with loose: true", field)
		}
		if !ValidEgress(h) {
			return fmt.Errorf("%s.egress has an invalid host (want a lowercase host name, optionally *.domain)", field)
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Dedupe returns list without repeated items, first occurrence kept, in
// order. It returns nil for an empty list.
func Dedupe(list []string) []string {
	if len(list) == 0 {
		return nil
	}
	out := make([]string, 0, len(list))
	for _, s := range list {
		if !contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}
