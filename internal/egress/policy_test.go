package egress_test

import (
	"testing"

	"agentbox/internal/egress"
	"agentbox/internal/grant"
)

func TestRightsPolicy(t *testing.T) {
	entries := []string{"pypi.org", "*.npmjs.org", "10.1.2.3"}
	withCap := func(c []string) grant.Cap { return grant.Cap{Egress: c} }
	tests := []struct {
		name  string
		r     grant.Rights
		cap   grant.Cap
		host  string
		port  uint16
		right string // "" when refused
	}{
		{"exact host", grant.Rights{Egress: entries}, grant.Cap{}, "pypi.org", 443, "pypi.org"},
		{"any port of a granted host", grant.Rights{Egress: entries}, grant.Cap{}, "pypi.org", 8080, "pypi.org"},
		{"wildcard", grant.Rights{Egress: entries}, grant.Cap{}, "registry.npmjs.org", 443, "*.npmjs.org"},
		{"wildcard is not its apex", grant.Rights{Egress: entries}, grant.Cap{}, "npmjs.org", 443, ""},
		{"address literal", grant.Rights{Egress: entries}, grant.Cap{}, "10.1.2.3", 22, "10.1.2.3"},
		{"not granted", grant.Rights{Egress: entries}, grant.Cap{}, "evil.org", 443, ""},
		{"nothing granted", grant.Rights{}, grant.Cap{}, "pypi.org", 443, ""},
		{"port 0", grant.Rights{Egress: entries}, grant.Cap{}, "pypi.org", 0, ""},
		{"loose, no repo cap: any host", grant.Rights{Loose: true}, grant.Cap{}, "evil.org", 443, grant.LooseRight},
		{"loose within the repo cap", grant.Rights{Loose: true}, withCap([]string{"*.corp.org"}), "git.corp.org", 443, grant.LooseRight},
		{"loose outside the repo cap", grant.Rights{Loose: true}, withCap([]string{"*.corp.org"}), "evil.org", 443, ""},
		{"loose under an empty repo cap", grant.Rights{Loose: true}, withCap([]string{}), "evil.org", 443, ""},
		{"an entry before loose", grant.Rights{Loose: true, Egress: entries}, grant.Cap{}, "pypi.org", 443, "pypi.org"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			right, err := egress.Rights{Rights: tt.r, Cap: tt.cap}.Allow(tt.host, tt.port)
			if right != tt.right || (err == nil) != (tt.right != "") {
				t.Fatalf("Allow(%q, %d) = %q, %v; want %q", tt.host, tt.port, right, err, tt.right)
			}
		})
	}
	if _, err := (egress.Deny{}).Allow("pypi.org", 443); err == nil {
		t.Fatal("Deny allowed a host")
	}
}
