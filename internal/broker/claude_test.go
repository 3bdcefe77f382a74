package broker_test

import (
	"context"
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"agentbox/internal/agent"
	"agentbox/internal/broker"
	"agentbox/internal/inbox"
	"agentbox/internal/modelproxy/modeltest"
	"agentbox/internal/testutil/agenttest"
	"agentbox/internal/wire"
)

// claudeConfig makes Claude Code the repository's default agent.
const claudeConfig = `agents:
  claude:
    command: "claude"
    prompt_args: ["{prompt}"]
default_agent: claude
`

// hostKey is the host's API key in these tests: it must reach the
// upstream and nothing in a sandbox.
const hostKey = "sk-ant-api03-host-only-key-never-inside-a-sandbox-0123456789"

// newClaudeEnv is a broker whose sandboxes see the installed Claude Code
// and whose model sockets forward to up with hostKey; the repository's
// default agent is claude.
func newClaudeEnv(t *testing.T, up *modeltest.Server, repoConfig string) *testEnv {
	t.Helper()
	bin := agenttest.Claude(t)
	e := newTestEnvStopped(t)
	e.agentBins = map[string]string{"claude": bin}
	u, err := url.Parse(up.URL)
	if err != nil {
		t.Fatal(err)
	}
	e.model = &broker.ModelConfig{Upstream: u, Key: hostKey}
	e.start()
	dir := filepath.Join(e.repo, ".jailbee")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(repoConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	hostGit(t, e.repo, "add", ".jailbee")
	hostGit(t, e.repo, "commit", "-q", "-m", "claude is the agent")
	return e
}

// TestClaudeChildToDone: the job with the real agent. An orchestrator
// spawns a child whose Claude Code (the pinned binary, offline, its model
// a scripted upstream reached through the child's model socket) writes a
// file, commits it and reports done through its Bash tool; the report
// arrives imported at the child's commit. The host's key reached the
// upstream on every request and is nowhere in the child: not in any
// process's environment or command line, not in its files, not in the
// CLI's own state.
func TestClaudeChildToDone(t *testing.T) {
	const work = `printf 'written by claude\n' > claude-work.txt && git add claude-work.txt && ` +
		`git -c user.name=Claude -c user.email=claude@example.com commit -q -m 'claude: the work' && ` +
		`jailbee inbox send message --kind done --wait --text 'done by claude'`
	up := modeltest.Start(t,
		modeltest.Turn{Text: "I will commit the work and report it.", Input: 1200, Output: 40, CacheRead: 300, CacheCreation: 50,
			Tool: &modeltest.ToolUse{Name: "Bash", Input: map[string]any{"command": work, "description": "Commit and report done"}}},
		modeltest.Turn{Text: "The work is committed and reported.", Input: 1300, Output: 12, Chunk: 8},
	)
	e := newClaudeEnv(t, up, claudeConfig)
	e.orchestrator("lead")
	lead := e.client("lead")
	wantStatus(t, spawn(t, lead, "spawn-c", map[string]any{"branch": "fix/c", "prompt": "Commit the work, then report done.", "on_done": "keep"}),
		"started", "creation of child `fix-c` started")
	done := messageFrom(t, lead, "fix-c", "done")
	if done.Body != "done by claude" || !fullSHA.MatchString(done.ImportedSHA) || done.ImportError != "" {
		t.Fatalf("done report: %+v", done)
	}
	if got := e.mustExec("lead", "git", "show", "-s", "--format=%s", done.ImportedSHA); got != "claude: the work" {
		t.Fatalf("imported commit %q", got)
	}
	if got := e.mustExec("lead", "git", "show", done.ImportedSHA+":claude-work.txt"); got != "written by claude" {
		t.Fatalf("imported file %q", got)
	}

	seen := up.Seen()
	if len(seen) == 0 {
		t.Fatal("the upstream got no request")
	}
	// The CLI's own tools passed the model socket's check for tools the
	// provider would run (docs/agents.md).
	withTools := 0
	for _, s := range seen {
		var req struct {
			Tools []json.RawMessage `json:"tools"`
		}
		if s.Path == "/v1/messages" && json.Unmarshal(s.Body, &req) == nil && len(req.Tools) > 0 {
			withTools++
		}
	}
	if withTools == 0 {
		t.Fatal("no request of the CLI's reached the upstream with its tools")
	}
	for _, s := range seen {
		if got := s.Header.Get("X-Api-Key"); got != hostKey || s.Header.Get("Authorization") != "" {
			t.Fatalf("%s %s reached the upstream with key %q, authorization %q", s.Method, s.Path, got, s.Header.Get("Authorization"))
		}
		if !strings.HasPrefix(s.Header.Get("User-Agent"), "claude-cli/") {
			t.Fatalf("%s %s: user agent %q: not the real CLI?", s.Method, s.Path, s.Header.Get("User-Agent"))
		}
	}

	// The key nowhere in the child; the placeholder, as a control that the
	// search sees what the agent has, in its environment. (The pattern
	// comes on stdin: in an argument, grep's own command line would hold
	// it.)
	search := func(pattern string) string {
		r, err := e.execIn("fix-c", pattern+"\n", "sh", "-c",
			`grep -rlsF -f - /home /tmp /workspace /run/jailbee /etc /proc/[0-9]*/environ /proc/[0-9]*/cmdline; true`)
		if err != nil || r.exit != 0 {
			t.Fatalf("search: %v %+v", err, r)
		}
		return r.stdout
	}
	if out := search(hostKey); out != "" {
		t.Fatalf("the host's key is in the child:\n%s", out)
	}
	if out := search(agent.PlaceholderKey); !strings.Contains(out, "/environ") {
		t.Fatalf("the search did not find the placeholder key in the agent's environment (%q): it cannot see what it looks for", out)
	}
	// Usage: what the upstream reported, counted for the child.
	// (The last answer may still be on its way when done arrives.)
	waitUsageSettles(t, e, "fix-c", up, 2)
	if out := e.mustExec("fix-c", "sh", "-c", `ls "$HOME/.claude/sessions"`); out == "" {
		t.Fatal("the CLI wrote no session file: did it start past its first-run dialogs?")
	}
}

// idleWaited reads the wait an idle report names, in seconds.
var idleWaited = regexp.MustCompile("has been idle for ([0-9hms]+) ")

func waitedOf(t *testing.T, m wire.MessageItem) time.Duration {
	t.Helper()
	sub := idleWaited.FindStringSubmatch(m.Body)
	if sub == nil {
		t.Fatalf("idle report without a wait: %q", m.Body)
	}
	d, err := time.ParseDuration(sub[1])
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// noMessageFrom fails if a message of kind from sandbox from arrives
// within d (reading, and acknowledging, everything else).
func noMessageFrom(t *testing.T, c *inbox.Client, from, kind string, d time.Duration) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		var res wire.ListResult
		if err := c.Call(context.Background(), "list", nil, &res); err != nil {
			t.Fatal(err)
		}
		for _, raw := range res.Items {
			var m wire.MessageItem
			json.Unmarshal(raw, &m)
			c.Call(context.Background(), "ack", map[string]any{"id": m.ID}, nil)
			if m.Type == wire.ItemMessage && m.From == from && m.Kind == kind {
				t.Fatalf("unexpected %s message from %s: %q", kind, from, m.Body)
			}
			toBacklog(c, raw)
		}
	}
}

// TestClaudeIdleReports: the spec's idle passage with the real agent. A
// child whose Claude Code is busy in a long tool call gets no idle
// report; once its turn is over, reports come after idle_after_seconds
// and then at that cadence, answering the spawn, naming the child's last
// accepted message and ending with the pane's tail. A broker restart
// mid-episode carries the episode on; an accepted message starts it over;
// an accepted blocked silences it until the child's next message.
func TestClaudeIdleReports(t *testing.T) {
	const work = `jailbee inbox send message --kind note --text 'starting the long job' && sleep 12 && touch /tmp/slept`
	up := modeltest.Start(t,
		modeltest.Turn{Text: "Running the long job.", Input: 100, Output: 10,
			Tool: &modeltest.ToolUse{Name: "Bash", Input: map[string]any{"command": work, "description": "The long job", "timeout": 60000}}},
		modeltest.Turn{Text: "Finished for now.", Input: 120, Output: 5},
	)
	e := newClaudeEnv(t, up, claudeConfig+"orchestration:\n  idle_after_seconds: 2\n")
	e.orchestrator("lead")
	lead := e.client("lead")
	wantStatus(t, spawn(t, lead, "spawn-i", map[string]any{"branch": "fix/i", "prompt": "Run the long job.", "on_done": "keep"}),
		"started", "creation of child `fix-i` started")

	first := messageFrom(t, lead, "fix-i", "idle")
	// Busy during the tool call: the first report comes after it ended.
	if r, _ := e.execIn("fix-i", "", "test", "-e", "/tmp/slept"); r.exit != 0 {
		t.Fatalf("an idle report came while the agent was busy in its tool call: %q", first.Body)
	}
	if first.InReplyTo == nil || *first.InReplyTo != "spawn-i" || first.OriginID != "" {
		t.Fatalf("idle report answers %v, origin %q", first.InReplyTo, first.OriginID)
	}
	if !strings.HasPrefix(first.Body, "`fix-i` has been idle for ") ||
		!strings.Contains(first.Body, "Its last accepted message: note: starting the long job.") ||
		!strings.Contains(first.Body, "\n\nPane tail:\n") {
		t.Fatalf("idle report body:\n%s", first.Body)
	}
	t.Logf("first idle report:\n%s", first.Body)

	// The cadence, across a broker restart: the episode goes on.
	e.restart()
	lead = e.client("lead")
	second := messageFrom(t, lead, "fix-i", "idle")
	if w1, w2 := waitedOf(t, first), waitedOf(t, second); w2 <= w1 {
		t.Fatalf("after a restart the wait went from %s to %s: the episode did not survive", w1, w2)
	}

	// An accepted message of the child starts the episode over.
	e.mustExec("fix-i", "jailbee", "inbox", "send", "message", "--kind", "note", "--text", "still here\nsecond line")
	var third wire.MessageItem
	for third.Body == "" || !strings.Contains(third.Body, "note: still here.") {
		third = messageFrom(t, lead, "fix-i", "idle")
	}
	if w2, w3 := waitedOf(t, second), waitedOf(t, third); w3 >= w2 {
		t.Fatalf("after a message the wait is %s (before it, %s): not started over", w3, w2)
	}

	// blocked silences the reports until the child's next message.
	e.mustExec("fix-i", "jailbee", "inbox", "send", "message", "--kind", "blocked", "--text", "need a decision")
	messageFrom(t, lead, "fix-i", "blocked")
	noMessageFrom(t, lead, "fix-i", "idle", 15*time.Second)
	e.mustExec("fix-i", "jailbee", "inbox", "send", "message", "--kind", "question", "--text", "which way?")
	fourth := messageFrom(t, lead, "fix-i", "idle")
	if !strings.Contains(fourth.Body, "Its last accepted message: question: which way?.") {
		t.Fatalf("after blocked and a question:\n%s", fourth.Body)
	}
}

// TestClaudeInOrchestrator: an orchestrator's own agent, Claude Code run by
// hand (`jailbee exec lead -- claude ...`), reaches its model through the
// orchestrator's socket with nothing set by the user: the exec carries
// the socket's variables and the home was seeded when the sandbox was
// made; the upstream sees the host's key, and the usage counts for lead.
func TestClaudeInOrchestrator(t *testing.T) {
	up := modeltest.Start(t, modeltest.Turn{Text: "pong from the model", Input: 21, Output: 4})
	e := newClaudeEnv(t, up, claudeConfig)
	e.orchestrator("lead")
	r, err := e.execIn("lead", "", "claude", "-p", "Say pong.")
	if err != nil || r.exit != 0 || strings.TrimSpace(r.stdout) != "pong from the model" {
		t.Fatalf("claude -p in the orchestrator: %v %+v", err, r)
	}
	for _, s := range up.Seen() {
		if s.Header.Get("X-Api-Key") != hostKey {
			t.Fatalf("%s %s without the host's key", s.Method, s.Path)
		}
	}
	waitUsageSettles(t, e, "lead", up, 1)
}

// TestClaudeJBRunnerThroughItsProfile: a claude-jb runner's Claude Code
// reaches its LiteLLM profile's endpoint (broker.yaml model.litellm) on a
// socket of its own, with that endpoint's key and the profile's route for
// the runner's tier as the model; the Anthropic upstream sees nothing. A
// profile the broker does not serve is refused at spawn.
func TestClaudeJBRunnerThroughItsProfile(t *testing.T) {
	const work = `git -c user.name=C -c user.email=c@example.com commit -q --allow-empty -m 'via grok' && ` +
		`jailbee inbox send message --kind done --wait --text 'done through the profile'`
	anthropic := modeltest.Start(t, modeltest.Turn{Text: "wrong upstream"})
	grok := modeltest.Start(t,
		modeltest.Turn{Text: "Reporting.", Input: 10, Output: 3, Tool: &modeltest.ToolUse{Name: "Bash", Input: map[string]any{"command": work, "description": "Report"}}},
		modeltest.Turn{Text: "Done.", Input: 12, Output: 2},
	)
	const grokKey = "sk-litellm-grok-key-only-on-the-host-0123456789"
	const litellmConfig = claudeConfig + `litellm:
  enabled: true
  profiles:
    grok: {tiers: {sonnet: xai/grok-4}}
    other: {tiers: {sonnet: x/y}}
`
	e := newClaudeEnv(t, anthropic, litellmConfig)
	u, err := url.Parse(grok.URL)
	if err != nil {
		t.Fatal(err)
	}
	e.model.LiteLLM = map[string]broker.ModelEndpoint{"grok": {Upstream: u, Key: grokKey}}
	e.restart()
	e.orchestrator("lead")
	lead := e.client("lead")
	wantStatus(t, spawn(t, lead, "spawn-o", map[string]any{"branch": "fix/o", "prompt": "Report.", "runner": map[string]any{"agent": "claude-jb", "profile": "other"}}),
		"refused", "LiteLLM profile `other` is not served (configured: grok, other; run `jailbee litellm up`)")
	wantStatus(t, spawn(t, lead, "spawn-g", map[string]any{"branch": "fix/g", "prompt": "Report.", "on_done": "keep",
		"runner": map[string]any{"agent": "claude-jb", "profile": "grok", "model": "sonnet"}}),
		"started", "creation of child `fix-g` started")
	if done := messageFrom(t, lead, "fix-g", "done"); done.Body != "done through the profile" {
		t.Fatalf("done: %+v", done)
	}
	if n := len(anthropic.Seen()); n != 0 {
		t.Fatalf("the Anthropic upstream got %d requests from a claude-jb runner", n)
	}
	for _, s := range grok.Seen() {
		if s.Header.Get("X-Api-Key") != grokKey {
			t.Fatalf("%s %s reached the profile without its key", s.Method, s.Path)
		}
		if s.Path == "/v1/messages" && !strings.Contains(string(s.Body), `"model":"xai/grok-4"`) {
			t.Fatalf("a request for another model than the profile's route: %.300s", s.Body)
		}
	}
	waitUsageSettles(t, e, "fix-g", grok, 2)
}
