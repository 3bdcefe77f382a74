package compose_test

import (
	"encoding/json"
	"testing"

	"agentbox/internal/managed/compose"
)

// TestSeccompProfileDeniesVsock evaluates the profile's socket rules:
// Unix and Internet sockets are allowed, AF_VSOCK (40) falls to the
// default action, an error.
func TestSeccompProfileDeniesVsock(t *testing.T) {
	data, err := compose.SeccompProfile()
	if err != nil {
		t.Fatal(err)
	}
	var p struct {
		DefaultAction string `json:"defaultAction"`
		Syscalls      []struct {
			Names  []string `json:"names"`
			Action string   `json:"action"`
			Args   []struct {
				Index int    `json:"index"`
				Value uint64 `json:"value"`
				Op    string `json:"op"`
			} `json:"args"`
		} `json:"syscalls"`
	}
	if err := json.Unmarshal(data, &p); err != nil {
		t.Fatal(err)
	}
	if p.DefaultAction != "SCMP_ACT_ERRNO" {
		t.Fatalf("default action %s", p.DefaultAction)
	}
	allowed := func(family uint64) bool {
		for _, s := range p.Syscalls {
			named := false
			for _, n := range s.Names {
				named = named || n == "socket"
			}
			if !named || s.Action != "SCMP_ACT_ALLOW" {
				continue
			}
			match := true
			for _, a := range s.Args {
				switch {
				case a.Index != 0:
				case a.Op == "SCMP_CMP_EQ":
					match = match && family == a.Value
				case a.Op == "SCMP_CMP_LT":
					match = match && family < a.Value
				default:
					t.Fatalf("a socket rule this test cannot read: %s", a.Op)
				}
			}
			if match {
				return true
			}
		}
		return false
	}
	for family, want := range map[uint64]bool{1: true, 2: true, 10: true, 16: true, 40: false} {
		if allowed(family) != want {
			t.Errorf("socket family %d allowed: %v, want %v", family, !want, want)
		}
	}
}
