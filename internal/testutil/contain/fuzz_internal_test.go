package contain

import "testing"

// TestFuzzOnly: only a fuzz engine that runs no test skips the namespace.
func TestFuzzOnly(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"-test.run=^$", "-test.fuzz=^FuzzX$", "-test.fuzztime=4s"}, true},
		{[]string{"-test.fuzz=^FuzzX$"}, false}, // the package's tests run too
		{[]string{"-test.run=^$", "-test.fuzz="}, false},
		{[]string{"-test.run=^TestX$"}, false},
		{[]string{"-test.paniconexit0", "-test.fuzzworker"}, true},
		{nil, false},
	} {
		if got := fuzzOnly(tc.args); got != tc.want {
			t.Errorf("fuzzOnly(%q) = %v, want %v", tc.args, got, tc.want)
		}
	}
}
