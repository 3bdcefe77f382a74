package config

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"agentbox/internal/grant"
)

const fullConfig = `
agents:
  claude:
    command: "claude --dangerously-skip-permissions"
    prompt_args: ["-p", "{prompt}"]
    enabled: true
    autostart: false
    install: "npm i -g @anthropic-ai/claude-code"
    update: "npm update -g @anthropic-ai/claude-code"
    skills_dir: ".claude/skills"
default_agent: claude
litellm:
  enabled: true
  profiles:
    grok:
      tiers:
        sonnet: xai/grok-4
        haiku: xai/grok-3-mini
autostart:
  default_profile: web
  profiles:
    web:
      services: [web]
      setup: ["npm ci"]
      on_start: ["npm run migrate"]
services:
  db:
    command: "postgres -D /var/lib/pg"
  web:
    command: "npm start"
    depends_on: [db]
fork:
  warm_paths: ["node_modules", "target/**"]
orchestration:
  idle_after_seconds: 600
  cap:
    max_running_children: 4
    operations: [spawn, message, import, stop]
    mounts: [aws]
    loose: false
    egress: ["*.example.com"]
  default_runner:
    agent: claude
    model: sonnet
limits:
  pids: 512
  memory: 2GiB
`

func TestParseFull(t *testing.T) {
	c, err := Parse([]byte(fullConfig))
	if err != nil {
		t.Fatal(err)
	}
	a := c.Agents["claude"]
	if a.Command != "claude --dangerously-skip-permissions" || !reflect.DeepEqual(a.PromptArgs, []string{"-p", "{prompt}"}) || !a.IsEnabled() {
		t.Errorf("agent = %+v", a)
	}
	if c.DefaultAgent != "claude" || !c.LiteLLM.Enabled || c.LiteLLM.Profiles["grok"].Tiers["haiku"] != "xai/grok-3-mini" {
		t.Errorf("default agent / litellm = %q %+v", c.DefaultAgent, c.LiteLLM)
	}
	if c.Orchestration.IdleAfterSeconds != 600 || *c.Orchestration.Cap.MaxRunningChildren != 4 || *c.Orchestration.Cap.Loose {
		t.Errorf("orchestration = %+v", c.Orchestration)
	}
	if c.Orchestration.DefaultRunner == nil || *c.Orchestration.DefaultRunner != (grant.Runner{Agent: "claude", Model: "sonnet"}) {
		t.Errorf("default runner = %+v", c.Orchestration.DefaultRunner)
	}
	if l := c.Limits; l.Pids == nil || *l.Pids != 512 || l.MemoryBytes == nil || *l.MemoryBytes != 2<<30 || l.CPUWeight != nil {
		t.Errorf("limits = %+v", l)
	}
	if got := c.WithDependencies([]string{"web"}); !reflect.DeepEqual(got, []string{"web", "db"}) {
		t.Errorf("WithDependencies = %q", got)
	}
	if !c.AutostartProfileDefined("web") || c.AutostartProfileDefined("api") || !c.ServiceDefined("db") {
		t.Error("profile/service lookup")
	}
}

func TestDefault(t *testing.T) {
	for _, in := range []string{"", "\n", "# only a comment\n"} {
		c, err := Parse([]byte(in))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(c, Default()) {
			t.Errorf("Parse(%q) = %+v, want Default()", in, c)
		}
	}
	if Default().Orchestration.IdleAfterSeconds != 900 {
		t.Error("idle_after_seconds must default to 900")
	}
	c, err := Parse([]byte("orchestration:\n  cap: {loose: true}\n"))
	if err != nil || c.Orchestration.IdleAfterSeconds != 900 {
		t.Errorf("idle default with other orchestration keys: %v %d", err, c.Orchestration.IdleAfterSeconds)
	}
}

func TestEnabledDefaultsToTrue(t *testing.T) {
	c, err := Parse([]byte("agents:\n  a: {command: x}\n  b: {command: x, enabled: false}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !c.Agents["a"].IsEnabled() || c.Agents["b"].IsEnabled() {
		t.Error("enabled must default to true and honour false")
	}
}

func TestCapListsKeepNilVersusEmpty(t *testing.T) {
	c, err := Parse([]byte("orchestration:\n  cap:\n    egress: []\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Orchestration.Cap.Egress == nil || c.Orchestration.Cap.Mounts != nil {
		t.Errorf("egress [] must be an empty cap, absent mounts no cap: %+v", c.Orchestration.Cap)
	}
}

func TestCapPublish(t *testing.T) {
	c, err := Parse([]byte("orchestration:\n  cap:\n    publish:\n      issues: {repos: [o/r], actions: [comment]}\n      pr_reviews: true\n"))
	if err != nil {
		t.Fatal(err)
	}
	p := c.Orchestration.Cap.Publish
	if p == nil || p.Issues == nil || p.Issues.Repos[0] != "o/r" || p.Issues.Actions[0] != "comment" || p.PullRequests || !p.PRReviews {
		t.Fatalf("got %+v", p)
	}
}

func TestParseRefusals(t *testing.T) {
	tests := []struct{ name, yaml, want string }{
		{"unknown agent key", "agents:\n  claude:\n    comand: claude\n", "agents.claude.comand: unknown key (line 3)"},
		{"unknown top key", "agent: {}\n", "agent: unknown key (line 1)"},
		{"unknown litellm key", "litellm:\n  served: [a]\n", "litellm.served: unknown key (line 2)"},
		{"unknown cap key", "orchestration:\n  cap:\n    net: true\n", "orchestration.cap.net: unknown key (line 3)"},
		{"unknown runner key", "orchestration:\n  default_runner: {agent: claude, effort: high}\n", "orchestration.default_runner.effort: unknown key (line 2)"},
		{"duplicate key", "default_agent: a\ndefault_agent: b\n", "default_agent: duplicate key (line 2)"},
		{"duplicate nested key", "agents:\n  a: {command: x, command: y}\n", "agents.a.command: duplicate key (line 2)"},
		{"wrong kind", "agents: [claude]\n", "agents: must be a mapping (line 1)"},
		{"bool expected", "litellm: {enabled: yes}\n", "litellm.enabled: must be true or false (line 1)"},
		{"int expected", "orchestration: {idle_after_seconds: soon}\n", "orchestration.idle_after_seconds: must be an integer (line 1)"},
		{"string expected", "agents:\n  a: {command: [x]}\n", "agents.a.command: must be a string (quote it) (line 2)"},
		{"list expected", "agents:\n  a: {command: x, prompt_args: \"-p\"}\n", "agents.a.prompt_args: must be a list (line 2)"},
		{"alias", "x: &a {}\nagents: *a\n", "x: unknown key (line 1)"},
		{"alias refused", "agents: &a {}\nservices: *a\n", "services: YAML aliases are not supported (line 2)"},
		{"two documents", "agents: {}\n---\nagents: {}\n", "more than one YAML document"},
		{"invalid yaml", "agents: [\n", "invalid YAML: yaml: line 1: did not find expected node content"},
		{"command required", "agents:\n  a: {enabled: true}\n", "agents.a.command: is required"},
		{"agent name", "agents:\n  A_1: {command: x}\n", "agents.A_1: agent names must match [a-z0-9][a-z0-9-]{0,63}"},
		{"default agent undefined", "default_agent: claude\n", "default_agent: agent `claude` is not defined under agents"},
		{"litellm bad tier", "litellm:\n  profiles:\n    grok: {tiers: {gpt: x}}\n", "litellm.profiles.grok.tiers.gpt: tier must be fable, opus, sonnet or haiku"},
		{"litellm bad profile name", "litellm:\n  profiles:\n    Grok: {}\n", "litellm.profiles.Grok: profile names must match [a-z0-9][a-z0-9_-]{0,63}"},
		{"service dep undefined", "services:\n  web: {command: x, depends_on: [db]}\n", "services.web.depends_on[0]: service `db` is not defined"},
		{"service cycle", "services:\n  a: {command: x, depends_on: [b]}\n  b: {command: x, depends_on: [a]}\n", "services.a.depends_on: dependency cycle: a -> b -> a"},
		{"service cycle path", "services:\n  a: {command: x, depends_on: [b]}\n  b: {command: x, depends_on: [c]}\n  c: {command: x, depends_on: [b]}\n", "services.b.depends_on: dependency cycle: b -> c -> b"},
		{"service named like an agent", "agents:\n  web: {command: x}\nservices:\n  web: {command: y}\n", "services.web: a service must not be named like an agent (agents' and services' tmux windows are named after them)"},
		{"service named claude", "services:\n  claude: {command: y}\n", "services.claude: a service must not be named like an agent (agents' and services' tmux windows are named after them)"},
		{"service command required", "services:\n  a: {depends_on: []}\n", "services.a.command: is required"},
		{"profile service undefined", "autostart:\n  profiles:\n    web: {services: [web]}\n", "autostart.profiles.web.services[0]: service `web` is not defined"},
		{"default profile undefined", "autostart: {default_profile: web}\n", "autostart.default_profile: autostart profile `web` is not defined"},
		{"warm path absolute", "fork: {warm_paths: [/tmp]}\n", "fork.warm_paths[0]: warm path must be relative to the repository, not absolute"},
		{"warm path .git", "fork: {warm_paths: [a/.git/x]}\n", "fork.warm_paths[0]: warm path must not reach into `.git`"},
		{"idle zero", "orchestration: {idle_after_seconds: 0}\n", "orchestration.idle_after_seconds: must be 1 to 604800 seconds"},
		{"idle past max", "orchestration: {idle_after_seconds: 604801}\n", "orchestration.idle_after_seconds: must be 1 to 604800 seconds"},
		{"cap operation unknown", "orchestration:\n  cap: {operations: [fly]}\n", "orchestration.cap.operations[0]: unknown operation (want one of [destroy import message publish refresh restart rights spawn stop])"},
		{"cap children past max", "orchestration:\n  cap: {max_running_children: 65}\n", "orchestration.cap.max_running_children: must be 0 to 64"},
		{"cap publish unknown key", "orchestration:\n  cap:\n    publish: {merge: true}\n", "orchestration.cap.publish.merge: unknown key (line 3)"},
		{"cap publish bad action", "orchestration:\n  cap:\n    publish: {issues: {repos: [o/r], actions: [delete]}}\n", "orchestration.cap.publish.issues.actions has an unknown action (want create, comment, label or close)"},
		{"cap bad egress", "orchestration:\n  cap: {egress: [\"http://x\"]}\n", "orchestration.cap.egress has an invalid host (want a lowercase host name, optionally *.domain)"},
		{"default runner bad", "orchestration:\n  default_runner: {agent: codex}\n", "orchestration.default_runner.agent must be `claude` or `claude-jb`"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml))
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("got %v (%T), want *Error %q", err, err, tt.want)
			}
			if err.Error() != tt.want {
				t.Fatalf("\n got: %s\nwant: %s", err.Error(), tt.want)
			}
		})
	}
}

func TestParseLimits(t *testing.T) {
	pad := "# " + strings.Repeat("x", MaxConfigBytes-3) + "\n"
	if _, err := Parse([]byte(pad)); err != nil {
		t.Fatalf("at the limit: %v", err)
	}
	if _, err := Parse([]byte(pad + "#")); err == nil || err.Error() != "config exceeds 262144 bytes" {
		t.Fatalf("past the limit: %v", err)
	}
	paths := make([]string, MaxWarmPaths+1)
	for i := range paths {
		paths[i] = "p"
	}
	if _, err := Parse([]byte("fork: {warm_paths: [" + strings.Join(paths[:MaxWarmPaths], ",") + "]}\n")); err != nil {
		t.Fatalf("warm paths at the limit: %v", err)
	}
	if _, err := Parse([]byte("fork: {warm_paths: [" + strings.Join(paths, ",") + "]}\n")); err == nil || err.Error() != "fork.warm_paths: has more than 64 items" {
		t.Fatalf("warm paths past the limit: %v", err)
	}
}

func TestCheckWarmPath(t *testing.T) {
	long := strings.Repeat("a", MaxWarmPathLen)
	tests := []struct{ glob, want string }{
		{"node_modules", ""},
		{"**/target", ""},
		{"build/*/out", ""},
		{".venv", ""},
		{long, ""},
		{long + "a", "warm path exceeds 256 bytes"},
		{"", "warm path must not be empty"},
		{"/abs", "warm path must be relative to the repository, not absolute"},
		{"..", "warm path must not contain `..`"},
		{"a/../../b", "warm path must not contain `..`"},
		{".git", "warm path must not reach into `.git`"},
		{".git/**", "warm path must not reach into `.git`"},
		{"a//b", "warm path must not have empty or `.` segments"},
		{"./a", "warm path must not have empty or `.` segments"},
		{"a/", "warm path must not have empty or `.` segments"},
		{"a**b", "warm path may use `**` only as a whole segment"},
		{`a\b`, "warm path must not contain a backslash"},
		{"a\nb", "warm path must not contain control or format characters"},
		{"a\x1bb", "warm path must not contain control or format characters"},
		{"a\u0085b", "warm path must not contain control or format characters"},
		{"build\u202e/txt.exe", "warm path must not contain control or format characters"},
		{"a\u2066b", "warm path must not contain control or format characters"},
		{"a\u200bb", "warm path must not contain control or format characters"},
		{"a\ufeffb", "warm path must not contain control or format characters"},
		{"a\U000e0001b", "warm path must not contain control or format characters"},
		{"café/ñ", ""},
	}
	for _, tt := range tests {
		got := ""
		if err := CheckWarmPath(tt.glob); err != nil {
			got = err.Error()
		}
		if got != tt.want {
			t.Errorf("CheckWarmPath(%q) = %q, want %q", tt.glob, got, tt.want)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(fullConfig))
	f.Add([]byte("agents:\n  a: {command: x}\n"))
	f.Add([]byte("x: &a {}\nagents: *a\n"))
	f.Add([]byte("limits: {pids: 16, memory: 1TiB, cpu_weight: 10000}\n"))
	f.Add([]byte("limits: {memory: 1.5GiB}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("error without text")
			}
			return
		}
		if c.Orchestration.IdleAfterSeconds <= 0 {
			t.Fatal("accepted config without a positive idle_after_seconds")
		}
		if err := c.Limits.Validate(); err != nil {
			t.Fatalf("accepted limits do not validate: %v", err)
		}
	})
}

func TestRepoLimits(t *testing.T) {
	i64 := func(v int64) *int64 { return &v }
	i := func(v int) *int { return &v }
	tests := []struct {
		name, yaml string
		want       LimitsOverride
	}{
		{"absent", "agents: {}\n", LimitsOverride{}},
		{"null section", "limits:\n", LimitsOverride{}},
		{"empty section", "limits: {}\n", LimitsOverride{}},
		{"null keys", "limits: {pids: ~, memory: null, cpu_weight: , disk: ~}\n", LimitsOverride{}},
		{"pids only", "limits: {pids: 64}\n", LimitsOverride{Pids: i64(64)}},
		{"memory only", "limits: {memory: 512MiB}\n", LimitsOverride{MemoryBytes: i64(512 << 20)}},
		{"memory in bytes", "limits: {memory: 33554432}\n", LimitsOverride{MemoryBytes: i64(32 << 20)}},
		{"cpu_weight only", "limits: {cpu_weight: 400}\n", LimitsOverride{CPUWeight: i(400)}},
		{"disk only", "limits: {disk: 4GiB}\n", LimitsOverride{DiskBytes: i64(4 << 30)}},
		{"all", "limits:\n  pids: 2048\n  memory: 8GiB\n  cpu_weight: 50\n  disk: 64GiB\n", LimitsOverride{Pids: i64(2048), MemoryBytes: i64(8 << 30), CPUWeight: i(50), DiskBytes: i64(64 << 30)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(c.Limits, tt.want) {
				t.Fatalf("limits = %s, want %s", showOverride(c.Limits), showOverride(tt.want))
			}
		})
	}
	c, err := Parse([]byte("limits: {memory: 1GiB}\n"))
	if err != nil {
		t.Fatal(err)
	}
	got := DefaultBroker().Limits.Override(c.Limits)
	if got != (Limits{Pids: DefaultPids, MemoryBytes: 1 << 30, CPUWeight: DefaultCPUWeight, DiskBytes: DefaultDiskBytes}) {
		t.Fatalf("broker defaults overridden by the repo = %+v", got)
	}
}

func showOverride(o LimitsOverride) string {
	s := "{"
	if o.Pids != nil {
		s += fmt.Sprintf("pids:%d ", *o.Pids)
	}
	if o.MemoryBytes != nil {
		s += fmt.Sprintf("memory:%d ", *o.MemoryBytes)
	}
	if o.CPUWeight != nil {
		s += fmt.Sprintf("cpu_weight:%d ", *o.CPUWeight)
	}
	if o.DiskBytes != nil {
		s += fmt.Sprintf("disk:%d", *o.DiskBytes)
	}
	return s + "}"
}

func TestRepoLimitsRefusals(t *testing.T) {
	tests := []struct{ name, yaml, want string }{
		{"pids at min", "limits: {pids: 16}\n", ""},
		{"pids below min", "limits: {pids: 15}\n", "limits.pids: must be 16 to 4194304 (line 1)"},
		{"pids at max", "limits: {pids: 4194304}\n", ""},
		{"pids past max", "limits: {pids: 4194305}\n", "limits.pids: must be 16 to 4194304 (line 1)"},
		{"memory at min", "limits: {memory: 32MiB}\n", ""},
		{"memory below min", "limits: {memory: 33554431}\n", "limits.memory: must be 32MiB to 1TiB (line 1)"},
		{"memory at max", "limits: {memory: 1TiB}\n", ""},
		{"memory past max", "limits: {memory: 1099511627777}\n", "limits.memory: must be 32MiB to 1TiB (line 1)"},
		{"cpu_weight at min", "limits: {cpu_weight: 1}\n", ""},
		{"cpu_weight below min", "limits: {cpu_weight: 0}\n", "limits.cpu_weight: must be 1 to 10000 (line 1)"},
		{"disk at min", "limits: {disk: 512MiB}\n", ""},
		{"disk below min", "limits: {disk: 511MiB}\n", "limits.disk: must be 512MiB to 16TiB (line 1)"},
		{"cpu_weight at max", "limits: {cpu_weight: 10000}\n", ""},
		{"cpu_weight past max", "limits: {cpu_weight: 10001}\n", "limits.cpu_weight: must be 1 to 10000 (line 1)"},

		{"unknown key", "agents: {}\nlimits:\n  pids: 64\n  memroy: 1GiB\n", "limits.memroy: unknown key (line 4)"},
		{"duplicate key", "limits:\n  pids: 64\n  pids: 65\n", "limits.pids: duplicate key (line 3)"},
		{"duplicate section", "limits: {}\nlimits: {}\n", "limits: duplicate key (line 2)"},
		{"not a mapping", "limits: 4GiB\n", "limits: must be a mapping (line 1)"},
		{"list", "limits: [pids]\n", "limits: must be a mapping (line 1)"},
		{"alias section", "fork: &a {}\nlimits: *a\n", "limits: YAML aliases are not supported (line 2)"},
		{"alias value", "limits:\n  pids: &p 64\n  cpu_weight: *p\n", "limits.cpu_weight: YAML aliases are not supported (line 3)"},
		{"int quoted", "limits: {pids: \"64\"}\n", "limits.pids: must be an integer (line 1)"},
		{"int hex", "limits: {cpu_weight: 0x64}\n", "limits.cpu_weight: must be a plain decimal integer (no sign but -, no 0x, 0o, 0b, _ or leading zeros) (line 1)"},
		{"size GB", "limits: {memory: 4GB}\n", "limits.memory: unit `GB` is not accepted: use the binary units B, KiB, MiB, GiB or TiB (1GiB = 1024MiB) (line 1)"},
		{"size fraction", "limits: {memory: 0.5GiB}\n", "limits.memory: must be a whole number: use a smaller unit instead of a fraction (1536MiB, not 1.5GiB) (line 1)"},
		{"size overflow", "limits: {memory: 99999999999TiB}\n", "limits.memory: is too large (at most 9223372036854775807 bytes) (line 1)"},
		{"size bool", "limits: {memory: false}\n", "limits.memory: must be an integer number of bytes, or an integer with a unit B, KiB, MiB, GiB or TiB, such as 4GiB (line 1)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml))
			got := ""
			if err != nil {
				var ce *Error
				if !errors.As(err, &ce) {
					t.Fatalf("got %v (%T), want an *Error", err, err)
				}
				got = err.Error()
			}
			if got != tt.want {
				t.Fatalf("\n got: %s\nwant: %s", got, tt.want)
			}
		})
	}
}

// TestStartOrder: every service starts after what it depends on;
// independent ones in sorted order.
func TestStartOrder(t *testing.T) {
	c, err := Parse([]byte("services:\n  web: {command: x, depends_on: [db, cache]}\n  db: {command: x}\n  cache: {command: x, depends_on: [db]}\n  aux: {command: x}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.StartOrder(c.WithDependencies([]string{"web"})), " "); got != "db cache web" {
		t.Fatalf("web with dependencies starts as %q", got)
	}
	if got := strings.Join(c.StartOrder(c.AllServices()), " "); got != "aux db cache web" {
		t.Fatalf("all start as %q", got)
	}
}

// TestErrorsArePrintable: a key is the repository's text, any character
// ("\e" is YAML's escape for ESC) and any length; the error that names it
// goes to the host's terminal printable and bounded.
func TestErrorsArePrintable(t *testing.T) {
	long := strings.Repeat("k", 10000)
	for _, tc := range []struct {
		name, yaml string
		broker     bool
		want       string // the whole message, when set
	}{
		{name: "unknown top key", yaml: "\"\\e[2Jx\": 1\n", want: " [2Jx: unknown key (line 1)"},
		{name: "unknown nested key", yaml: "agents:\n  claude:\n    \"\\e]0;pwned\\a\\u202e\": x\n", want: "agents.claude. ]0;pwned  : unknown key (line 3)"},
		{name: "duplicate key", yaml: "agents:\n  \"\\e\": {command: x}\n  \"\\e\": {command: x}\n"},
		{name: "agent name", yaml: "agents:\n  \"\\e[31m\": {command: x}\n"},
		{name: "service named", yaml: "services:\n  \"\\x9b2J\": {command: x}\n"},
		{name: "value shown", yaml: "default_agent: \"\\e[2J\"\n", want: "default_agent: agent ` [2J` is not defined under agents"},
		// "? KEY": an explicit key, past YAML's 1024 characters of a plain one.
		{name: "long unknown key", yaml: "? " + long + "\n: 1\n"},
		{name: "long nested keys", yaml: "agents:\n  ? " + long + "\n  :\n    ? " + long + "\n    : x\n"},
		{name: "long agent name", yaml: "agents:\n  ? " + long + "\n  : {command: x}\n"},
		{name: "long profile tier", yaml: "litellm:\n  profiles:\n    p:\n      tiers:\n        ? " + long + "\n        : x\n", want: "litellm.profiles.p.tiers." + long[:60] + "…: tier must be fable, opus, sonnet or haiku"},
		{name: "broker unknown key", yaml: "\"\\e[2J\": 1\n", broker: true},
		{name: "broker long unknown key", yaml: "? " + long + "\n: 1\n", broker: true},
		{name: "broker unknown nested key", yaml: "limits:\n  ? \"\\e[2J" + long + "\"\n  : 1\n", broker: true},
		{name: "broker long agent", yaml: "agents:\n  ? " + long + "\n  : {version: 1.2.3}\n", broker: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.broker {
				_, err = ParseBroker([]byte(tc.yaml))
			} else {
				_, err = Parse([]byte(tc.yaml))
			}
			if err == nil {
				t.Fatal("parsed")
			}
			msg := err.Error()
			if strings.ContainsFunc(msg, func(r rune) bool { return r == utf8.RuneError || !unicode.IsPrint(r) }) {
				t.Errorf("not printable: %q", msg)
			}
			if len(msg) > 200 {
				t.Errorf("%d bytes, want at most 200: %.80q…", len(msg), msg)
			}
			if tc.want != "" && msg != tc.want {
				t.Errorf("\n got: %q\nwant: %q", msg, tc.want)
			}
		})
	}
}
