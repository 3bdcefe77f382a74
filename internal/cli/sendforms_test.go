package cli_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"agentbox/internal/cli"
	"agentbox/internal/inbox"
	"agentbox/internal/manifest"
	"agentbox/internal/wire"
)

// recordingBroker answers every send with a status of the given state and
// records the send's arguments. The client's part of the protocol is what
// is under test: the exact manifest each form builds.
func recordingBroker(t *testing.T, state string) (path string, sent <-chan json.RawMessage) {
	path, sent, _ = recordingBrokerConns(t, state)
	return path, sent
}

// recordingBrokerConns is recordingBroker that also counts the connections
// it accepted.
func recordingBrokerConns(t *testing.T, state string) (path string, sent <-chan json.RawMessage, conns *atomic.Int64) {
	ch := make(chan json.RawMessage, 16)
	conns = new(atomic.Int64)
	path = serveUnix(t, func(c net.Conn, r *bufio.Reader) {
		conns.Add(1)
		line, err := r.ReadBytes('\n')
		if err != nil {
			return
		}
		var req struct {
			Args json.RawMessage `json:"args"`
		}
		json.Unmarshal(line, &req)
		ch <- req.Args
		var args struct {
			Manifest struct {
				ID string `json:"id"`
			} `json:"manifest"`
		}
		json.Unmarshal(req.Args, &args)
		fmt.Fprintf(c, `{"v":1,"ok":true,"result":{"version":1,"id":"h-00000001","type":"status","ref":%q,"state":%q,"detail":"the detail"}}`+"\n", args.Manifest.ID, state)
		io.Copy(io.Discard, r)
	})
	return path, ch, conns
}

func TestSendFormsBuildExactManifests(t *testing.T) {
	sock, sent := recordingBroker(t, "done")
	t.Setenv(inbox.SocketEnv, sock)
	prompt := filepath.Join(shortDir(t), "prompt.md")
	os.WriteFile(prompt, []byte("from a file"), 0o600)
	for _, tc := range []struct {
		name  string
		stdin string
		args  []string
		want  string // args of the send op
	}{
		{"message to child", "", []string{"message", "--id", "reply-0004", "--child", "fix-issue-12", "--kind", "note", "--reply-to", "h-3fa9c012", "--text", "Use the existing parser."},
			`{"manifest":{"body":"Use the existing parser.","id":"reply-0004","in_reply_to":"h-3fa9c012","kind":"note","to":"fix-issue-12","type":"message","version":1}}`},
		{"message to child, the spec's --to", "", []string{"message", "--id", "reply-0004", "--to", "fix-issue-12", "--kind", "note", "--reply-to", "h-3fa9c012", "--text", "Use the existing parser."},
			`{"manifest":{"body":"Use the existing parser.","id":"reply-0004","in_reply_to":"h-3fa9c012","kind":"note","to":"fix-issue-12","type":"message","version":1}}`},
		{"message from stdin", "Fixed.\n", []string{"message", "--id", "msg-0003", "--kind", "done"},
			`{"body":"Fixed.\n","manifest":{"body_file":"msg-0003.md","id":"msg-0003","in_reply_to":null,"kind":"done","type":"message","version":1}}`},
		{"spawn fork", "", []string{"spawn", "--id", "spawn-fix-12", "--branch", "fix/issue-12", "--note", "GitHub #12", "--text", "Fix it."},
			`{"manifest":{"branch":"fix/issue-12","id":"spawn-fix-12","kind":"fork","note":"GitHub #12","prompt":"Fix it.","rights":{"mounts":[],"loose":false,"egress":[]},"type":"spawn","version":1}}`},
		{"spawn new with rights and runner", "", []string{"spawn", "--id", "spawn-docs-1", "--new", "--base", "main", "--branch", "docs/intro", "--mount", "aws", "--loose", "--egress", "pypi.org", "--on-done", "keep", "--agent", "claude-jb", "--profile", "grok", "--model", "sonnet", "--autostart-profile", "light", "--services", "web,db", "--text", "Write."},
			`{"manifest":{"autostart_profile":"light","base":"main","branch":"docs/intro","id":"spawn-docs-1","kind":"new","on_done":"keep","prompt":"Write.","rights":{"mounts":["aws"],"loose":true,"egress":["pypi.org"]},"runner":{"agent":"claude-jb","profile":"grok","model":"sonnet"},"services":["web","db"],"type":"spawn","version":1}}`},
		{"spawn ref is version 2", "", []string{"spawn", "--id", "s-2", "--branch", "b", "--ref", "refs/heads/x", "--warm", "build/**", "--text", "p"},
			`{"manifest":{"branch":"b","id":"s-2","kind":"fork","prompt":"p","ref":"refs/heads/x","rights":{"mounts":[],"loose":false,"egress":[]},"type":"spawn","version":2,"warm_paths":["build/**"]}}`},
		{"spawn pr, prompt from file", "", []string{"spawn", "--id", "s-3", "--pr", "7", "--services", "", "--file", prompt},
			`{"body":"from a file","manifest":{"id":"s-3","kind":"pr","pr":7,"prompt_file":"s-3.md","rights":{"mounts":[],"loose":false,"egress":[]},"services":[],"type":"spawn","version":2}}`},
		{"spawn no-warm", "go\n", []string{"spawn", "--id", "s-4", "--branch", "b", "--no-warm"},
			`{"body":"go\n","manifest":{"branch":"b","id":"s-4","kind":"fork","prompt_file":"s-4.md","rights":{"mounts":[],"loose":false,"egress":[]},"type":"spawn","version":2,"warm_paths":[]}}`},
		{"import", "", []string{"import", "--id", "import-fix-12", "--child", "fix-issue-12"},
			`{"manifest":{"child":"fix-issue-12","id":"import-fix-12","type":"import","version":1}}`},
		{"update base merge", "", []string{"update", "--id", "update-release-1", "--child", "pool-release", "--base", "release/1", "--merge"},
			`{"manifest":{"base":"release/1","child":"pool-release","id":"update-release-1","merge":true,"type":"update","version":1}}`},
		{"restart default runner", "", []string{"restart", "--id", "restart-fix-12-c", "--child", "fix-issue-12", "--default-runner", "--text", "Try again."},
			`{"manifest":{"child":"fix-issue-12","id":"restart-fix-12-c","prompt":"Try again.","runner":null,"type":"restart","version":1}}`},
		{"restart agent-only with runner", "again\n", []string{"restart", "--id", "r-2", "--child", "c", "--agent-only", "--agent", "claude", "--model", "opus[1m]", "--on-done", "destroy"},
			`{"body":"again\n","manifest":{"agent_only":true,"child":"c","id":"r-2","on_done":"destroy","prompt_file":"r-2.md","runner":{"agent":"claude","model":"opus[1m]"},"type":"restart","version":1}}`},
		{"refresh", "", []string{"refresh", "--id", "refresh-1", "--child", "c", "--services", "db,web", "--force"},
			`{"manifest":{"child":"c","force":true,"id":"refresh-1","services":["db","web"],"type":"refresh","version":1}}`},
		{"stop", "", []string{"stop", "--id", "stop-fix-12", "--child", "fix-issue-12"},
			`{"manifest":{"child":"fix-issue-12","id":"stop-fix-12","type":"stop","version":1}}`},
		{"destroy", "", []string{"destroy", "--id", "destroy-fix-12", "--child", "fix-issue-12", "--force"},
			`{"manifest":{"child":"fix-issue-12","force":true,"id":"destroy-fix-12","type":"destroy","version":1}}`},
		{"rights grant and revoke", "", []string{"rights", "--id", "rights-1", "--child", "fix-12", "--loose", "--mount", "aws", "--egress", "pypi.org", "--for", "5m", "--revoke-egress", "old.example.com"},
			`{"manifest":{"child":"fix-12","grant":{"egress":["pypi.org"],"for":"5m","loose":true,"mounts":["aws"]},"id":"rights-1","revoke":{"mounts":[],"loose":false,"egress":["old.example.com"]},"type":"rights","version":1}}`},
		{"rights child revoke", "", []string{"rights", "--id", "rights-2", "--revoke-loose", "--revoke-mount", "aws", "--revoke-egress", "pypi.org"},
			`{"manifest":{"id":"rights-2","revoke":{"mounts":["aws"],"loose":true,"egress":["pypi.org"]},"type":"rights","version":1}}`},
		{"publish issue", "", []string{"publish", "--id", "publish-1", "--issue", "close-12.json"},
			`{"manifest":{"id":"publish-1","manifest":"close-12.json","outbox":"issue","type":"publish","version":1}}`},
		{"publish pr", "", []string{"publish", "--id", "publish-2", "--pr", "fix.json"},
			`{"manifest":{"id":"publish-2","manifest":"fix.json","outbox":"pr","type":"publish","version":1}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := run(t, tc.stdin, append([]string{"inbox", "send"}, tc.args...)...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			got := <-sent
			if string(got) != tc.want {
				t.Errorf("sent\n %s\nwant\n %s", got, tc.want)
			}
			var m struct {
				Manifest struct{ ID string } `json:"manifest"`
			}
			json.Unmarshal(got, &m)
			if stdout != m.Manifest.ID+"\n" {
				t.Errorf("stdout %q, want only the id", stdout)
			}
		})
	}
}

func TestSendFormsGenerateIDsAndExitOnStates(t *testing.T) {
	for state, want := range map[string]int{"done": 0, "started": 0, "failed": cli.ExitFailed, "refused": cli.ExitFailed} {
		sock, sent := recordingBroker(t, state)
		t.Setenv(inbox.SocketEnv, sock)
		code, stdout, _ := run(t, "", "inbox", "send", "stop", "--child", "c", "--wait")
		<-sent
		if code != want {
			t.Errorf("state %s: exit %d, want %d", state, code, want)
		}
		if len(stdout) < len("stop-00000000\n") || stdout[:5] != "stop-" {
			t.Errorf("state %s: stdout %q does not start with a generated id", state, stdout)
		}
	}
}

func TestSendFormsUsageErrors(t *testing.T) {
	sock, _ := recordingBroker(t, "done")
	t.Setenv(inbox.SocketEnv, sock)
	inRepo := filepath.Join(t.TempDir(), "repo")
	os.MkdirAll(filepath.Join(inRepo, ".git"), 0o755)
	os.WriteFile(filepath.Join(inRepo, "p.md"), []byte("x"), 0o644)
	wd, _ := os.Getwd()
	os.Chdir(inRepo)
	defer os.Chdir(wd)
	for _, args := range [][]string{
		{"spawn", "--new", "--ref", "refs/heads/x", "--text", "p"},
		{"spawn", "--new", "--pr", "3", "--text", "p"},
		{"spawn", "--warm", "a", "--no-warm", "--text", "p"},
		{"spawn", "--new", "--warm", "a", "--text", "p"},
		{"spawn", "--pr", "2", "--no-warm", "--text", "p"},
		{"spawn", "--base", "main", "--text", "p"},
		{"spawn", "--profile", "p", "--text", "p"},
		{"spawn", "--model", "opus", "--text", "p"},
		{"spawn", "--agent", "claude", "--profile", "grok", "--text", "p"},
		{"spawn", "--file", "relative.md"},
		{"spawn", "--file", filepath.Join(inRepo, "p.md")},
		{"spawn", "--text", "p", "--file", "/etc/hostname"},
		{"restart", "--text", "p"},
		{"restart", "--child", "c", "--agent", "claude", "--default-runner", "--text", "p"},
		{"update", "--child", "c", "--ref", "refs/heads/x", "--base", "main"},
		{"refresh", "--child", "c"},
		{"import"},
		{"stop"},
		{"destroy"},
		{"rights", "--child", "c"},
		{"publish"},
		{"publish", "--issue", "a.json", "--pr", "b.json"},
		{"bogus"},
	} {
		if code, _, stderr := run(t, "", append([]string{"inbox", "send"}, args...)...); code != cli.ExitUsage {
			t.Errorf("%v: exit %d (%s), want 2", args, code, stderr)
		}
	}
}

func TestRunnersListsWhatTheRepoAccepts(t *testing.T) {
	b := realBroker(t)
	t.Setenv(inbox.SocketEnv, b.SocketPath("orch"))
	repo := t.TempDir()
	os.MkdirAll(filepath.Join(repo, ".git"), 0o755)
	os.MkdirAll(filepath.Join(repo, ".jailbee"), 0o755)
	os.WriteFile(filepath.Join(repo, ".jailbee", "config.yaml"), []byte(`
agents:
  claude:
    command: "claude --dangerously-skip-permissions"
    prompt_args: ["-p", "{prompt}"]
default_agent: claude
litellm:
  enabled: true
  profiles:
    grok:
      tiers: {sonnet: "xai/grok-4", haiku: "xai/grok-mini"}
`), 0o644)
	wd, _ := os.Getwd()
	os.Chdir(repo)
	defer os.Chdir(wd)
	code, stdout, stderr := run(t, "", "inbox", "runners")
	want := "default: omit runner (claude)\nclaude: fable, opus, sonnet, haiku\nclaude-jb -P grok: sonnet, haiku\n"
	if code != 0 || stdout != want {
		t.Fatalf("runners: exit %d\n%s%s\nwant\n%s", code, stdout, stderr, want)
	}
	// Without a config: no runners, default unknown.
	os.Remove(filepath.Join(repo, ".jailbee", "config.yaml"))
	if code, stdout, _ := run(t, "", "inbox", "runners"); code != 0 || stdout != "default: omit runner (unknown)\n" {
		t.Fatalf("runners without config: %d %q", code, stdout)
	}
}

// TestSendTextLimitSameForEverySource: every text source of every form
// that carries text is held to manifest.MaxTextBytes, inclusive, counted
// in bytes: at the limit the text reaches the broker byte for byte and
// passes the manifest's own validation; one byte past it, or not UTF-8,
// exits 2 with the same message before any id is printed or any
// connection is made.
func TestSendTextLimitSameForEverySource(t *testing.T) {
	sock, sent, conns := recordingBrokerConns(t, "done")
	t.Setenv(inbox.SocketEnv, sock)
	dir := shortDir(t)

	// 4 bytes, 3 runes: the limit counts bytes; "<" and \x01 are escaped
	// in JSON (up to 6 bytes each), so the request grows but still fits a
	// protocol line.
	const unit = "\u00e9<\x01"
	atLimit := strings.Repeat(unit, manifest.MaxTextBytes/len(unit))
	if len(atLimit) != manifest.MaxTextBytes {
		t.Fatalf("test text is %d bytes", len(atLimit))
	}
	texts := []struct {
		name string
		text string
		want string // stderr after "jailbee: WHAT from SOURCE "; "" = accepted
	}{
		{"at the limit", atLimit, ""},
		{"one byte past", atLimit + "a", "is 65537 bytes; at most 65536"},
		{"far past", strings.Repeat("a", 70000), "is 70000 bytes; at most 65536"},
		{"not UTF-8", "\xff" + atLimit[1:], "is not valid UTF-8"},
	}
	forms := []struct {
		name, what string
		args       []string // the form's other arguments
		sources    []string
	}{
		{"message", "message text", []string{"message", "--to", "kid"}, []string{"--text", "stdin"}},
		{"spawn", "prompt", []string{"spawn", "--branch", "b"}, []string{"--text", "stdin", "--file"}},
		{"restart", "prompt", []string{"restart", "--child", "c"}, []string{"--text", "stdin"}},
	}
	n := 0
	for _, form := range forms {
		for _, source := range form.sources {
			for _, tc := range texts {
				n++
				id := fmt.Sprintf("limit-%d", n)
				t.Run(form.name+"/"+source+"/"+tc.name, func(t *testing.T) {
					args := append([]string{"inbox", "send"}, form.args...)
					args = append(args, "--id", id)
					stdin := ""
					switch source {
					case "--text":
						args = append(args, "--text", tc.text)
					case "--file":
						file := filepath.Join(dir, id+".md")
						if err := os.WriteFile(file, []byte(tc.text), 0o600); err != nil {
							t.Fatal(err)
						}
						args = append(args, "--file", file)
					default:
						stdin = tc.text
					}
					before := conns.Load()
					code, stdout, stderr := run(t, stdin, args...)
					if tc.want != "" {
						want := "jailbee: " + form.what + " from " + source + " " + tc.want + "\n"
						if code != cli.ExitUsage || stdout != "" || stderr != want {
							t.Errorf("exit %d stdout %q stderr %q, want exit 2, no stdout, stderr %q", code, stdout, stderr, want)
						}
						select {
						case got := <-sent:
							t.Errorf("a request reached the broker: %.200s", got)
						default:
						}
						if c := conns.Load() - before; c != 0 {
							t.Errorf("%d connections to the broker, want none", c)
						}
						return
					}
					if code != 0 || stdout != id+"\n" || stderr != "" {
						t.Fatalf("exit %d stdout %q stderr %q, want exit 0 and the id", code, stdout, stderr)
					}
					got := <-sent
					if len(got) >= wire.MaxLineBytes {
						t.Errorf("the send's args are %d bytes: no longer one protocol line", len(got))
					}
					var req struct {
						Manifest json.RawMessage `json:"manifest"`
						Body     *string         `json:"body"`
					}
					if err := json.Unmarshal(got, &req); err != nil {
						t.Fatal(err)
					}
					if (req.Body != nil) != (source != "--text") {
						t.Errorf("body present %v, want the text inline only for --text", req.Body != nil)
					}
					m, err := manifest.Decode(req.Manifest, req.Body)
					if err != nil {
						t.Fatalf("the broker's manifest validation refuses what the client sent: %v", err)
					}
					var text string
					switch {
					case m.Message != nil:
						text = m.Message.Body
					case m.Spawn != nil:
						text = m.Spawn.Prompt
					case m.Restart != nil:
						text = m.Restart.Prompt
					}
					if text != tc.text {
						t.Errorf("the broker got %d bytes of text, not the %d bytes given", len(text), len(tc.text))
					}
				})
			}
		}
	}
}

// TestSendTextPastCountedBound: a stdin too long to be worth counting is
// reported as "more than" the bound, still exit 2 before any connection.
func TestSendTextPastCountedBound(t *testing.T) {
	sock, sent, conns := recordingBrokerConns(t, "done")
	t.Setenv(inbox.SocketEnv, sock)
	code, stdout, stderr := run(t, strings.Repeat("a", 64<<20+1), "inbox", "send", "message", "--to", "kid")
	want := "jailbee: message text from stdin is more than 67108864 bytes; at most 65536\n"
	if code != cli.ExitUsage || stdout != "" || stderr != want {
		t.Errorf("exit %d stdout %q stderr %q, want exit 2, no stdout, stderr %q", code, stdout, stderr, want)
	}
	if len(sent) != 0 || conns.Load() != 0 {
		t.Errorf("the broker was contacted")
	}
}
