package broker_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"agentbox/internal/inbox"
	"agentbox/internal/wire"
)

// sendRaw sends a manifest (and optional body) on c and returns the first
// status.
func sendRaw(t *testing.T, c *inbox.Client, manifest string, body *string) wire.StatusItem {
	t.Helper()
	args := map[string]any{"manifest": json.RawMessage(manifest)}
	if body != nil {
		args["body"] = *body
	}
	var st wire.StatusItem
	if err := c.Call(context.Background(), "send", args, &st); err != nil {
		t.Fatalf("send %s: %v", manifest, err)
	}
	return st
}

// TestBrokerEnforcesManifestRules checks, over a real socket, that send
// runs the full decoder and validator: each type's valid manifest reaches
// its handler (or the not-yet-available refusal) and invalid ones get the
// spec's refusal text.
func TestBrokerEnforcesManifestRules(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	e.child("fix-12", "orch")
	// An orchestrator whose grant lacks rights and destroy.
	if err := e.admin("new", wire.NewArgs{Name: "narrow", Repo: e.repo, Role: "orchestrator",
		Grant: json.RawMessage(`{"version":1,"max_running_children":1,"operations":["message","spawn"],"grantable":{"mounts":[],"loose":false,"egress":[]}}`)}, nil); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 65537)
	clients := map[string]*inbox.Client{"orch": e.client("orch"), "narrow": e.client("narrow"), "fix-12": e.client("fix-12")}
	for _, tc := range []struct {
		name, from, manifest string
		body                 *string
		state, detail        string
	}{
		// Valid, but this repository has no agent to start.
		{"spawn valid", "orch", `{"version":1,"id":"s1","type":"spawn","kind":"fork","branch":"fix/x","prompt":"p","rights":{"mounts":[],"loose":false,"egress":[]}}`, nil,
			"refused", "no agent to start: name a runner (--agent), or set default_agent in the repository's .jailbee/config.yaml"},
		{"spawn v1 with ref", "orch", `{"version":1,"id":"s2","type":"spawn","kind":"fork","branch":"fix/x","ref":"refs/heads/x","prompt":"p","rights":{"mounts":[],"loose":false,"egress":[]}}`, nil,
			"refused", ""},
		{"spawn rights beyond grantable", "orch", `{"version":1,"id":"s3","type":"spawn","kind":"fork","branch":"fix/x","prompt":"p","rights":{"mounts":["aws"],"loose":false,"egress":[]}}`, nil,
			"refused", ""},
		{"unknown key", "orch", `{"version":1,"id":"u1","type":"stop","child":"fix-12","extra":1}`, nil, "refused", ""},
		{"version 2 stop", "orch", `{"version":2,"id":"u2","type":"stop","child":"fix-12"}`, nil, "refused", ""},
		{"unknown type", "orch", `{"version":1,"id":"u3","type":"launch"}`, nil, "refused", ""},
		{"stop valid", "orch", `{"version":1,"id":"st1","type":"stop","child":"fix-12"}`, nil, "done", "child `fix-12` stopped"},
		{"update ref and base", "orch", `{"version":1,"id":"up1","type":"update","child":"fix-12","ref":"refs/heads/a","base":"main"}`, nil, "refused", ""},
		{"publish bad name", "orch", `{"version":1,"id":"p1","type":"publish","outbox":"issue","manifest":".progress.json"}`, nil, "refused", ""},
		{"rights missing op", "narrow", `{"version":1,"id":"r1","type":"rights","child":"x","grant":{"loose":false,"mounts":[],"egress":["a.example"],"for":"5m"}}`, nil,
			"refused", "operation `rights` is not in this container's grant"},
		{"child grants itself", "fix-12", `{"version":1,"id":"r2","type":"rights","grant":null,"revoke":{"loose":true,"mounts":[],"egress":[]}}`, nil,
			"refused", "children may only revoke their own rights"},
		{"child names another", "fix-12", `{"version":1,"id":"r3","type":"rights","child":"other","revoke":{"loose":true,"mounts":[],"egress":[]}}`, nil,
			"refused", "children may only revoke their own rights"},
		// Revoke-only needs no rights operation: it runs (loose was not held).
		{"child revoke-only", "fix-12", `{"version":1,"id":"r4","type":"rights","revoke":{"loose":true,"mounts":[],"egress":[]}}`, nil,
			"done", "loose was not held"},
		{"child spawns", "fix-12", `{"version":1,"id":"c1","type":"stop","child":"fix-12"}`, nil, "refused", ""},
		{"child message with to", "fix-12", `{"version":1,"id":"c2","type":"message","to":"orch","body":"x"}`, nil, "refused", ""},
		{"message over 65536 bytes", "orch", `{"version":1,"id":"m1","type":"message","to":"fix-12","body_file":"m1.md"}`, &long, "refused", ""},
		{"message body file", "orch", `{"version":1,"id":"m2","type":"message","to":"fix-12","body_file":"m2.md"}`, ptr("from the body"), "done", "delivered to fix-12"},
		{"bad id", "orch", `{"version":1,"id":"Bad_ID","type":"stop","child":"fix-12"}`, nil, "refused", "id must match ^[a-z0-9][a-z0-9-]{0,63}$"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := sendRaw(t, clients[tc.from], tc.manifest, tc.body)
			if st.State != tc.state || (tc.detail != "" && st.Detail != tc.detail) || st.Detail == "" {
				t.Fatalf("got %s %q, want %s %q", st.State, st.Detail, tc.state, tc.detail)
			}
		})
	}
}

func ptr(s string) *string { return &s }
