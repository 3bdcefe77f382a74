package grant

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestDefault(t *testing.T) {
	got, err := json.Marshal(Default())
	if err != nil {
		t.Fatal(err)
	}
	want := `{"version":1,"max_running_children":2,"operations":["destroy","import","message","restart","rights","spawn","stop"],"grantable":{"mounts":[],"loose":false,"egress":[]},"default_runner":null,"default_runner_source":null}`
	if string(got) != want {
		t.Fatalf("\n got: %s\nwant: %s", got, want)
	}
	back, err := Parse(got)
	if err != nil || !reflect.DeepEqual(back, Default()) {
		t.Fatalf("Default does not round-trip: %v %+v", err, back)
	}
}

func TestParseSpecExample(t *testing.T) {
	g, err := Parse([]byte(`{"version": 1, "max_running_children": 2,
 "operations": ["destroy", "import", "message", "restart", "rights", "spawn", "stop"],
 "grantable": {"mounts": [], "loose": false, "egress": []},
 "default_runner": {"agent": "claude", "model": "sonnet"},
 "default_runner_source": "repo"}`))
	if err != nil {
		t.Fatal(err)
	}
	if *g.DefaultRunner != (Runner{Agent: "claude", Model: "sonnet"}) || *g.DefaultRunnerSource != "repo" {
		t.Fatalf("got %+v", g)
	}
}

func TestParseNormalizes(t *testing.T) {
	g, err := Parse([]byte(`{"version":1,"max_running_children":1,"operations":["stop","stop","refresh"],"grantable":{"mounts":["aws","aws"],"loose":true,"egress":["pypi.org"]}}`))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g.Operations, []string{"message", "refresh", "spawn", "stop"}) {
		t.Errorf("operations = %q: want sorted, deduplicated, spawn and message added", g.Operations)
	}
	if !reflect.DeepEqual(g.Grantable.Mounts, []string{"aws"}) {
		t.Errorf("mounts = %q", g.Grantable.Mounts)
	}
}

func TestParseRefusals(t *testing.T) {
	ok := `"version":1,"max_running_children":2,"operations":[],"grantable":{"mounts":[],"loose":false,"egress":[]}`
	tests := []struct{ name, doc, want string }{
		{"unknown key", `{` + ok + `,"extra":1}`, `grant: unknown field "extra"`},
		{"unknown grantable key", `{"version":1,"max_running_children":2,"operations":[],"grantable":{"net":true}}`, `grant: grantable: unknown field "net"`},
		{"unknown runner key", `{` + ok + `,"default_runner":{"agent":"claude","x":1},"default_runner_source":"repo"}`, `grant: default_runner: unknown field "x"`},
		{"duplicate key", `{` + ok + `,"version":1}`, `grant: duplicate key "version"`},
		{"duplicate nested key", `{"version":1,"max_running_children":2,"operations":[],"grantable":{"loose":true,"loose":false}}`, `grant: duplicate key "loose"`},
		{"trailing data", `{` + ok + `}{}`, `grant: trailing data after the document`},
		{"version missing", `{"max_running_children":2,"operations":[],"grantable":{}}`, "grant: version is required"},
		{"version 2", `{"version":2,"max_running_children":2,"operations":[],"grantable":{}}`, "grant: version must be 1"},
		{"children missing", `{"version":1,"operations":[],"grantable":{}}`, "grant: max_running_children is required"},
		{"children at max", `{"version":1,"max_running_children":64,"operations":[],"grantable":{}}`, ""},
		{"children past max", `{"version":1,"max_running_children":65,"operations":[],"grantable":{}}`, "grant: max_running_children must be 0 to 64"},
		{"children negative", `{"version":1,"max_running_children":-1,"operations":[],"grantable":{}}`, "grant: max_running_children must be 0 to 64"},
		{"operations missing", `{"version":1,"max_running_children":2,"grantable":{}}`, "grant: operations is required"},
		{"operation unknown", `{"version":1,"max_running_children":2,"operations":["fly"],"grantable":{}}`, "grant: operations: unknown operation (want one of [destroy import message publish refresh restart rights spawn stop])"},
		{"grantable missing", `{"version":1,"max_running_children":2,"operations":[]}`, "grant: grantable is required"},
		{"grantable bad egress", `{"version":1,"max_running_children":2,"operations":[],"grantable":{"egress":["A B"]}}`, "grant: grantable.egress has an invalid host (want a lowercase host name, optionally *.domain)"},
		{"runner without source", `{` + ok + `,"default_runner":{"agent":"claude"}}`, "grant: default_runner and default_runner_source must both be set or both be null"},
		{"source without runner", `{` + ok + `,"default_runner_source":"repo"}`, "grant: default_runner and default_runner_source must both be set or both be null"},
		{"source unknown", `{` + ok + `,"default_runner":{"agent":"claude"},"default_runner_source":"team"}`, "grant: default_runner_source must be container, local, repo, global or null"},
		{"runner bad", `{` + ok + `,"default_runner":{"agent":"gpt"},"default_runner_source":"repo"}`, "grant: default_runner.agent must be `claude` or `claude-jb`"},
		{"wrong type", `{"version":"1","max_running_children":2,"operations":[],"grantable":{}}`, "grant: version must be an integer"},
		{"too large", `{"x":"` + strings.Repeat("a", MaxDocBytes) + `"}`, "grant: document exceeds 65536 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.doc))
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tt.want {
				t.Fatalf("\n got: %s\nwant: %s", got, tt.want)
			}
		})
	}
}

func TestParseTTL(t *testing.T) {
	tests := []struct {
		in    string
		d     time.Duration
		never bool
		bad   bool
	}{
		{"never", 0, true, false},
		{"5m", 5 * time.Minute, false, false},
		{"1h30m", 90 * time.Minute, false, false},
		{"90s", 90 * time.Second, false, false},
		{"24h", 24 * time.Hour, false, false},
		{"23h59m60s", 24 * time.Hour, false, false},
		{"24h1s", 0, false, true},
		{"25h", 0, false, true},
		{"0s", 0, false, true},
		{"0m", 0, false, true},
		{"", 0, false, true},
		{"Never", 0, false, true},
		{"1.5h", 0, false, true},
		{"-5m", 0, false, true},
		{"5ms", 0, false, true},
		{"1d", 0, false, true},
		{"30m1h", 0, false, true},
		{"99999999999999999h", 0, false, true},
	}
	for _, tt := range tests {
		d, never, err := ParseTTL(tt.in)
		if tt.bad {
			if err != ErrTTL {
				t.Errorf("ParseTTL(%q) = %v, %v, %v; want ErrTTL", tt.in, d, never, err)
			}
			continue
		}
		if err != nil || d != tt.d || never != tt.never {
			t.Errorf("ParseTTL(%q) = %v, %v, %v; want %v, %v", tt.in, d, never, err, tt.d, tt.never)
		}
	}
}

func TestCovers(t *testing.T) {
	tests := []struct {
		entry, host string
		want        bool
	}{
		{"pypi.org", "pypi.org", true},
		{"pypi.org", "files.pypi.org", false},
		{"*.example.com", "a.example.com", true},
		{"*.example.com", "a.b.example.com", true},
		{"*.example.com", "*.a.example.com", true},
		{"*.example.com", "*.example.com", true},
		{"*.example.com", "example.com", false},
		{"*.example.com", "badexample.com", false},
		{"*.example.com", "*.com", false},
	}
	for _, tt := range tests {
		if got := Covers(tt.entry, tt.host); got != tt.want {
			t.Errorf("Covers(%q, %q) = %v, want %v", tt.entry, tt.host, got, tt.want)
		}
	}
}

func TestCheckRights(t *testing.T) {
	g := Default()
	g.Grantable = Rights{Mounts: []string{"aws"}, Egress: []string{"pypi.org", "*.npmjs.org"}}
	gl := g
	gl.Grantable.Loose = true
	capEgress := Cap{Egress: []string{"*.example.com"}}
	wild := g
	wild.Grantable = Rights{Egress: []string{"*.0.0.1"}}
	addr := g
	addr.Grantable = Rights{Egress: []string{"10.1.2.3"}}
	tests := []struct {
		name string
		g    Grant
		cap  Cap
		r    Rights
		want string
	}{
		{"empty", g, Cap{}, Rights{}, ""},
		{"mount in grantable", g, Cap{}, Rights{Mounts: []string{"aws"}}, ""},
		{"mount not in grantable", g, Cap{}, Rights{Mounts: []string{"gcp"}}, "mount `gcp` is not grantable"},
		{"loose without permission", g, Cap{}, Rights{Loose: true}, "loose is not grantable"},
		{"loose with permission", gl, Cap{}, Rights{Loose: true}, ""},
		{"egress exact", g, Cap{}, Rights{Egress: []string{"pypi.org"}}, ""},
		{"egress by wildcard", g, Cap{}, Rights{Egress: []string{"registry.npmjs.org"}}, ""},
		{"egress not covered", g, Cap{}, Rights{Egress: []string{"evil.org"}}, "egress `evil.org` is not grantable"},
		{"loose allows any egress without repo cap", gl, Cap{}, Rights{Egress: []string{"evil.org"}}, ""},
		{"loose allows egress inside repo cap", gl, capEgress, Rights{Egress: []string{"a.example.com"}}, ""},
		{"loose refuses egress outside repo cap", gl, capEgress, Rights{Egress: []string{"evil.org"}}, "egress `evil.org` is not grantable"},
		{"empty repo egress cap allows none by loose", gl, Cap{Egress: []string{}}, Rights{Egress: []string{"evil.org"}}, "egress `evil.org` is not grantable"},
		// An address entry reaches what the proxy refuses otherwise: only an
		// entry naming it passes it on.
		{"loose never grants loopback", gl, Cap{}, Rights{Egress: []string{"127.0.0.1"}}, "egress `127.0.0.1` is not grantable: an address is granted only by a grantable entry that names it"},
		{"loose never grants the metadata service", gl, Cap{}, Rights{Egress: []string{"169.254.169.254"}}, "egress `169.254.169.254` is not grantable: an address is granted only by a grantable entry that names it"},
		{"loose never grants a private address", gl, Cap{}, Rights{Egress: []string{"10.0.0.1"}}, "egress `10.0.0.1` is not grantable: an address is granted only by a grantable entry that names it"},
		{"loose never grants a public address", gl, Cap{}, Rights{Egress: []string{"93.184.216.34"}}, "egress `93.184.216.34` is not grantable: an address is granted only by a grantable entry that names it"},
		{"loose inside a repo cap naming the address", gl, Cap{Egress: []string{"127.0.0.1"}}, Rights{Egress: []string{"127.0.0.1"}}, "egress `127.0.0.1` is not grantable: an address is granted only by a grantable entry that names it"},
		{"a wildcard never grants an address", wild, Cap{}, Rights{Egress: []string{"127.0.0.1"}}, "egress `127.0.0.1` is not grantable: an address is granted only by a grantable entry that names it"},
		{"an entry naming the address grants it", addr, Cap{}, Rights{Egress: []string{"10.1.2.3"}}, ""},
		{"an entry naming another address does not", addr, Cap{}, Rights{Egress: []string{"10.1.2.4"}}, "egress `10.1.2.4` is not grantable: an address is granted only by a grantable entry that names it"},
		{"an address entry outside the repo cap", addr, capEgress, Rights{Egress: []string{"10.1.2.3"}}, "egress `10.1.2.3` is not grantable: an address is granted only by a grantable entry that names it"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ""
			if err := CheckRights(tt.g.Capped(tt.cap), tt.cap, tt.r); err != nil {
				got = err.Error()
			}
			if got != tt.want {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestEgressRight(t *testing.T) {
	r := Rights{Egress: []string{"*.example.com", "a.example.com", "pypi.org"}}
	rl := r
	rl.Loose = true
	tests := []struct {
		name string
		r    Rights
		cap  Cap
		host string
		want string
	}{
		{"exact before wildcard", r, Cap{}, "a.example.com", "a.example.com"},
		{"wildcard", r, Cap{}, "b.example.com", "*.example.com"},
		{"exact", r, Cap{}, "pypi.org", "pypi.org"},
		{"nothing", r, Cap{}, "evil.org", ""},
		{"wildcard not the apex", r, Cap{}, "example.com", ""},
		{"loose without repo cap", rl, Cap{}, "evil.org", LooseRight},
		{"entry before loose", rl, Cap{}, "pypi.org", "pypi.org"},
		{"loose inside repo cap", rl, Cap{Egress: []string{"*.corp.org"}}, "git.corp.org", LooseRight},
		{"loose outside repo cap", rl, Cap{Egress: []string{"*.corp.org"}}, "evil.org", ""},
		{"loose under an empty repo cap", rl, Cap{Egress: []string{}}, "evil.org", ""},
		{"entry under an empty repo cap", rl, Cap{Egress: []string{}}, "pypi.org", "pypi.org"},
		// An entry named loose, stored before CheckSyntax refused it, is
		// never the right that allows a connection: it would share the
		// loose right's name.
		{"stored loose entry", Rights{Egress: []string{"loose"}}, Cap{}, "loose", ""},
		{"stored loose. entry", Rights{Egress: []string{"loose."}}, Cap{}, "loose", ""},
		{"stored loose entry beside loose", Rights{Loose: true, Egress: []string{"loose"}}, Cap{}, "loose", LooseRight},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.r.EgressRight(tt.cap, tt.host); got != tt.want {
				t.Fatalf("EgressRight(%q) = %q, want %q", tt.host, got, tt.want)
			}
		})
	}
}

func TestCapped(t *testing.T) {
	g := Default()
	g.MaxRunningChildren = 5
	g.Grantable = Rights{Mounts: []string{"aws", "gcp"}, Loose: true, Egress: []string{"a.example.com", "pypi.org"}}
	two, no := 2, false
	c := Cap{MaxRunningChildren: &two, Operations: []string{"stop"}, Mounts: []string{"aws"}, Loose: &no, Egress: []string{"*.example.com"}}
	got := g.Capped(c)
	want := Grant{
		Version: 1, MaxRunningChildren: 2,
		Operations: []string{"message", "spawn", "stop"},
		Grantable:  Rights{Mounts: []string{"aws"}, Loose: false, Egress: []string{"a.example.com"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("\n got: %+v\nwant: %+v", got, want)
	}
	if !reflect.DeepEqual(got.Capped(c), got) {
		t.Error("capping twice must change nothing")
	}
	if !reflect.DeepEqual(g.Capped(Cap{}), g) {
		t.Error("an empty cap must change nothing")
	}
	if g.Grantable.Mounts[1] != "gcp" {
		t.Error("Capped must not modify its receiver")
	}
}

func TestRunnerCheck(t *testing.T) {
	tests := []struct {
		r    Runner
		want string
	}{
		{Runner{Agent: "claude"}, ""},
		{Runner{Agent: "claude", Model: "fable[1m]"}, ""},
		{Runner{Agent: "claude-jb", Profile: "grok_2", Model: "haiku"}, ""},
		{Runner{}, "runner.agent is required"},
		{Runner{Agent: "codex"}, "runner.agent must be `claude` or `claude-jb`"},
		{Runner{Agent: "claude", Profile: "grok"}, "runner.profile is only valid with agent `claude-jb`"},
		{Runner{Agent: "claude-jb", Profile: "Grok"}, "runner.profile must match [a-z0-9][a-z0-9_-]{0,63}"},
		{Runner{Agent: "claude", Model: "sonnet[1m][1m]"}, "runner.model must be fable, opus, sonnet or haiku, optionally with the exact suffix [1m]"},
		{Runner{Agent: "claude", Model: "[1m]"}, "runner.model must be fable, opus, sonnet or haiku, optionally with the exact suffix [1m]"},
		{Runner{Agent: "claude", Model: "Sonnet"}, "runner.model must be fable, opus, sonnet or haiku, optionally with the exact suffix [1m]"},
	}
	for _, tt := range tests {
		got := ""
		if err := tt.r.Check("runner"); err != nil {
			got = err.Error()
		}
		if got != tt.want {
			t.Errorf("%+v: got %q, want %q", tt.r, got, tt.want)
		}
	}
}

// TestCheckSyntaxLooseHost: an egress entry for a host named loose would
// share its right's name with the loose right (EgressRight), so that
// revoking one cut the connections of both: it is refused, in any case,
// with or without a trailing dot. Hosts that only contain the word pass.
func TestCheckSyntaxLooseHost(t *testing.T) {
	const refusal = "rights.egress has a host named `loose` (in any case, with or without a trailing dot): that is the name of the loose right, not a host; ask for loose egress with loose: true"
	tests := []struct {
		entry, want string
	}{
		{"loose", refusal},
		{"loose.", refusal},
		{"LOOSE", refusal},
		{"Loose.", refusal},
		{"lOoSe", refusal},
		{"loose..", "rights.egress has an invalid host (want a lowercase host name, optionally *.domain)"},
		{"looser", ""},
		{"loose.example.com", ""},
		{"a.loose", ""},
		{"*.loose", ""},
		{"xloose", ""},
	}
	for _, tt := range tests {
		for _, r := range []Rights{{Egress: []string{tt.entry}}, {Loose: true, Egress: []string{"pypi.org", tt.entry}}} {
			got := ""
			if err := r.CheckSyntax("rights"); err != nil {
				got = err.Error()
			}
			if got != tt.want {
				t.Errorf("CheckSyntax(%+v) = %q; want %q", r, got, tt.want)
			}
		}
	}
	if err := (Rights{Loose: true, Egress: []string{"pypi.org"}}).CheckSyntax("rights"); err != nil {
		t.Errorf("loose with a host: %v", err)
	}
}

func TestValidEgressAndMount(t *testing.T) {
	for _, h := range []string{"pypi.org", "*.example.com", "10.0.0.1", "a-b.c", strings.Repeat("a.", 126) + "a"} {
		if !ValidEgress(h) {
			t.Errorf("ValidEgress(%q) = false", h)
		}
	}
	for _, h := range []string{"", "*", "*.", "a..b", "-a.b", "A.b", "a.b:443", "http://a", "a/b", "*.*.a", strings.Repeat("a.", 127)} {
		if ValidEgress(h) {
			t.Errorf("ValidEgress(%q) = true", h)
		}
	}
	if !ValidMount("aws") || !ValidMount(strings.Repeat("m", MaxNameLen)) || ValidMount(strings.Repeat("m", MaxNameLen+1)) || ValidMount("../x") {
		t.Error("ValidMount")
	}
}

func FuzzParse(f *testing.F) {
	b, _ := json.Marshal(Default())
	f.Add(b)
	f.Add([]byte(`{"version":1,"max_running_children":1,"operations":["stop"],"grantable":{"mounts":["a"],"loose":true,"egress":["*.a.b"]},"default_runner":{"agent":"claude-jb","profile":"p","model":"opus[1m]"},"default_runner_source":"global"}`))
	f.Add([]byte(`{"version":1,"version":1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		g, err := Parse(data)
		if err != nil {
			return
		}
		out, err := json.Marshal(g)
		if err != nil {
			t.Fatal(err)
		}
		back, err := Parse(out)
		if err != nil || !reflect.DeepEqual(back, g) {
			t.Fatalf("accepted grant does not round-trip: %v\n%s", err, out)
		}
	})
}
