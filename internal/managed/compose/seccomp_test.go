package compose_test

import (
	"encoding/json"
	"slices"
	"syscall"
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

// TestSeccompProfileRefusesSetIDBits evaluates the profile's rules for
// each call that sets a file's mode: allowed only when the mode holds
// neither set-user-ID nor set-group-ID, and openat2 (whose mode a filter
// cannot read) fails with ENOSYS so the C library falls back to openat.
func TestSeccompProfileRefusesSetIDBits(t *testing.T) {
	data, err := compose.SeccompProfile()
	if err != nil {
		t.Fatal(err)
	}
	var p struct {
		Syscalls []struct {
			Names    []string `json:"names"`
			Action   string   `json:"action"`
			ErrnoRet *uint    `json:"errnoRet"`
			Args     []struct {
				Index    uint   `json:"index"`
				Value    uint64 `json:"value"`
				ValueTwo uint64 `json:"valueTwo"`
				Op       string `json:"op"`
			} `json:"args"`
			Includes *struct {
				Caps []string `json:"caps"`
			} `json:"includes"`
		} `json:"syscalls"`
	}
	if err := json.Unmarshal(data, &p); err != nil {
		t.Fatal(err)
	}
	// allowed evaluates the rules for a call with mode at index: any
	// allow rule that names it and whose arguments all match.
	allowed := func(name string, index uint, mode uint64) bool {
		for _, s := range p.Syscalls {
			if s.Action != "SCMP_ACT_ALLOW" || !slices.Contains(s.Names, name) {
				continue
			}
			match := true
			for _, a := range s.Args {
				switch {
				case a.Index != index:
					t.Fatalf("%s: a rule on argument %d", name, a.Index)
				case a.Op == "SCMP_CMP_MASKED_EQ":
					match = match && mode&a.Value == a.ValueTwo
				default:
					t.Fatalf("%s: a rule this test cannot read: %s", name, a.Op)
				}
			}
			if match {
				return true
			}
		}
		return false
	}
	for name, index := range map[string]uint{"chmod": 1, "fchmod": 1, "fchmodat": 2, "fchmodat2": 2, "creat": 1, "open": 2, "openat": 3, "mknod": 1, "mknodat": 2} {
		for _, tc := range []struct {
			mode uint64
			want bool
		}{{0o755, true}, {0o644, true}, {0o1777, true}, {0o4755, false}, {0o2755, false}, {0o6777, false}, {0o104755, false}} {
			if got := allowed(name, index, tc.mode); got != tc.want {
				t.Errorf("%s(mode %o): allowed %v, want %v", name, tc.mode, got, tc.want)
			}
		}
	}
	for _, s := range p.Syscalls {
		if slices.Contains(s.Names, "openat2") {
			if s.Action != "SCMP_ACT_ERRNO" || s.ErrnoRet == nil || *s.ErrnoRet != uint(syscall.ENOSYS) {
				t.Errorf("openat2: %s %v, want ENOSYS", s.Action, s.ErrnoRet)
			}
		}
	}
}
