package mountinfo_test

import (
	"testing"

	"agentbox/internal/mountinfo"
)

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		`/plain`:         "/plain",
		`/a\040b`:        "/a b",
		`/tab\011x`:      "/tab\tx",
		`/back\134slash`: `/back\slash`,
		`/end\04`:        `/end\04`, // too short to be an escape
		`/not\999`:       `/not\999`,
		`\040`:           " ",
	} {
		if got := mountinfo.Unescape(in); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}
