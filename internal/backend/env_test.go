package backend_test

import (
	"slices"
	"testing"

	"agentbox/internal/backend"
)

func TestCommandEnv(t *testing.T) {
	base := map[string]string{"PATH": "/bin", "HOME": "/home/agent"}
	for _, tc := range []struct {
		name  string
		extra map[string]string
		want  []string
		bad   bool
	}{
		{name: "base only", want: []string{"HOME=/home/agent", "PATH=/bin"}},
		{name: "extra over base, sorted", extra: map[string]string{"PATH": "/x", "A": "1", "EMPTY": ""},
			want: []string{"A=1", "EMPTY=", "HOME=/home/agent", "PATH=/x"}},
		{name: "value with = and newline", extra: map[string]string{"V": "a=b\nc"}, want: []string{"HOME=/home/agent", "PATH=/bin", "V=a=b\nc"}},
		{name: "empty name", extra: map[string]string{"": "x"}, bad: true},
		{name: "name with =", extra: map[string]string{"A=B": "x"}, bad: true},
		{name: "name with NUL", extra: map[string]string{"A\x00": "x"}, bad: true},
		{name: "value with NUL", extra: map[string]string{"A": "x\x00y"}, bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := backend.CommandEnv(base, tc.extra)
			if tc.bad {
				if err == nil {
					t.Fatalf("CommandEnv = %q, want an error", got)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("CommandEnv = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	if base["PATH"] != "/bin" {
		t.Fatal("CommandEnv changed its base")
	}
}
