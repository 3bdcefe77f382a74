package manifest

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

var issueSeeds = []string{
	`{"version": 1, "repo": "owner/name", "actions": [
	  {"kind": "create", "title": "Parser drops tabs", "body": "Seen in #3.", "labels": ["bug", "bug"]},
	  {"kind": "comment", "issue": 12, "body": "Fixed on fix/issue-12."},
	  {"kind": "label", "issue": 12, "labels": ["fixed"]},
	  {"kind": "close", "issue": 12}]}`,
	`{"version": 1, "repo": "o/r", "actions": [{"kind": "create", "title": "t"}]}`,
}

var prSeeds = []string{
	`{"version": 1, "kind": "source", "repo": "owner/name", "source": "refs/jailbee/from/fix-issue-12/fix/issue-12", "source_sha": "0123456789abcdef0123456789abcdef01234567", "base": "main", "title": "Fix 12", "body": "Closes #12.", "draft": true}`,
	`{"version": 1, "kind": "source", "repo": "owner/name", "source": "refs/jailbee/from/pr-7/pr/7", "source_sha": "0123456789abcdef0123456789abcdef01234567", "pr": 7}`,
	`{"version": 1, "kind": "review", "repo": "owner/name", "pr": 7, "event": "REQUEST_CHANGES", "body": "Please add a test."}`,
	`{"version": 1, "kind": "review", "repo": "owner/name", "pr": 7, "event": "APPROVE"}`,
}

func TestDecodeIssueProposal(t *testing.T) {
	p, err := DecodeIssueProposal([]byte(issueSeeds[0]))
	if err != nil {
		t.Fatal(err)
	}
	want := &IssueProposal{Repo: "owner/name", Actions: []IssueAction{
		{Kind: "create", Title: "Parser drops tabs", Body: "Seen in #3.", Labels: []string{"bug"}},
		{Kind: "comment", Issue: 12, Body: "Fixed on fix/issue-12."},
		{Kind: "label", Issue: 12, Labels: []string{"fixed"}},
		{Kind: "close", Issue: 12},
	}}
	if !reflect.DeepEqual(p, want) {
		t.Fatalf("got %+v", p)
	}
	if k := strings.Join(p.Kinds(), ","); k != "create,comment,label,close" {
		t.Fatalf("kinds %s", k)
	}
}

func TestDecodePRManifest(t *testing.T) {
	const sha = "0123456789abcdef0123456789abcdef01234567"
	m, err := DecodePRManifest([]byte(prSeeds[0]))
	if err != nil || m.Review != nil || *m.Source != (PRSource{Repo: "owner/name", Source: "refs/jailbee/from/fix-issue-12/fix/issue-12",
		SourceSHA: sha, Base: "main", Title: "Fix 12", Body: "Closes #12.", Draft: true}) {
		t.Fatalf("%v %+v", err, m)
	}
	if child, branch := m.Source.Import(); child != "fix-issue-12" || branch != "fix/issue-12" {
		t.Fatalf("import of %s: %q %q", m.Source.Source, child, branch)
	}
	m, err = DecodePRManifest([]byte(prSeeds[1]))
	if err != nil || m.Review != nil || *m.Source != (PRSource{Repo: "owner/name", Source: "refs/jailbee/from/pr-7/pr/7", SourceSHA: sha, PR: 7}) {
		t.Fatalf("%v %+v", err, m)
	}
	m, err = DecodePRManifest([]byte(prSeeds[2]))
	if err != nil || m.Source != nil || *m.Review != (PRReview{Repo: "owner/name", PR: 7, Event: EventRequestChanges, Body: "Please add a test."}) {
		t.Fatalf("%v %+v", err, m)
	}
}

func actions(n int) string {
	return strings.TrimSuffix(strings.Repeat(`{"kind":"close","issue":1},`, n), ",")
}

func TestOutboxRefusals(t *testing.T) {
	body := func(n int) string {
		return fmt.Sprintf(`{"version":1,"repo":"o/r","actions":[{"kind":"comment","issue":1,"body":"%s"}]}`, strings.Repeat("x", n))
	}
	padded := func(n int) string { // a valid proposal of exactly n bytes
		head := `{"version":1,"repo":"o/r","actions":[{"kind":"close","issue":1}]}`
		return head[:len(head)-1] + strings.Repeat(" ", n-len(head)) + "}"
	}
	for _, c := range []struct{ raw, want string }{
		{body(MaxOutboxBody), ""},
		{body(MaxOutboxBody + 1), "`actions[].body` exceeds 65536 bytes"},
		{`{"version":1,"repo":"o/r","actions":[` + actions(MaxOutboxActions) + `]}`, ""},
		{`{"version":1,"repo":"o/r","actions":[` + actions(MaxOutboxActions+1) + `]}`, "`actions` has more than 50 actions"},
		{padded(MaxOutboxBytes), ""},
		{padded(MaxOutboxBytes + 1), "outbox manifest exceeds 262144 bytes"},
		{`{"version":1,"repo":"o/r","actions":[]}`, "`actions` must list 1 to 50 actions"},
		{`{"version":1,"repo":"o/r","actions":[{"kind":"close","issue":1,"body":"x"}]}`, "unknown key `actions[].body`"},
		{`{"version":1,"repo":"o/r","actions":[{"kind":"close","issue":1,"issue":2}]}`, "duplicate key `actions[].issue`"},
		{`{"version":1,"repo":"o/r","repo":"o/s","actions":[{"kind":"close","issue":1}]}`, "duplicate key `repo`"},
		{`{"version":1,"repo":"o/r","actions":[{"kind":"delete","issue":1}]}`, "`actions[].kind` must be create, comment, label or close"},
		{`{"version":1,"repo":"o/r","actions":[{"kind":"close","issue":0}]}`, "`actions[].issue` must be a positive integer"},
		{`{"version":1,"repo":"o/r","actions":[{"kind":"close","issue":1.5}]}`, "`actions[].issue` must be a positive integer"},
		{`{"version":1,"repo":"o/r","actions":[{"kind":"create","title":"a\nb"}]}`, "`actions[].title` must be 1 to 256 bytes on one line, without bidi controls"},
		{`{"version":1,"repo":"o/r","actions":[{"kind":"create","title":"fix \u202egnp.exe"}]}`, "`actions[].title` must be 1 to 256 bytes on one line, without bidi controls"},
		{`{"version":1,"repo":"o/r","actions":[{"kind":"create","title":"a\u2066b"}]}`, "`actions[].title` must be 1 to 256 bytes on one line, without bidi controls"},
		{`{"version":1,"repo":"o/r","actions":[{"kind":"create","title":"team \ud83d\udc69\u200d\ud83d\udcbb"}]}`, ""},
		{`{"version":1,"repo":"o/r","actions":[{"kind":"label","issue":1,"labels":["ok","\u200fbug"]}]}`, "`actions[].labels` has a label that is empty, longer than 50 bytes or holds a control character or bidi control"},
		{`{"version":1,"repo":"o/r","actions":[{"kind":"label","issue":1,"labels":[]}]}`, "`actions[].labels` must list 1 to 20 labels"},
		{`{"version":1,"repo":"o/r","actions":[{"kind":"comment","issue":1}]}`, "`actions[].body` is required"},
		{`{"version":1,"repo":"../r","actions":[{"kind":"close","issue":1}]}`, "`repo` must be owner/name"},
		{`{"version":2,"repo":"o/r","actions":[{"kind":"close","issue":1}]}`, "`version` must be 1"},
		{`{"version":1,"repo":"o/r","actions":[{"kind":"close","issue":1}],"pr":1}`, "unknown key `pr`"},
		{`{"version":1,"repo":"o/r","actions":[{"kind":"close","issue":1}]} {}`, "trailing data after the manifest"},
	} {
		_, err := DecodeIssueProposal([]byte(c.raw))
		if got := errString(err); got != c.want {
			t.Errorf("%.80s:\n got %q\nwant %q", c.raw, got, c.want)
		}
	}
	for _, c := range []struct{ raw, want string }{
		{`{"version":1,"kind":"merge","repo":"o/r"}`, "`kind` must be source or review"},
		{`{"version":1,"kind":"source","repo":"o/r","source":"refs/jailbee/from/k/x","source_sha":SHA,"base":"main","title":"t","force":true}`, "unknown key `force`"},
		{`{"version":1,"kind":"source","repo":"o/r","branch":"x","base":"main","title":"t"}`, "unknown key `branch`"},
		{`{"version":1,"kind":"source","repo":"o/r","source":"refs/jailbee/from/k/a..b","source_sha":SHA,"base":"main","title":"t"}`, "`source` must be the imported_ref of a child's done report (refs/jailbee/from/CHILD/BRANCH)"},
		{`{"version":1,"kind":"source","repo":"o/r","source":"refs/heads/main","source_sha":SHA,"base":"main","title":"t"}`, "`source` must be the imported_ref of a child's done report (refs/jailbee/from/CHILD/BRANCH)"},
		{`{"version":1,"kind":"source","repo":"o/r","source":"refs/jailbee/from/Kid/x","source_sha":SHA,"base":"main","title":"t"}`, "`source` must be the imported_ref of a child's done report (refs/jailbee/from/CHILD/BRANCH)"},
		{`{"version":1,"kind":"source","repo":"o/r","source":"refs/jailbee/from/k","source_sha":SHA,"base":"main","title":"t"}`, "`source` must be the imported_ref of a child's done report (refs/jailbee/from/CHILD/BRANCH)"},
		{`{"version":1,"kind":"source","repo":"o/r","source":"refs/jailbee/from/k/x","source_sha":"HEAD","base":"main","title":"t"}`, "`source_sha` must be the imported_sha of that report (40 hex digits)"},
		{`{"version":1,"kind":"source","repo":"o/r","source":"refs/jailbee/from/k/x","source_sha":SHA,"title":"t"}`, "`base` is required"},
		{`{"version":1,"kind":"source","repo":"o/r","source":"refs/jailbee/from/k/x","source_sha":SHA,"pr":3,"title":"t"}`, "`title` cannot be combined with `pr` (a rework pushes to the pull request as it is)"},
		{`{"version":1,"kind":"source","repo":"o/r","source":"refs/jailbee/from/k/x","source_sha":SHA,"pr":0}`, "`pr` must be a positive integer"},
		{`{"version":1,"kind":"review","repo":"o/r","pr":1,"event":"MERGE","body":"x"}`, "`event` must be COMMENT, APPROVE or REQUEST_CHANGES"},
		{`{"version":1,"kind":"review","repo":"o/r","pr":1,"event":"COMMENT"}`, "`body` is required"},
	} {
		_, err := DecodePRManifest([]byte(strings.ReplaceAll(c.raw, "SHA", `"`+strings.Repeat("a", 40)+`"`)))
		if got := errString(err); got != c.want {
			t.Errorf("%.80s:\n got %q\nwant %q", c.raw, got, c.want)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// decodeOutbox decodes raw as a pr-outbox (pr) or issue-outbox manifest
// and returns it with its canonical encoding.
func decodeOutbox(raw []byte, pr bool) (any, []byte, error) {
	if pr {
		m, err := DecodePRManifest(raw)
		if err != nil {
			return nil, nil, err
		}
		return m, m.Encode(), nil
	}
	p, err := DecodeIssueProposal(raw)
	if err != nil {
		return nil, nil, err
	}
	return p, p.Encode(), nil
}

func FuzzDecodeOutbox(f *testing.F) {
	for _, s := range issueSeeds {
		f.Add([]byte(s), false)
	}
	for _, s := range prSeeds {
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, raw []byte, pr bool) {
		got, enc, err := decodeOutbox(raw, pr)
		if err != nil {
			var r *Refusal
			if !errors.As(err, &r) || r.Detail == "" {
				t.Fatalf("refusal without detail: %#v", err)
			}
			return
		}
		again, _, err := decodeOutbox(enc, pr)
		if err != nil {
			t.Fatalf("re-decode of %s refused: %v", enc, err)
		}
		if !reflect.DeepEqual(again, got) {
			t.Fatalf("round trip changed the manifest: %s", enc)
		}
	})
}

// TestOutboxCanonicalBound: a file within MaxOutboxBytes whose bodies are
// all '<' encodes (six bytes each) past MaxOutboxBytes and within
// MaxCanonicalBytes, and its canonical copy decodes again; a canonical
// copy of MaxCanonicalBytes decodes, one byte more is refused.
func TestOutboxCanonicalBound(t *testing.T) {
	var acts []string
	for range 4 {
		acts = append(acts, `{"kind":"comment","issue":1,"body":"`+strings.Repeat("<", MaxOutboxBody-512)+`"}`)
	}
	file := `{"version":1,"repo":"o/r","actions":[` + strings.Join(acts, ",") + `]}`
	p, err := DecodeIssueProposal([]byte(file))
	if err != nil || len(file) > MaxOutboxBytes {
		t.Fatalf("%d bytes: %v", len(file), err)
	}
	canonical := p.Encode()
	if len(canonical) <= MaxOutboxBytes || len(canonical) > MaxCanonicalBytes {
		t.Fatalf("canonical copy of %d bytes", len(canonical))
	}
	if again, err := DecodeCanonicalIssueProposal(canonical); err != nil || !reflect.DeepEqual(again, p) {
		t.Fatalf("canonical copy: %v", err)
	}
	padded := func(n int) []byte { // a canonical-looking proposal of exactly n bytes
		head := `{"version":1,"repo":"o/r","actions":[{"kind":"close","issue":1}]}`
		return []byte(head[:len(head)-1] + strings.Repeat(" ", n-len(head)) + "}")
	}
	if _, err := DecodeCanonicalIssueProposal(padded(MaxCanonicalBytes)); err != nil {
		t.Fatalf("at the bound: %v", err)
	}
	if _, err := DecodeCanonicalPRManifest(padded(MaxCanonicalBytes + 1)); errString(err) != "outbox manifest exceeds 1572864 bytes" {
		t.Fatalf("past the bound: %v", err)
	}
	if _, err := DecodeCanonicalIssueProposal(padded(MaxCanonicalBytes + 1)); errString(err) != "outbox manifest exceeds 1572864 bytes" {
		t.Fatalf("past the bound: %v", err)
	}
}
