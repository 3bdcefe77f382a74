package manifest

import (
	"agentbox/internal/wire"
	"errors"
	"reflect"
	"testing"
)

// seeds are accepted manifests of every type plus a few refusals.
var seeds = []struct {
	raw  string
	body string // "" = no body
}{
	{`{"version": 1, "id": "spawn-fix-12", "type": "spawn", "kind": "fork", "branch": "fix/issue-12", "prompt_file": "spawn-fix-12.md", "rights": {"mounts": [], "loose": false, "egress": []}, "note": "GitHub #12"}`, "Fix issue 12."},
	{`{"version": 2, "id": "sp2", "type": "spawn", "kind": "fork", "branch": "b", "ref": "refs/heads/x", "warm_paths": [], "prompt": "p", "services": [], "runner": {"agent": "claude-jb", "profile": "grok", "model": "sonnet[1m]"}, "on_done": "keep", "autostart_profile": "web"}`, ""},
	{`{"version": 2, "id": "sp3", "type": "spawn", "kind": "pr", "pr": 7, "prompt": "p", "rights": {"mounts": ["aws", "aws"], "loose": true, "egress": ["*.example.com"]}}`, ""},
	{`{"version": 1, "id": "spawn-docs-1", "type": "spawn", "kind": "new", "base": "main", "branch": "docs/intro", "prompt": "Write the intro page."}`, ""},
	{`{"version": 1, "id": "reply-0004", "type": "message", "to": "fix-issue-12", "body": "Use the existing parser.", "kind": "note", "in_reply_to": "h-3fa9c012"}`, ""},
	{`{"version": 1, "id": "msg-0003", "type": "message", "kind": "done", "body_file": "done.md", "in_reply_to": null}`, "Fixed."},
	{`{"version": 1, "id": "import-fix-12", "type": "import", "child": "fix-issue-12"}`, ""},
	{`{"version": 1, "id": "update-release-1", "type": "update", "child": "pool-release", "base": "release/1", "merge": true}`, ""},
	{`{"version": 1, "id": "restart-fix-12-c", "type": "restart", "child": "fix-issue-12", "prompt": "Try again.", "runner": null, "on_done": null, "services": ["db"]}`, ""},
	{`{"version": 1, "id": "restart-b", "type": "restart", "child": "c", "prompt_file": "r.md", "agent_only": true, "runner": {"agent": "claude"}}`, "again"},
	{`{"version": 1, "id": "refresh-1", "type": "refresh", "child": "c", "services": ["db", "web", "db"], "force": true}`, ""},
	{`{"version": 1, "id": "stop-fix-12", "type": "stop", "child": "fix-issue-12"}`, ""},
	{`{"version": 1, "id": "destroy-fix-12", "type": "destroy", "child": "fix-issue-12", "force": false}`, ""},
	{`{"version": 1, "type": "rights", "id": "rights-1", "child": "fix-12", "grant": {"loose": true, "mounts": ["aws"], "egress": ["pypi.org"], "for": "5m"}, "revoke": {"loose": false, "mounts": [], "egress": ["old.example.com"]}}`, ""},
	{`{"version": 1, "id": "rights-2", "type": "rights", "grant": null, "revoke": {"loose": true}}`, ""},
	{`{"version": 1, "id": "rights-3", "type": "rights", "child": "c", "grant": {"mounts": ["m"]}}`, ""},
	{`{"version": 1, "id": "publish-1", "type": "publish", "outbox": "issue", "manifest": "close-12.json"}`, ""},
	{`{"version":1,"id":"s","id":"t"}`, ""},
	{`{"version":1,"id":"s","type":"stop","child":"c"} x`, ""},
	{`[]`, ""},
}

func TestEncodeRoundTrip(t *testing.T) {
	for _, s := range seeds[:17] {
		var body *string
		if s.body != "" {
			body = &s.body
		}
		m, err := Decode([]byte(s.raw), body)
		if err != nil {
			t.Fatalf("seed refused: %v\n%s", err, s.raw)
		}
		roundTrip(t, m)
	}
}

func TestEncodeIsCanonical(t *testing.T) {
	m, err := Decode([]byte(`{"type":"message","id":"m","version":1,"body":"a<b"}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, body, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"body":"a<b","id":"m","in_reply_to":null,"kind":"note","type":"message","version":1}`
	if string(raw) != want || body != nil {
		t.Fatalf("got %s (body %v), want %s", raw, body, want)
	}
}

func roundTrip(t *testing.T, m *Manifest) {
	t.Helper()
	raw, body, err := m.Encode()
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	m2, err := Decode(raw, body)
	if err != nil {
		t.Fatalf("re-decode of %s refused: %v", raw, err)
	}
	if !reflect.DeepEqual(m, m2) {
		t.Fatalf("round trip changed the manifest\n before: %#v\n after:  %#v\n json: %s", m, m2, raw)
	}
}

func FuzzDecode(f *testing.F) {
	for _, s := range seeds {
		f.Add([]byte(s.raw), s.body, s.body != "")
	}
	f.Fuzz(func(t *testing.T, raw []byte, bodyText string, hasBody bool) {
		var body *string
		if hasBody {
			body = &bodyText
		}
		m, err := Decode(raw, body)
		if err != nil {
			var r *Refusal
			if !errors.As(err, &r) || r.Detail == "" {
				t.Fatalf("refusal without detail: %#v", err)
			}
			if m != nil {
				t.Fatal("manifest returned with a refusal")
			}
			return
		}
		roundTrip(t, m)
		// Validation must not panic either, whatever the role.
		for _, role := range []wire.Role{wire.RoleOrchestrator, wire.RoleChild} {
			_ = Validate(m, Sender{Caller: wire.Caller{Sandbox: "c", Role: role}, Grant: grantWith(nil)})
		}
	})
}
