package manifest

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"agentbox/internal/grant"
)

func strp(s string) *string { return &s }

type decodeCase struct {
	name   string
	raw    string
	body   *string
	detail string // "" = accepted
}

// runDecode checks each case's outcome: accepted, or refused with exactly
// the detail.
func runDecode(t *testing.T, cases []decodeCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Decode([]byte(tc.raw), tc.body)
			if tc.detail == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if m == nil {
					t.Fatal("nil manifest without error")
				}
				return
			}
			var r *Refusal
			if !errors.As(err, &r) {
				t.Fatalf("got %v (%T), want refusal %q", err, err, tc.detail)
			}
			if r.Detail != tc.detail {
				t.Fatalf("detail\n got: %s\nwant: %s", r.Detail, tc.detail)
			}
		})
	}
}

func TestDecodeEnvelope(t *testing.T) {
	id64 := "a" + strings.Repeat("b", 63)
	runDecode(t, []decodeCase{
		{"minimal stop", `{"version":1,"id":"stop-1","type":"stop","child":"c"}`, nil, ""},
		{"id at max length", `{"version":1,"id":"` + id64 + `","type":"stop","child":"c"}`, nil, ""},
		{"id past max length", `{"version":1,"id":"` + id64 + `x","type":"stop","child":"c"}`, nil, "`id` must match ^[a-z0-9][a-z0-9-]{0,63}$"},
		{"id uppercase", `{"version":1,"id":"Stop-1","type":"stop","child":"c"}`, nil, "`id` must match ^[a-z0-9][a-z0-9-]{0,63}$"},
		{"id leading dash", `{"version":1,"id":"-s","type":"stop","child":"c"}`, nil, "`id` must match ^[a-z0-9][a-z0-9-]{0,63}$"},
		{"id missing", `{"version":1,"type":"stop","child":"c"}`, nil, "`id` is required"},
		{"id not a string", `{"version":1,"id":7,"type":"stop","child":"c"}`, nil, "`id` must be a string"},
		{"type missing", `{"version":1,"id":"s","child":"c"}`, nil, "`type` is required"},
		{"type unknown", `{"version":1,"id":"s","type":"finish"}`, nil, "unknown type `finish` (want spawn, message, import, update, restart, refresh, stop, destroy, rights or publish)"},
		{"type unknown long value is cut", `{"version":1,"id":"s","type":"` + strings.Repeat("x", 100) + `"}`, nil, "unknown type `" + strings.Repeat("x", 64) + "…` (want spawn, message, import, update, restart, refresh, stop, destroy, rights or publish)"},
		{"type unknown controls and format characters shown as ?", `{"version":1,"id":"s","type":"a\u001b[2J\u0085\u202eb\u2066\u200bc\ufeff` + "`" + `"}`, nil, "unknown type `a?[2J??b??c??` (want spawn, message, import, update, restart, refresh, stop, destroy, rights or publish)"},
		{"unknown key with a bidi override shown as ?", `{"version":1,"id":"s","type":"stop","child":"c","ex\u202etra":1}`, nil, "unknown key `ex?tra`"},
		{"version missing", `{"id":"s","type":"stop","child":"c"}`, nil, "`version` is required"},
		{"version null", `{"version":null,"id":"s","type":"stop","child":"c"}`, nil, "`version` is required"},
		{"version 2 on stop", `{"version":2,"id":"s","type":"stop","child":"c"}`, nil, "`version` must be 1"},
		{"version 1.0", `{"version":1.0,"id":"s","type":"stop","child":"c"}`, nil, "`version` must be 1"},
		{"version string", `{"version":"1","id":"s","type":"stop","child":"c"}`, nil, "`version` must be 1"},
		{"spawn version 3", `{"version":3,"id":"s","type":"spawn","kind":"fork","branch":"b","prompt":"p"}`, nil, "`version` must be 1 or 2 for spawn"},
		{"spawn version 0", `{"version":0,"id":"s","type":"spawn","kind":"fork","branch":"b","prompt":"p"}`, nil, "`version` must be 1 or 2 for spawn"},
		{"unknown top-level key", `{"version":1,"id":"s","type":"stop","child":"c","extra":1}`, nil, "unknown key `extra`"},
		{"key matching is case-sensitive", `{"version":1,"ID":"s","id":"s","type":"stop","child":"c"}`, nil, "unknown key `ID`"},
		{"duplicate key", `{"version":1,"id":"s","id":"t","type":"stop","child":"c"}`, nil, "duplicate key `id`"},
		{"duplicate key through escape", `{"version":1,"id":"s","\u0069d":"t","type":"stop","child":"c"}`, nil, "duplicate key `id`"},
		{"trailing data", `{"version":1,"id":"s","type":"stop","child":"c"} {}`, nil, "trailing data after the manifest"},
		{"trailing whitespace is fine", "{\"version\":1,\"id\":\"s\",\"type\":\"stop\",\"child\":\"c\"}\n ", nil, ""},
		{"not an object", `[1]`, nil, "manifest must be a JSON object"},
		{"not JSON", `{"version":1,`, nil, "manifest is not valid JSON"},
		{"empty", ``, nil, "manifest is not valid JSON"},
		{"invalid UTF-8", "{\"version\":1,\"id\":\"s\",\"type\":\"stop\",\"child\":\"\xff\"}", nil, "manifest is not valid UTF-8"},
		{"too large", `{"version":1,"id":"s","type":"stop","child":"c","x":"` + strings.Repeat("a", MaxManifestBytes) + `"}`, nil, "manifest exceeds 1048576 bytes"},
		{"body without a file field", `{"version":1,"id":"s","type":"stop","child":"c"}`, strp("text"), "request body given but the manifest has no `prompt_file` or `body_file`"},
		{"body past the limit", `{"version":1,"id":"s","type":"stop","child":"c"}`, strp(strings.Repeat("a", MaxTextBytes+1)), "request body exceeds 65536 bytes"},
		{"body invalid UTF-8", `{"version":1,"id":"s","type":"message","body_file":"b.md"}`, strp("\xff"), "request body is not valid UTF-8"},
	})
}

func TestDecodeRefusalCarriesID(t *testing.T) {
	_, err := Decode([]byte(`{"version":1,"id":"stop-9","type":"stop"}`), nil)
	var r *Refusal
	if !errors.As(err, &r) || r.ID != "stop-9" || r.Detail != "`child` is required" {
		t.Fatalf("got %#v", err)
	}
	_, err = Decode([]byte(`{"version":1,"id":"BAD","type":"stop"}`), nil)
	if !errors.As(err, &r) || r.ID != "" {
		t.Fatalf("invalid id must not be carried: %#v", err)
	}
}

func TestDecodeMessage(t *testing.T) {
	big := strings.Repeat("a", MaxTextBytes)
	runDecode(t, []decodeCase{
		{"spec example", `{"version": 1, "id": "reply-0004", "type": "message", "to": "fix-issue-12",
 "body": "Use the existing parser, do not add a new one.", "kind": "note",
 "in_reply_to": "h-3fa9c012"}`, nil, ""},
		{"child done example", `{"version": 1, "id": "msg-0003", "type": "message", "kind": "done",
 "body": "Fixed the parser; tests pass. Everything is committed.", "in_reply_to": null}`, nil, ""},
		{"kind question", `{"version":1,"id":"m","type":"message","body":"b","kind":"question"}`, nil, ""},
		{"kind blocked", `{"version":1,"id":"m","type":"message","body":"b","kind":"blocked"}`, nil, ""},
		{"kind idle is host-only", `{"version":1,"id":"m","type":"message","body":"b","kind":"idle"}`, nil, "kind `idle` is host-only and cannot be sent"},
		{"kind unknown", `{"version":1,"id":"m","type":"message","body":"b","kind":"urgent"}`, nil, "`kind` must be note, question, done or blocked"},
		{"body_file with body", `{"version":1,"id":"m","type":"message","body_file":"m.md"}`, strp("from the body"), ""},
		{"body_file without body", `{"version":1,"id":"m","type":"message","body_file":"m.md"}`, nil, "`body_file` needs the text as the request body"},
		{"body and body_file", `{"version":1,"id":"m","type":"message","body":"b","body_file":"m.md"}`, strp("x"), "`body` and `body_file` are mutually exclusive"},
		{"body_file bidi name", `{"version":1,"id":"m","type":"message","body_file":"notes\u202ed.md"}`, strp("x"), "`body_file` must be a file name of 1 to 255 bytes"},
		{"body_file empty name", `{"version":1,"id":"m","type":"message","body_file":""}`, strp("x"), "`body_file` must be a file name of 1 to 255 bytes"},
		{"no body at all", `{"version":1,"id":"m","type":"message","to":"c"}`, nil, "`body` or `body_file` is required"},
		{"empty body", `{"version":1,"id":"m","type":"message","body":"  "}`, nil, "`body` text is empty"},
		{"body at the limit", `{"version":1,"id":"m","type":"message","body":"` + big + `"}`, nil, ""},
		{"body past the limit", `{"version":1,"id":"m","type":"message","body":"` + big + `a"}`, nil, "`body` text exceeds 65536 bytes"},
		{"body_file text at the limit", `{"version":1,"id":"m","type":"message","body_file":"m.md"}`, strp(big), ""},
		{"to invalid", `{"version":1,"id":"m","type":"message","to":"Fix_12","body":"b"}`, nil, "`to` must be a child's short name ([a-z0-9][a-z0-9-]{0,62})"},
		{"in_reply_to invalid", `{"version":1,"id":"m","type":"message","body":"b","in_reply_to":"H-XYZ"}`, nil, "`in_reply_to` must be a message id (h-<hex> or a manifest id)"},
		{"in_reply_to not a string", `{"version":1,"id":"m","type":"message","body":"b","in_reply_to":5}`, nil, "`in_reply_to` must be a message id or null"},
		{"unknown key", `{"version":1,"id":"m","type":"message","body":"b","from":"x"}`, nil, "unknown key `from`"},
	})
}

func TestDecodeMessageValues(t *testing.T) {
	m, err := Decode([]byte(`{"version":1,"id":"m","type":"message","to":"c","body_file":"m.md","in_reply_to":"h-3fa9c012"}`), strp("hello"))
	if err != nil {
		t.Fatal(err)
	}
	want := &Message{To: "c", Body: "hello", BodyFile: "m.md", Kind: MsgNote, InReplyTo: strp("h-3fa9c012")}
	if !reflect.DeepEqual(m.Message, want) {
		t.Fatalf("got %+v, want %+v", m.Message, want)
	}
}

const okPrompt = `"prompt":"do it"`

func spawnJSON(version int, fields string) string {
	v := "1"
	if version == 2 {
		v = "2"
	}
	return `{"version":` + v + `,"id":"sp","type":"spawn",` + fields + `}`
}

func TestDecodeSpawn(t *testing.T) {
	hex := strings.Repeat("a1", 20)
	runDecode(t, []decodeCase{
		{"spec fork example", `{"version": 1, "id": "spawn-fix-12", "type": "spawn", "kind": "fork",
 "branch": "fix/issue-12", "prompt_file": "spawn-fix-12.md",
 "rights": {"mounts": [], "loose": false, "egress": []}, "note": "GitHub #12"}`, strp("Fix it."), ""},
		{"spec new example", `{"version": 1, "id": "spawn-docs-1", "type": "spawn", "kind": "new",
 "base": "main", "branch": "docs/intro", "prompt": "Write the intro page.",
 "rights": {"mounts": [], "loose": false, "egress": []}}`, nil, ""},
		{"spec runner example", `{"version": 1, "id": "spawn-fix-13", "type": "spawn", "kind": "fork",
 "branch": "fix/issue-13", "prompt": "Fix issue 13.",
 "rights": {"mounts": [], "loose": false, "egress": []},
 "runner": {"agent": "claude-jb", "profile": "grok", "model": "sonnet"}}`, nil, ""},
		{"kind missing", spawnJSON(1, `"branch":"b",`+okPrompt), nil, "`kind` is required"},
		{"kind unknown", spawnJSON(1, `"kind":"clone","branch":"b",`+okPrompt), nil, "`kind` must be fork, new or pr"},
		{"branch missing", spawnJSON(1, `"kind":"fork",`+okPrompt), nil, "`branch` is required"},
		{"branch invalid", spawnJSON(1, `"kind":"fork","branch":"a..b",`+okPrompt), nil, "`branch` is not a valid branch name"},
		{"branch with space", spawnJSON(1, `"kind":"fork","branch":"a b",`+okPrompt), nil, "`branch` is not a valid branch name"},
		{"branch bad short name", spawnJSON(1, `"kind":"fork","branch":"_x",`+okPrompt), nil, "`branch` gives the short name `-x`, which cannot name a child (want [a-z0-9][a-z0-9-]{0,62})"},
		{"prompt missing", spawnJSON(1, `"kind":"fork","branch":"b"`), nil, "`prompt` or `prompt_file` is required"},
		{"prompt_file without body", spawnJSON(1, `"kind":"fork","branch":"b","prompt_file":"p.md"`), nil, "`prompt_file` needs the text as the request body"},
		{"prompt and prompt_file", spawnJSON(1, `"kind":"fork","branch":"b","prompt":"x","prompt_file":"p.md"`), strp("x"), "`prompt` and `prompt_file` are mutually exclusive"},
		{"base with new", spawnJSON(1, `"kind":"new","branch":"b","base":"main",`+okPrompt), nil, ""},
		{"new without base", spawnJSON(1, `"kind":"new","branch":"b",`+okPrompt), nil, ""},
		{"base with fork", spawnJSON(1, `"kind":"fork","branch":"b","base":"main",`+okPrompt), nil, "`base` is only valid with kind `new`"},
		{"v1 refuses ref", spawnJSON(1, `"kind":"fork","branch":"b","ref":"refs/heads/x",`+okPrompt), nil, "`ref` needs spawn version 2"},
		{"v1 refuses pr", spawnJSON(1, `"kind":"fork","branch":"b","pr":3,`+okPrompt), nil, "`pr` needs spawn version 2"},
		{"v1 refuses warm_paths", spawnJSON(1, `"kind":"fork","branch":"b","warm_paths":[],`+okPrompt), nil, "`warm_paths` needs spawn version 2"},
		{"v1 refuses kind pr", spawnJSON(1, `"kind":"pr","branch":"b",`+okPrompt), nil, "kind `pr` needs spawn version 2"},
		{"v2 fork ref refs", spawnJSON(2, `"kind":"fork","branch":"b","ref":"refs/heads/fix",`+okPrompt), nil, ""},
		{"v2 fork ref commit", spawnJSON(2, `"kind":"fork","branch":"b","ref":"`+hex+`",`+okPrompt), nil, ""},
		{"v2 ref bare name", spawnJSON(2, `"kind":"fork","branch":"b","ref":"main",`+okPrompt), nil, "`ref` must be a full refs/ name (refs/heads/<name> for a local branch) or a 40-hex commit"},
		{"v2 ref short hex", spawnJSON(2, `"kind":"fork","branch":"b","ref":"abc123",`+okPrompt), nil, "`ref` must be a full refs/ name (refs/heads/<name> for a local branch) or a 40-hex commit"},
		{"v2 ref uppercase hex", spawnJSON(2, `"kind":"fork","branch":"b","ref":"`+strings.ToUpper(hex)+`",`+okPrompt), nil, "`ref` must be a full refs/ name (refs/heads/<name> for a local branch) or a 40-hex commit"},
		{"v2 ref refs/ only", spawnJSON(2, `"kind":"fork","branch":"b","ref":"refs/",`+okPrompt), nil, "`ref` must be a full refs/ name (refs/heads/<name> for a local branch) or a 40-hex commit"},
		{"v2 ref with new", spawnJSON(2, `"kind":"new","branch":"b","ref":"refs/heads/x",`+okPrompt), nil, "`ref` is only valid with kind `fork`"},
		{"v2 pr", spawnJSON(2, `"kind":"pr","pr":12,`+okPrompt), nil, ""},
		{"v2 pr with branch", spawnJSON(2, `"kind":"pr","pr":12,"branch":"pr/12",`+okPrompt), nil, ""},
		{"v2 pr at max", spawnJSON(2, `"kind":"pr","pr":2147483647,`+okPrompt), nil, ""},
		{"v2 pr past max", spawnJSON(2, `"kind":"pr","pr":2147483648,`+okPrompt), nil, "kind `pr` needs `pr`: a positive integer"},
		{"v2 pr zero", spawnJSON(2, `"kind":"pr","pr":0,`+okPrompt), nil, "kind `pr` needs `pr`: a positive integer"},
		{"v2 pr negative", spawnJSON(2, `"kind":"pr","pr":-1,`+okPrompt), nil, "kind `pr` needs `pr`: a positive integer"},
		{"v2 pr fraction", spawnJSON(2, `"kind":"pr","pr":1.5,`+okPrompt), nil, "kind `pr` needs `pr`: a positive integer"},
		{"v2 pr string", spawnJSON(2, `"kind":"pr","pr":"12",`+okPrompt), nil, "kind `pr` needs `pr`: a positive integer"},
		{"v2 pr missing", spawnJSON(2, `"kind":"pr",`+okPrompt), nil, "kind `pr` needs `pr`: a positive integer"},
		{"v2 pr with fork", spawnJSON(2, `"kind":"fork","branch":"b","pr":3,`+okPrompt), nil, "`pr` is only valid with kind `pr`"},
		{"v2 warm_paths fork", spawnJSON(2, `"kind":"fork","branch":"b","warm_paths":["node_modules","build/**","target/*/cache"],`+okPrompt), nil, ""},
		{"v2 warm_paths empty", spawnJSON(2, `"kind":"fork","branch":"b","warm_paths":[],`+okPrompt), nil, ""},
		{"v2 warm_paths with new", spawnJSON(2, `"kind":"new","branch":"b","warm_paths":["x"],`+okPrompt), nil, "`warm_paths` is only valid with kind `fork`"},
		{"v2 warm_paths absolute", spawnJSON(2, `"kind":"fork","branch":"b","warm_paths":["/etc"],`+okPrompt), nil, "`warm_paths`: warm path must be relative to the repository, not absolute"},
		{"v2 warm_paths dotdot", spawnJSON(2, `"kind":"fork","branch":"b","warm_paths":["a/../b"],`+okPrompt), nil, "`warm_paths`: warm path must not contain `..`"},
		{"v2 warm_paths .git root", spawnJSON(2, `"kind":"fork","branch":"b","warm_paths":[".git/objects"],`+okPrompt), nil, "`warm_paths`: warm path must not reach into `.git`"},
		{"v2 warm_paths not strings", spawnJSON(2, `"kind":"fork","branch":"b","warm_paths":[1],`+okPrompt), nil, "`warm_paths` must be a list of strings"},
		{"rights unknown key", spawnJSON(1, `"kind":"fork","branch":"b","rights":{"mounts":[],"net":true},`+okPrompt), nil, "unknown key `rights.net`"},
		{"rights not an object", spawnJSON(1, `"kind":"fork","branch":"b","rights":[],`+okPrompt), nil, "`rights` must be an object"},
		{"rights bad mount", spawnJSON(1, `"kind":"fork","branch":"b","rights":{"mounts":["../x"]},`+okPrompt), nil, "rights.mounts has an invalid mount name (want [A-Za-z0-9][A-Za-z0-9._-]{0,63})"},
		{"rights bad egress", spawnJSON(1, `"kind":"fork","branch":"b","rights":{"egress":["https://x"]},`+okPrompt), nil, "rights.egress has an invalid host (want a lowercase host name, optionally *.domain)"},
		{"rights duplicate key", spawnJSON(1, `"kind":"fork","branch":"b","rights":{"loose":true,"loose":false},`+okPrompt), nil, "duplicate key `rights.loose`"},
		{"on_done keep", spawnJSON(1, `"kind":"fork","branch":"b","on_done":"keep",`+okPrompt), nil, ""},
		{"on_done invalid", spawnJSON(1, `"kind":"fork","branch":"b","on_done":"archive",`+okPrompt), nil, "`on_done` must be destroy or keep"},
		{"note past limit", spawnJSON(1, `"kind":"fork","branch":"b","note":"`+strings.Repeat("n", MaxNoteBytes+1)+`",`+okPrompt), nil, "`note` exceeds 1024 bytes"},
		{"note at limit", spawnJSON(1, `"kind":"fork","branch":"b","note":"`+strings.Repeat("n", MaxNoteBytes)+`",`+okPrompt), nil, ""},
		{"runner unknown key", spawnJSON(1, `"kind":"fork","branch":"b","runner":{"agent":"claude","effort":"high"},`+okPrompt), nil, "unknown key `runner.effort`"},
		{"runner agent missing", spawnJSON(1, `"kind":"fork","branch":"b","runner":{"model":"opus"},`+okPrompt), nil, "`runner.agent` is required"},
		{"runner agent unknown", spawnJSON(1, `"kind":"fork","branch":"b","runner":{"agent":"codex"},`+okPrompt), nil, "runner.agent must be `claude` or `claude-jb`"},
		{"runner profile with claude", spawnJSON(1, `"kind":"fork","branch":"b","runner":{"agent":"claude","profile":"grok"},`+okPrompt), nil, "runner.profile is only valid with agent `claude-jb`"},
		{"runner model 1m", spawnJSON(1, `"kind":"fork","branch":"b","runner":{"agent":"claude","model":"sonnet[1m]"},`+okPrompt), nil, ""},
		{"runner model 1M", spawnJSON(1, `"kind":"fork","branch":"b","runner":{"agent":"claude","model":"sonnet[1M]"},`+okPrompt), nil, "runner.model must be fable, opus, sonnet or haiku, optionally with the exact suffix [1m]"},
		{"runner model unknown", spawnJSON(1, `"kind":"fork","branch":"b","runner":{"agent":"claude","model":"gpt"},`+okPrompt), nil, "runner.model must be fable, opus, sonnet or haiku, optionally with the exact suffix [1m]"},
		{"autostart_profile", spawnJSON(1, `"kind":"fork","branch":"b","autostart_profile":"web",`+okPrompt), nil, ""},
		{"autostart_profile invalid", spawnJSON(1, `"kind":"fork","branch":"b","autostart_profile":"Web App",`+okPrompt), nil, "`autostart_profile` must match [a-z0-9][a-z0-9_-]{0,63}"},
		{"services empty starts none", spawnJSON(1, `"kind":"fork","branch":"b","services":[],`+okPrompt), nil, ""},
		{"services at max", spawnJSON(1, `"kind":"fork","branch":"b","services":`+serviceList(MaxServices)+`,`+okPrompt), nil, ""},
		{"services past max", spawnJSON(1, `"kind":"fork","branch":"b","services":`+serviceList(MaxServices+1)+`,`+okPrompt), nil, "`services` has more than 32 names"},
		{"services invalid name", spawnJSON(1, `"kind":"fork","branch":"b","services":["Web"],`+okPrompt), nil, "`services` has an invalid service name (want [a-z0-9][a-z0-9_-]{0,63})"},
		{"agent_only is not a spawn key", spawnJSON(1, `"kind":"fork","branch":"b","agent_only":true,`+okPrompt), nil, "unknown key `agent_only`"},
	})
}

func serviceList(n int) string {
	names := make([]string, n)
	for i := range names {
		names[i] = `"s` + strings.Repeat("x", i) + `"`
	}
	return "[" + strings.Join(names, ",") + "]"
}

func TestDecodeSpawnValues(t *testing.T) {
	m, err := Decode([]byte(spawnJSON(2, `"kind":"fork","branch":"Fix/Issue_12","services":["web","db","web"],"warm_paths":[],
		"rights":{"mounts":["aws","aws"],"loose":true,"egress":[]},`+okPrompt)), nil)
	if err != nil {
		t.Fatal(err)
	}
	s := m.Spawn
	if !reflect.DeepEqual(s.Services, []string{"web", "db"}) {
		t.Errorf("services = %q, want duplicates removed in order", s.Services)
	}
	if s.WarmPaths == nil || len(s.WarmPaths) != 0 {
		t.Errorf("warm_paths [] must stay an empty, non-nil list: %#v", s.WarmPaths)
	}
	if want := (grant.Rights{Mounts: []string{"aws"}, Loose: true}); !reflect.DeepEqual(s.Rights, want) {
		t.Errorf("rights = %+v, want %+v", s.Rights, want)
	}
	if s.Prompt != "do it" || s.PromptFile != "" {
		t.Errorf("prompt = %q/%q", s.Prompt, s.PromptFile)
	}
	m, err = Decode([]byte(spawnJSON(1, `"kind":"fork","branch":"b",`+okPrompt)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if m.Spawn.Services != nil || m.Spawn.WarmPaths != nil {
		t.Errorf("omitted services/warm_paths must be nil")
	}
}

func TestDecodeOtherTypes(t *testing.T) {
	hex := strings.Repeat("0f", 20)
	runDecode(t, []decodeCase{
		// import, stop, destroy
		{"import", `{"version": 1, "id": "import-fix-12", "type": "import", "child": "fix-issue-12"}`, nil, ""},
		{"import child missing", `{"version":1,"id":"i","type":"import"}`, nil, "`child` is required"},
		{"import child invalid", `{"version":1,"id":"i","type":"import","child":"a/b"}`, nil, "`child` must be a child's short name ([a-z0-9][a-z0-9-]{0,62})"},
		{"import unknown key", `{"version":1,"id":"i","type":"import","child":"c","branch":"x"}`, nil, "unknown key `branch`"},
		{"stop", `{"version": 1, "id": "stop-fix-12", "type": "stop", "child": "fix-issue-12"}`, nil, ""},
		{"stop force is unknown", `{"version":1,"id":"s","type":"stop","child":"c","force":true}`, nil, "unknown key `force`"},
		{"destroy", `{"version": 1, "id": "destroy-fix-12", "type": "destroy", "child": "fix-issue-12", "force": false}`, nil, ""},
		{"destroy force not bool", `{"version":1,"id":"d","type":"destroy","child":"c","force":"yes"}`, nil, "`force` must be true or false"},
		// update
		{"update", `{"version": 1, "id": "update-fix-12", "type": "update", "child": "fix-issue-12"}`, nil, ""},
		{"update base", `{"version": 1, "id": "update-release-1", "type": "update", "child": "pool-release", "base": "release/1"}`, nil, ""},
		{"update ref merge", `{"version":1,"id":"u","type":"update","child":"c","ref":"refs/jailbee/from/worker/fix","merge":true}`, nil, ""},
		{"update ref commit", `{"version":1,"id":"u","type":"update","child":"c","ref":"` + hex + `"}`, nil, ""},
		{"update ref and base", `{"version":1,"id":"u","type":"update","child":"c","ref":"refs/heads/x","base":"main"}`, nil, "`ref` and `base` are mutually exclusive"},
		{"update bad ref", `{"version":1,"id":"u","type":"update","child":"c","ref":"heads/x"}`, nil, "`ref` must be a full refs/ name (refs/heads/<name> for a local branch) or a 40-hex commit"},
		{"update bad base", `{"version":1,"id":"u","type":"update","child":"c","base":"-x"}`, nil, "`base` is not a valid branch name"},
		{"update merge not bool", `{"version":1,"id":"u","type":"update","child":"c","merge":1}`, nil, "`merge` must be true or false"},
		// restart
		{"restart prompt_file", `{"version": 1, "id": "restart-fix-12-b", "type": "restart", "child": "fix-issue-12", "prompt_file": "restart-fix-12-b.md"}`, strp("again"), ""},
		{"restart runner null", `{"version": 1, "id": "restart-fix-12-c", "type": "restart", "child": "fix-issue-12", "prompt": "Try again.", "runner": null}`, nil, ""},
		{"restart runner object", `{"version":1,"id":"r","type":"restart","child":"c","prompt":"p","runner":{"agent":"claude","model":"opus"}}`, nil, ""},
		{"restart runner bad", `{"version":1,"id":"r","type":"restart","child":"c","prompt":"p","runner":"claude"}`, nil, "`runner` must be an object"},
		{"restart prompt missing", `{"version":1,"id":"r","type":"restart","child":"c"}`, nil, "`prompt` or `prompt_file` is required"},
		{"restart on_done null", `{"version":1,"id":"r","type":"restart","child":"c","prompt":"p","on_done":null}`, nil, ""},
		{"restart on_done bad", `{"version":1,"id":"r","type":"restart","child":"c","prompt":"p","on_done":"never"}`, nil, "`on_done` must be destroy or keep"},
		{"restart agent_only", `{"version":1,"id":"r","type":"restart","child":"c","prompt":"p","agent_only":true}`, nil, ""},
		{"restart agent_only with profile", `{"version":1,"id":"r","type":"restart","child":"c","prompt":"p","agent_only":true,"autostart_profile":"web"}`, nil, "`autostart_profile` cannot be combined with `agent_only`"},
		{"restart agent_only with services", `{"version":1,"id":"r","type":"restart","child":"c","prompt":"p","agent_only":true,"services":[]}`, nil, "`services` cannot be combined with `agent_only`"},
		{"restart profile without agent_only", `{"version":1,"id":"r","type":"restart","child":"c","prompt":"p","agent_only":false,"autostart_profile":"web","services":["db"]}`, nil, ""},
		// refresh
		{"refresh spec example", `{"version": 1, "id": "refresh-1", "type": "refresh", "child": "c", "services": ["db", "web"], "force": false}`, nil, ""},
		{"refresh at max", `{"version":1,"id":"r","type":"refresh","child":"c","services":` + serviceList(MaxServices) + `}`, nil, ""},
		{"refresh past max", `{"version":1,"id":"r","type":"refresh","child":"c","services":` + serviceList(MaxServices+1) + `}`, nil, "`services` has more than 32 names"},
		{"refresh empty", `{"version":1,"id":"r","type":"refresh","child":"c","services":[]}`, nil, "`services` needs 1 to 32 service names"},
		{"refresh missing services", `{"version":1,"id":"r","type":"refresh","child":"c"}`, nil, "`services` needs 1 to 32 service names"},
		{"refresh invalid name", `{"version":1,"id":"r","type":"refresh","child":"c","services":["db;rm"]}`, nil, "`services` has an invalid service name (want [a-z0-9][a-z0-9_-]{0,63})"},
		{"refresh force", `{"version":1,"id":"r","type":"refresh","child":"c","services":["db"],"force":true}`, nil, ""},
		// publish
		{"publish spec example", `{"version": 1, "id": "publish-1", "type": "publish", "outbox": "issue", "manifest": "close-12.json"}`, nil, ""},
		{"publish pr", `{"version":1,"id":"p","type":"publish","outbox":"pr","manifest":"Fix.v2_a-b.json"}`, nil, ""},
		{"publish bad outbox", `{"version":1,"id":"p","type":"publish","outbox":"mail","manifest":"a.json"}`, nil, "`outbox` must be issue or pr"},
		{"publish path", `{"version":1,"id":"p","type":"publish","outbox":"issue","manifest":"../a.json"}`, nil, "`manifest` must be a file name matching ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\\.json$, never a path or .progress.json"},
		{"publish progress", `{"version":1,"id":"p","type":"publish","outbox":"issue","manifest":"close-12.progress.json"}`, nil, "`manifest` must be a file name matching ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\\.json$, never a path or .progress.json"},
		{"publish not json", `{"version":1,"id":"p","type":"publish","outbox":"issue","manifest":"a.yaml"}`, nil, "`manifest` must be a file name matching ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\\.json$, never a path or .progress.json"},
		{"publish name at max", `{"version":1,"id":"p","type":"publish","outbox":"issue","manifest":"` + strings.Repeat("a", 128) + `.json"}`, nil, ""},
		{"publish name past max", `{"version":1,"id":"p","type":"publish","outbox":"issue","manifest":"` + strings.Repeat("a", 129) + `.json"}`, nil, "`manifest` must be a file name matching ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\\.json$, never a path or .progress.json"},
		{"publish manifest missing", `{"version":1,"id":"p","type":"publish","outbox":"issue"}`, nil, "`manifest` is required"},
	})
}

func TestDecodeRights(t *testing.T) {
	runDecode(t, []decodeCase{
		{"spec example", `{"version": 1, "type": "rights", "id": "rights-1", "child": "fix-12",
 "grant": {"loose": true, "mounts": ["aws"], "egress": ["pypi.org"], "for": "5m"},
 "revoke": {"loose": false, "mounts": [], "egress": ["old.example.com"]}}`, nil, ""},
		{"child revoke example", `{"version": 1, "id": "rights-1", "type": "rights",
 "revoke": {"loose": true, "mounts": ["aws"], "egress": ["pypi.org"]}}`, nil, ""},
		{"grant only, never", `{"version":1,"id":"r","type":"rights","child":"c","grant":{"egress":["*.example.com"],"for":"never"}}`, nil, ""},
		{"grant for 24h", `{"version":1,"id":"r","type":"rights","child":"c","grant":{"loose":true,"for":"24h"}}`, nil, ""},
		{"grant for past 24h", `{"version":1,"id":"r","type":"rights","child":"c","grant":{"loose":true,"for":"24h1s"}}`, nil, "grant.for must be a duration such as 5m, 2h or 1h30m (at most 24h), or never"},
		{"grant for days", `{"version":1,"id":"r","type":"rights","child":"c","grant":{"loose":true,"for":"1d"}}`, nil, "grant.for must be a duration such as 5m, 2h or 1h30m (at most 24h), or never"},
		{"grant for not string", `{"version":1,"id":"r","type":"rights","child":"c","grant":{"loose":true,"for":300}}`, nil, "`grant.for` must be a string"},
		{"no items", `{"version":1,"id":"r","type":"rights","child":"c","revoke":{"loose":false,"mounts":[],"egress":[]}}`, nil, "rights needs at least one item to grant or revoke"},
		{"no blocks", `{"version":1,"id":"r","type":"rights","child":"c"}`, nil, "rights needs at least one item to grant or revoke"},
		{"loose in both", `{"version":1,"id":"r","type":"rights","child":"c","grant":{"loose":true,"for":"5m"},"revoke":{"loose":true}}`, nil, "`loose` cannot be both granted and revoked"},
		{"mount in both", `{"version":1,"id":"r","type":"rights","child":"c","grant":{"mounts":["aws"],"for":"5m"},"revoke":{"mounts":["aws"]}}`, nil, "mount `aws` cannot be both granted and revoked"},
		{"egress in both", `{"version":1,"id":"r","type":"rights","child":"c","grant":{"egress":["pypi.org"],"for":"5m"},"revoke":{"egress":["pypi.org"]}}`, nil, "egress `pypi.org` cannot be both granted and revoked"},
		{"revoke for is unknown", `{"version":1,"id":"r","type":"rights","child":"c","revoke":{"loose":true,"for":"5m"}}`, nil, "unknown key `revoke.for`"},
		{"grant unknown key", `{"version":1,"id":"r","type":"rights","child":"c","grant":{"loose":true,"for":"5m","until":"x"}}`, nil, "unknown key `grant.until`"},
		{"grant null decodes", `{"version":1,"id":"r","type":"rights","grant":null,"revoke":{"loose":true}}`, nil, ""},
		{"grant without for decodes (Validate refuses)", `{"version":1,"id":"r","type":"rights","child":"c","grant":{"loose":true}}`, nil, ""},
		{"mounts at max", `{"version":1,"id":"r","type":"rights","child":"c","revoke":{"mounts":` + serviceList(grant.MaxItems) + `}}`, nil, ""},
		{"mounts past max", `{"version":1,"id":"r","type":"rights","child":"c","revoke":{"mounts":` + serviceList(grant.MaxItems+1) + `}}`, nil, "revoke.mounts has more than 64 items"},
	})
}

func TestDecodeRightsValues(t *testing.T) {
	m, err := Decode([]byte(`{"version":1,"id":"r","type":"rights","child":"c","grant":{"mounts":["aws"],"for":"1h30m"},"revoke":{"egress":["a.b","a.b"]}}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	r := m.Rights
	if r.RevokeOnly() || r.Grant.TTL.Minutes() != 90 || r.Grant.Never || r.Grant.For != "1h30m" {
		t.Errorf("grant = %+v", r.Grant)
	}
	if !reflect.DeepEqual(r.Revoke.Egress, []string{"a.b"}) {
		t.Errorf("revoke egress = %q, want deduplicated", r.Revoke.Egress)
	}
	m, err = Decode([]byte(`{"version":1,"id":"r","type":"rights","grant":null,"revoke":{"loose":true}}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !m.Rights.GrantNull || m.Rights.Grant != nil || !m.Rights.RevokeOnly() {
		t.Errorf("grant null must be recorded: %+v", m.Rights)
	}
}

func TestDecodeRestartRunnerChoice(t *testing.T) {
	tests := []struct {
		field string
		want  RunnerChoice
	}{
		{``, RunnerChoice{}},
		{`,"runner":null`, RunnerChoice{Set: true}},
		{`,"runner":{"agent":"claude"}`, RunnerChoice{Set: true, Runner: &grant.Runner{Agent: "claude"}}},
	}
	for _, tt := range tests {
		m, err := Decode([]byte(`{"version":1,"id":"r","type":"restart","child":"c","prompt":"p"`+tt.field+`}`), nil)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(m.Restart.Runner, tt.want) {
			t.Errorf("%s: runner = %+v, want %+v", tt.field, m.Restart.Runner, tt.want)
		}
	}
}
