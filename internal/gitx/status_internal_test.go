package gitx

import (
	"strings"
	"testing"
)

const oid = "0123456789abcdef0123456789abcdef01234567"

func TestParseStatusV2(t *testing.T) {
	z := func(recs ...string) []byte { return []byte(strings.Join(recs, "\x00") + "\x00") }
	for _, tc := range []struct {
		name      string
		out       []byte
		truncated bool
		want      WorkTree
		bad       bool
	}{
		{name: "clean", out: z("# branch.oid "+oid, "# branch.head main"), want: WorkTree{Branch: "main", Commit: oid, Clean: true}},
		{name: "with upstream headers", out: z("# branch.oid "+oid, "# branch.head main", "# branch.upstream origin/main", "# branch.ab +0 -0"), want: WorkTree{Branch: "main", Commit: oid, Clean: true}},
		{name: "detached", out: z("# branch.oid "+oid, "# branch.head (detached)"), want: WorkTree{Commit: oid, Clean: true}},
		{name: "untracked", out: z("# branch.oid "+oid, "# branch.head main", "? new"), want: WorkTree{Branch: "main", Commit: oid}},
		{name: "a file named like a header", out: z("# branch.oid "+oid, "# branch.head main", "1 .M N... 100644 100644 100644 "+oid+" "+oid+" # x"), want: WorkTree{Branch: "main", Commit: oid}},
		{name: "truncated", out: z("# branch.oid "+oid, "# branch.head main"), truncated: true, want: WorkTree{Branch: "main", Commit: oid}},
		{name: "no commit", out: z("# branch.oid (initial)", "# branch.head main"), bad: true},
		{name: "short oid", out: z("# branch.oid 0123", "# branch.head main"), bad: true},
		{name: "no head", out: z("# branch.oid " + oid), bad: true},
		{name: "no oid", out: z("# branch.head main"), bad: true},
		{name: "two oids", out: z("# branch.oid "+oid, "# branch.oid "+oid, "# branch.head main"), bad: true},
		{name: "two heads", out: z("# branch.oid "+oid, "# branch.head main", "# branch.head other"), bad: true},
		{name: "empty", out: nil, bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStatusV2(tc.out, tc.truncated)
			if tc.bad {
				if err == nil {
					t.Fatalf("parsed %+v, want an error", got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("parseStatusV2 = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// FuzzParseStatusV2: whatever a sandbox prints, the parser returns an
// error or a commit id that is one; a clean answer never hides a record
// that is not a header.
func FuzzParseStatusV2(f *testing.F) {
	f.Add([]byte("# branch.oid "+oid+"\x00# branch.head main\x00"), false)
	f.Add([]byte("# branch.oid "+oid+"\x00# branch.head (detached)\x00? x\x00"), false)
	f.Fuzz(func(t *testing.T, out []byte, truncated bool) {
		wt, err := parseStatusV2(out, truncated)
		if err != nil {
			return
		}
		if !shaPattern.MatchString(wt.Commit) {
			t.Fatalf("commit %q", wt.Commit)
		}
		if wt.Clean {
			if truncated {
				t.Fatal("clean although truncated")
			}
			for _, rec := range strings.Split(string(out), "\x00") {
				if rec != "" && !strings.HasPrefix(rec, "# ") {
					t.Fatalf("clean with record %q", rec)
				}
			}
		}
	})
}
