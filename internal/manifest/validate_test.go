package manifest

import (
	"errors"
	"testing"

	"agentbox/internal/config"
	"agentbox/internal/grant"
	"agentbox/internal/wire"
)

// testRepo is a repository config with one runnable claude agent, LiteLLM
// serving grok (sonnet and haiku), services web->db and a "web" profile.
func testRepo(t *testing.T) *config.Repo {
	t.Helper()
	repo, err := config.Parse([]byte(`
agents:
  claude:
    command: "claude --dangerously-skip-permissions"
    prompt_args: ["-p", "{prompt}"]
    enabled: true
  shell:
    command: "bash"
    prompt_args: ["-c", "{prompt}"]
  silent:
    command: "claude"
  off:
    command: "claude"
    prompt_args: ["{prompt}"]
    enabled: false
default_agent: claude
litellm:
  enabled: true
  profiles:
    grok:
      tiers: {sonnet: xai/grok-4, haiku: xai/grok-3-mini}
services:
  db: {command: "postgres"}
  web: {command: "npm start", depends_on: [db]}
autostart:
  profiles:
    web: {services: [web]}
orchestration:
  cap:
    egress: ["*.example.com", "pypi.org"]
`))
	if err != nil {
		t.Fatal(err)
	}
	return repo
}

func grantWith(mut func(*grant.Grant)) *grant.Grant {
	g := grant.Default()
	g.Grantable = grant.Rights{Mounts: []string{"aws"}, Egress: []string{"pypi.org"}}
	if mut != nil {
		mut(&g)
	}
	return &g
}

func TestValidate(t *testing.T) {
	repo := testRepo(t)
	orch := Sender{Caller: wire.Caller{Sandbox: "main", Role: wire.RoleOrchestrator}, Grant: grantWith(nil), Repo: repo}
	loose := orch
	loose.Grant = grantWith(func(g *grant.Grant) { g.Grantable.Loose = true })
	noDestroy := orch
	noDestroy.Grant = grantWith(func(g *grant.Grant) { g.Operations = []string{"message", "spawn", "restart"} })
	noRights := orch
	noRights.Grant = grantWith(func(g *grant.Grant) { g.Operations = []string{"message", "spawn"} })
	revoked := orch
	revoked.Revoked = true
	noGrant := orch
	noGrant.Grant = nil
	child := Sender{Caller: wire.Caller{Sandbox: "fix-12", Role: wire.RoleChild, Parent: "main"}, Repo: repo}
	withPublish := orch
	withPublish.Grant = grantWith(func(g *grant.Grant) { g.Operations = append(g.Operations, "publish", "refresh") })

	sp := func(fields string) string { return spawnJSON(1, `"kind":"fork","branch":"b",`+okPrompt+fields) }
	rs := func(fields string) string {
		return `{"version":1,"id":"r","type":"restart","child":"c","prompt":"p"` + fields + `}`
	}
	rights := func(fields string) string { return `{"version":1,"id":"rg","type":"rights"` + fields + `}` }
	msg := func(fields string) string { return `{"version":1,"id":"m","type":"message","body":"b"` + fields + `}` }

	tests := []struct {
		name   string
		from   Sender
		raw    string
		detail string
	}{
		// child rules
		{"child message without to", child, msg(`,"kind":"done"`), ""},
		{"child message with to", child, msg(`,"to":"other"`), DetailChildTo},
		{"child revoke own, child absent", child, rights(`,"revoke":{"loose":true}`), ""},
		{"child revoke own, child named", child, rights(`,"child":"fix-12","revoke":{"mounts":["aws"]}`), ""},
		{"child revoke other child", child, rights(`,"child":"fix-13","revoke":{"loose":true}`), "children may only revoke their own rights"},
		{"child grant block", child, rights(`,"grant":{"loose":true,"for":"5m"}`), "children may only revoke their own rights"},
		{"child grant block without for", child, rights(`,"grant":{"loose":true}`), "children may only revoke their own rights"},
		{"child grant null", child, rights(`,"grant":null,"revoke":{"loose":true}`), "children may only revoke their own rights"},
		{"child spawn", child, sp(``), DetailChildTypes},
		{"child publish", child, `{"version":1,"id":"p","type":"publish","outbox":"issue","manifest":"a.json"}`, DetailChildTypes},
		{"child needs no grant", child, msg(``), ""},
		// grant presence
		{"revoked grant", revoked, msg(`,"to":"c"`), "orchestration grant revoked"},
		{"revoked grant, revoke-only", revoked, rights(`,"child":"c","revoke":{"loose":true}`), "orchestration grant revoked"},
		{"no grant", noGrant, msg(`,"to":"c"`), DetailNoGrant},
		// grant operation per type
		{"message to child", orch, msg(`,"to":"c"`), ""},
		{"message without to", orch, msg(``), "`to` is required: name the child"},
		{"rights op missing", noRights, rights(`,"child":"c","grant":{"mounts":["aws"],"for":"5m"}`), "operation `rights` is not in this container's grant"},
		{"revoke-only needs no op", noRights, rights(`,"child":"c","revoke":{"loose":true}`), ""},
		{"stop op missing", noRights, `{"version":1,"id":"s","type":"stop","child":"c"}`, "operation `stop` is not in this container's grant"},
		{"update uses import op", noRights, `{"version":1,"id":"u","type":"update","child":"c"}`, "operation `import` is not in this container's grant"},
		{"update with import op", orch, `{"version":1,"id":"u","type":"update","child":"c"}`, ""},
		{"refresh not in default grant", orch, `{"version":1,"id":"r","type":"refresh","child":"c","services":["db"]}`, "operation `refresh` is not in this container's grant"},
		{"refresh granted", withPublish, `{"version":1,"id":"r","type":"refresh","child":"c","services":["db","web"]}`, ""},
		{"refresh unknown service", withPublish, `{"version":1,"id":"r","type":"refresh","child":"c","services":["cache"]}`, "service `cache` is not defined"},
		{"publish not in default grant", orch, `{"version":1,"id":"p","type":"publish","outbox":"issue","manifest":"a.json"}`, "operation `publish` is not in this container's grant"},
		{"publish granted", withPublish, `{"version":1,"id":"p","type":"publish","outbox":"pr","manifest":"a.json"}`, ""},
		// rights manifests
		{"rights child missing", orch, rights(`,"revoke":{"loose":true}`), "`child` is required: name the child whose rights change"},
		{"rights grant for missing", orch, rights(`,"child":"c","grant":{"mounts":["aws"]}`), "`grant.for` is required: a TTL of at most 24h, or never"},
		{"rights grant within grantable", orch, rights(`,"child":"c","grant":{"mounts":["aws"],"egress":["pypi.org"],"for":"never"}`), ""},
		{"rights grant mount not grantable", orch, rights(`,"child":"c","grant":{"mounts":["gcp"],"for":"5m"}`), "mount `gcp` is not grantable"},
		{"rights grant loose not grantable", orch, rights(`,"child":"c","grant":{"loose":true,"for":"5m"}`), "loose is not grantable"},
		{"rights grant egress not grantable", orch, rights(`,"child":"c","grant":{"egress":["a.example.com"],"for":"5m"}`), "egress `a.example.com` is not grantable"},
		{"rights loose permits egress in repo cap", loose, rights(`,"child":"c","grant":{"egress":["a.example.com"],"for":"5m"}`), ""},
		{"rights loose, egress outside repo cap", loose, rights(`,"child":"c","grant":{"egress":["evil.org"],"for":"5m"}`), "egress `evil.org` is not grantable"},
		{"rights loose never grants an address", loose, rights(`,"child":"c","grant":{"egress":["127.0.0.1"],"for":"5m"}`), "egress `127.0.0.1` is not grantable: an address is granted only by a grantable entry that names it"},
		// spawn
		{"spawn plain", orch, sp(``), ""},
		{"spawn rights within grantable", orch, sp(`,"rights":{"mounts":["aws"],"egress":["pypi.org"]}`), ""},
		{"spawn mount not grantable", orch, sp(`,"rights":{"mounts":["gcp"]}`), "mount `gcp` is not grantable"},
		{"spawn loose not grantable", orch, sp(`,"rights":{"loose":true}`), "loose is not grantable"},
		{"spawn loose grantable", loose, sp(`,"rights":{"loose":true,"egress":["x.example.com"]}`), ""},
		{"spawn loose never grants an address", loose, sp(`,"rights":{"loose":true,"egress":["169.254.169.254"]}`), "egress `169.254.169.254` is not grantable: an address is granted only by a grantable entry that names it"},
		{"spawn on_done destroy", orch, sp(`,"on_done":"destroy"`), ""},
		{"spawn on_done destroy without op", noDestroy, sp(`,"on_done":"destroy"`), "on_done `destroy` needs operation `destroy`, which is not in this container's grant"},
		{"spawn on_done keep without op", noDestroy, sp(`,"on_done":"keep"`), ""},
		{"spawn autostart profile", orch, sp(`,"autostart_profile":"web"`), ""},
		{"spawn autostart profile undefined", orch, sp(`,"autostart_profile":"api"`), "autostart profile `api` is not defined"},
		{"spawn services defined", orch, sp(`,"services":["web"]`), ""},
		{"spawn services undefined", orch, sp(`,"services":["cache"]`), "service `cache` is not defined"},
		// runners
		{"runner claude", orch, sp(`,"runner":{"agent":"claude","model":"opus[1m]"}`), ""},
		{"runner claude-jb falls back to agents.claude", orch, sp(`,"runner":{"agent":"claude-jb","profile":"grok","model":"sonnet[1m]"}`), ""},
		{"runner claude without model", orch, sp(`,"runner":{"agent":"claude"}`), ""},
		{"runner profile not served", orch, sp(`,"runner":{"agent":"claude-jb","profile":"openai"}`), "LiteLLM profile `openai` is not served (configured: grok; run `jailbee litellm up`)"},
		{"runner tier missing", orch, sp(`,"runner":{"agent":"claude-jb","profile":"grok","model":"opus"}`), "LiteLLM profile `grok` has no `opus` tier"},
		{"restart runner checked", orch, rs(`,"runner":{"agent":"claude-jb","profile":"grok","model":"fable"}`), "LiteLLM profile `grok` has no `fable` tier"},
		{"restart runner null", orch, rs(`,"runner":null`), ""},
		{"restart on_done destroy without op", noDestroy, rs(`,"on_done":"destroy"`), "on_done `destroy` needs operation `destroy`, which is not in this container's grant"},
		{"restart autostart undefined", orch, rs(`,"autostart_profile":"api"`), "autostart profile `api` is not defined"},
		{"restart op missing", noRights, rs(``), "operation `restart` is not in this container's grant"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := Decode([]byte(tt.raw), nil)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			err = Validate(m, tt.from)
			if tt.detail == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var r *Refusal
			if !errors.As(err, &r) {
				t.Fatalf("got %v, want refusal %q", err, tt.detail)
			}
			if r.Detail != tt.detail {
				t.Fatalf("detail\n got: %s\nwant: %s", r.Detail, tt.detail)
			}
			if r.ID != m.ID {
				t.Errorf("refusal ID = %q, want %q", r.ID, m.ID)
			}
		})
	}
}

func TestValidateRunnerRepoRules(t *testing.T) {
	base := `agents:
  claude: {command: "claude", prompt_args: ["{prompt}"]}
`
	tests := []struct {
		name, yaml string
		runner     string
		detail     string
	}{
		{"not defined", "", `{"agent":"claude"}`, "agent `claude` is not enabled in this repo"},
		{"disabled", `agents:
  claude: {command: "claude", prompt_args: ["{prompt}"], enabled: false}
`, `{"agent":"claude"}`, "agent `claude` is not enabled in this repo"},
		{"no prompt_args", `agents:
  claude: {command: "claude"}
`, `{"agent":"claude"}`, "agent `claude` has no prompt_args, so it cannot take a prompt"},
		{"command not claude", `agents:
  claude: {command: "npx claude-code --yes", prompt_args: ["{prompt}"]}
`, `{"agent":"claude"}`, "agents.claude.command must start with `claude` or `claude-jb` to take a runner (it is `npx claude-code --yes`)"},
		{"claude-jb without litellm", base, `{"agent":"claude-jb"}`, "claude-jb needs LiteLLM enabled in this repo"},
		{"claude-jb with litellm, no profiles", base + "litellm: {enabled: true}\n", `{"agent":"claude-jb","profile":"grok"}`, "LiteLLM profile `grok` is not served (configured: none; run `jailbee litellm up`)"},
		{"claude-jb own entry", `agents:
  claude-jb: {command: "claude-jb", prompt_args: ["{prompt}"]}
litellm: {enabled: true}
`, `{"agent":"claude-jb"}`, ""},
		{"ok", base, `{"agent":"claude","model":"haiku"}`, ""},
	}
	g := grant.Default()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			repo, err := config.Parse([]byte(tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			m, err := Decode([]byte(spawnJSON(1, `"kind":"fork","branch":"b",`+okPrompt+`,"runner":`+tt.runner)), nil)
			if err != nil {
				t.Fatal(err)
			}
			err = Validate(m, Sender{Caller: wire.Caller{Sandbox: "main", Role: wire.RoleOrchestrator}, Grant: &g, Repo: repo})
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tt.detail {
				t.Fatalf("got %q, want %q", got, tt.detail)
			}
		})
	}
}

func TestValidateServedOverride(t *testing.T) {
	repo := testRepo(t)
	repo.LiteLLM.Served = map[string]bool{} // proxy down: nothing served
	g := grant.Default()
	m, err := Decode([]byte(spawnJSON(1, `"kind":"fork","branch":"b",`+okPrompt+`,"runner":{"agent":"claude-jb","profile":"grok"}`)), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := "LiteLLM profile `grok` is not served (configured: grok; run `jailbee litellm up`)"
	if err := Validate(m, Sender{Caller: wire.Caller{Sandbox: "main", Role: wire.RoleOrchestrator}, Grant: &g, Repo: repo}); err == nil || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}
}

func TestValidateRepoCapOnOperations(t *testing.T) {
	repo, err := config.Parse([]byte("orchestration:\n  cap:\n    operations: [import]\n"))
	if err != nil {
		t.Fatal(err)
	}
	g := grant.Default()
	ctx := Sender{Caller: wire.Caller{Sandbox: "main", Role: wire.RoleOrchestrator}, Grant: &g, Repo: repo}
	m, _ := Decode([]byte(`{"version":1,"id":"s","type":"stop","child":"c"}`), nil)
	if err := Validate(m, ctx); err == nil || err.Error() != "operation `stop` is not in this container's grant" {
		t.Fatalf("repo cap must remove stop: %v", err)
	}
	m, _ = Decode([]byte(`{"version":1,"id":"m","type":"message","to":"c","body":"b"}`), nil)
	if err := Validate(m, ctx); err != nil {
		t.Fatalf("message is always granted: %v", err)
	}
}

func TestValidateNeedsRole(t *testing.T) {
	m, _ := Decode([]byte(`{"version":1,"id":"s","type":"stop","child":"c"}`), nil)
	err := Validate(m, Sender{})
	var r *Refusal
	if err == nil || errors.As(err, &r) {
		t.Fatalf("a missing role is a caller bug, not a refusal: %v", err)
	}
}

func TestEffectiveOnDone(t *testing.T) {
	m, _ := Decode([]byte(spawnJSON(1, `"kind":"fork","branch":"b",`+okPrompt)), nil)
	if got := m.Spawn.EffectiveOnDone(grant.Default()); got != OnDoneDestroy {
		t.Errorf("with destroy: %q", got)
	}
	g := grant.Default()
	g.Operations = []string{"message", "spawn"}
	if got := m.Spawn.EffectiveOnDone(g); got != OnDoneKeep {
		t.Errorf("without destroy: %q", got)
	}
}

func TestNotAvailable(t *testing.T) {
	if got := NotAvailable(TypeRefresh).Detail; got != "operation `refresh` is not available in this broker yet" {
		t.Fatal(got)
	}
}
