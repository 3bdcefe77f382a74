package broker_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"agentbox/internal/broker"
	"agentbox/internal/modelproxy/modeltest"
	"agentbox/internal/testutil/wait"
	"agentbox/internal/wire"
)

// servicesConfig: the scripted agent, four services (each records its
// start in ~/order, in any order: each runs in a shell of its own), and
// autostart profiles whose steps record theirs.
// dev and full share a setup command: it runs once per sandbox.
const servicesConfig = agentConfig + `services:
  db: {command: "echo db >> $HOME/order; exec sleep 1000"}
  cache: {command: "echo cache >> $HOME/order; exec sleep 1000", depends_on: [db]}
  web: {command: "echo web >> $HOME/order; exec sleep 1000", depends_on: [cache, db]}
  aux: {command: "exec sleep 1000"}
autostart:
  default_profile: dev
  profiles:
    dev:
      services: [web]
      setup: ["echo dev >> $HOME/setup"]
      on_start: ["echo dev >> $HOME/on-start"]
    full:
      setup: ["echo dev >> $HOME/setup", "echo full >> $HOME/setup"]
      on_start: ["echo full >> $HOME/on-start"]
    broken:
      on_start: ["echo broken-output; exit 3"]
`

// refreshGrant is the default grant with the refresh operation.
const refreshGrant = `{"version":1,"max_running_children":4,"operations":["destroy","import","message","refresh","restart","rights","spawn","stop"],"grantable":{"mounts":[],"loose":false,"egress":[]},"default_runner":null,"default_runner_source":null}`

// ps runs the admin ps and returns name: state (pid or code) of each
// service, the selected ones marked with *.
func (e *testEnv) ps(name string) map[string]string {
	e.t.Helper()
	var res wire.PsResult
	if err := e.admin("ps", wire.NameArgs{Name: name}, &res); err != nil {
		e.t.Fatalf("ps %s: %v", name, err)
	}
	got := map[string]string{}
	for _, s := range res.Services {
		v := s.State
		if s.PID > 0 {
			v += fmt.Sprintf(" %d", s.PID)
		}
		if s.ExitCode != nil {
			v += fmt.Sprintf(" code %d", *s.ExitCode)
		}
		if s.Selected {
			v = "*" + v
		}
		got[s.Name] = v
	}
	return got
}

// TestServicesAutostartAndRefresh: a spawn starts its default profile's
// services, dependencies included and first, after the profile's setup
// and before its on_start; refresh restarts only the named services, and
// only for a grant that has it, past the idle gate only with force; a
// restart with another profile runs only the setup the sandbox has not
// run, [] starts no service, and a failing on_start fails the restart,
// naming its phase, its output in the worker log.
func TestServicesAutostartAndRefresh(t *testing.T) {
	e := newTestEnv(t)
	e.withAgentConfig(servicesConfig)
	if err := e.admin("new", wire.NewArgs{Name: "lead", Repo: e.repo, Role: "orchestrator", Grant: []byte(refreshGrant)}, nil); err != nil {
		t.Fatal(err)
	}
	lead := e.client("lead")
	home := func(file string) string { return e.mustExec("svc", "sh", "-c", `cat "$HOME/`+file+`"`) }

	wantStatus(t, spawn(t, lead, "s-0", map[string]any{"branch": "svc", "prompt": "stay-busy", "autostart_profile": "nope"}),
		"refused", "autostart profile `nope` is not defined")
	spawn(t, lead, "s-1", map[string]any{"branch": "svc", "prompt": "stay-busy", "on_done": "keep"})
	wantStatus(t, statusOf(t, lead, "s-1", "done", "failed"), "done", "child `svc` is ready")
	// The order the windows were made in (tmux numbers them so): each
	// service's own shell may then run its first line in any order.
	var order []string
	for _, w := range strings.Fields(e.mustExec("svc", "tmux", "list-windows", "-t", "jailbee", "-F", "#{window_name}")) {
		if w == "db" || w == "cache" || w == "web" {
			order = append(order, w)
		}
	}
	if got := strings.Join(order, " "); got != "db cache web" {
		t.Fatalf("services started in the order %q", got)
	}
	wait.For(t, "each service to run", func() bool {
		got := strings.Fields(e.mustExec("svc", "sh", "-c", `cat "$HOME/order" 2>/dev/null; true`))
		slices.Sort(got)
		return slices.Equal(got, []string{"cache", "db", "web"})
	})
	if setup, onStart := home("setup"), home("on-start"); setup != "dev" || onStart != "dev" {
		t.Fatalf("after the spawn: setup ran %q, on_start %q", setup, onStart)
	}
	before := e.ps("svc")
	for _, s := range []string{"db", "cache", "web"} {
		if !strings.HasPrefix(before[s], "*running ") {
			t.Fatalf("after the spawn, ps: %v", before)
		}
	}
	if before["aux"] != "not started" {
		t.Fatalf("aux, outside the profile, after the spawn: %q", before["aux"])
	}

	// Refresh: its limits, the selection, the idle gate, then force.
	names := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("s%02d", i)
		}
		return out
	}
	refresh := func(id string, services []string, force bool) wire.StatusItem {
		return sendManifest(t, lead, map[string]any{"id": id, "type": "refresh", "child": "svc", "services": services, "force": force})
	}
	wantStatus(t, refresh("f-1", names(33), true), "refused", "`services` has more than 32 names")
	wantStatus(t, refresh("f-2", names(32), true), "refused", "service `s00` is not defined")
	wantStatus(t, refresh("f-3", []string{"aux"}, true), "refused", "service `aux` is not among the services of `svc` (`db`, `cache`, `web`)")
	wantStatus(t, refresh("f-4", []string{"cache"}, false), "refused",
		"`svc` is busy: its agent is at work and has not reported done (refresh with force to restart the services anyway)")
	wantStatus(t, refresh("f-5", []string{"cache"}, true), "done", "services `cache` of child `svc` restarted")
	after := e.ps("svc")
	if after["cache"] == before["cache"] || !strings.HasPrefix(after["cache"], "*running ") || after["db"] != before["db"] || after["web"] != before["web"] {
		t.Fatalf("refresh of cache: ps before %v, after %v", before, after)
	}

	// A grant stored without refresh does not gain it.
	e.orchestrator("old")
	wantStatus(t, sendManifest(t, e.client("old"), map[string]any{"id": "f-6", "type": "refresh", "child": "svc", "services": []string{"db"}}),
		"refused", "operation `refresh` is not in this container's grant")

	stopRestart := func(id, prompt string, fields map[string]any) wire.StatusItem {
		t.Helper()
		wantStatus(t, sendManifest(t, lead, map[string]any{"id": "stop-" + id, "type": "stop", "child": "svc"}), "done", "child `svc` stopped")
		wantStatus(t, sendManifest(t, lead, restart(id, "svc", prompt, fields)), "started", "restart of child `svc` started")
		return statusOf(t, lead, id, "done", "failed")
	}
	// Another profile: only its missing setup runs; all services start.
	// Its agent reports done: the idle gate lets a refresh through.
	if st := stopRestart("r-1", "work", map[string]any{"autostart_profile": "full"}); st.State != "done" {
		t.Fatalf("restart with full: %+v", st)
	}
	messageFrom(t, lead, "svc", "done")
	wantStatus(t, refresh("f-7", []string{"web", "db"}, false), "done", "services `web`, `db` of child `svc` restarted")
	if setup, onStart := home("setup"), home("on-start"); setup != "dev\nfull" || onStart != "dev\nfull" {
		t.Fatalf("after the restart with full: setup ran %q, on_start %q", setup, onStart)
	}
	for s, st := range e.ps("svc") {
		if !strings.HasPrefix(st, "*running ") {
			t.Fatalf("after the restart with full, %s: %q", s, st)
		}
	}
	// []: no service; the profile stays (its on_start runs again).
	wantStatus(t, stopRestart("r-2", "stay-busy", map[string]any{"services": []string{}}), "done", "child `svc` is ready; agent is alive")
	if got := e.ps("svc"); got["db"] != "not started" || got["aux"] != "not started" || got["web"] != "not started" || got["cache"] != "not started" {
		t.Fatalf("after the restart with services []: %v", got)
	}
	if windows := e.mustExec("svc", "tmux", "list-windows", "-t", "jailbee", "-F", "#{window_name}"); windows != "scripted" {
		t.Fatalf("tmux windows after services []: %q", windows)
	}
	if setup, onStart := home("setup"), home("on-start"); setup != "dev\nfull" || onStart != "dev\nfull\nfull" {
		t.Fatalf("after the restart with []: setup ran %q, on_start %q", setup, onStart)
	}
	// A failing on_start fails the restart, naming the phase.
	wantStatus(t, stopRestart("r-3", "stay-busy", map[string]any{"autostart_profile": "broken"}), "failed",
		"restart of child `svc` failed: on_start command 1 exited 3 (its output is in the worker log) during on_start — the child was kept, stopped")
	if log := readFile(t, filepath.Join(e.state, broker.LogDir, "svc.r-3.log")); !strings.Contains(log, "broken-output") {
		t.Fatalf("the worker log lacks the on_start output:\n%s", log)
	}
	if err := e.admin("destroy", wire.DestroyArgs{Name: "lead", Force: true}, nil); err != nil {
		t.Fatal(err)
	}
}

// TestRefreshIdleGateClaude: the idle gate with the real agent. While
// Claude Code is busy in a long tool call, a refresh is refused; once its
// turn is over (the adapter judges it idle), the same refresh passes
// without force.
func TestRefreshIdleGateClaude(t *testing.T) {
	// The tool call lasts until the test lets it end (a fixed sleep could
	// end first on a loaded machine).
	const work = `touch /tmp/working && while [ ! -e /tmp/go ]; do sleep 0.1; done && touch /tmp/slept`
	up := modeltest.Start(t,
		modeltest.Turn{Text: "Running the long job.", Input: 100, Output: 10,
			Tool: &modeltest.ToolUse{Name: "Bash", Input: map[string]any{"command": work, "description": "The long job", "timeout": 60000}}},
		modeltest.Turn{Text: "Finished for now.", Input: 120, Output: 5},
	)
	e := newClaudeEnv(t, up, claudeConfig+"services:\n  db: {command: \"exec sleep 1000\"}\n")
	if err := e.admin("new", wire.NewArgs{Name: "lead", Repo: e.repo, Role: "orchestrator", Grant: []byte(refreshGrant)}, nil); err != nil {
		t.Fatal(err)
	}
	lead := e.client("lead")
	spawn(t, lead, "s-1", map[string]any{"branch": "gate", "prompt": "Run the long job.", "on_done": "keep"})
	wantStatus(t, statusOf(t, lead, "s-1", "done", "failed"), "done", "child `gate` is ready")
	exists := func(path string) bool {
		r, _ := e.execIn("gate", "", "test", "-e", path)
		return r.exit == 0
	}
	wait.For(t, "the tool call to start", func() bool { return exists("/tmp/working") })
	refresh := func(id string) wire.StatusItem {
		return sendManifest(t, lead, map[string]any{"id": id, "type": "refresh", "child": "gate", "services": []string{"db"}})
	}
	wantStatus(t, refresh("f-1"), "refused",
		"`gate` is busy: its agent is at work and has not reported done (refresh with force to restart the services anyway)")
	if exists("/tmp/slept") {
		t.Fatal("the tool call ended before the refresh: the gate was not tested while busy")
	}
	if r, err := e.execIn("gate", "", "touch", "/tmp/go"); err != nil || r.exit != 0 {
		t.Fatalf("letting the tool call end: %v %+v", err, r)
	}
	n := 1
	wait.For(t, "a refresh to pass the idle gate", func() bool {
		n++
		return refresh(fmt.Sprintf("f-%d", n)).State == "done"
	})
	if !exists("/tmp/slept") {
		t.Fatal("a refresh passed the idle gate during the tool call")
	}
	if err := e.admin("destroy", wire.DestroyArgs{Name: "lead", Force: true}, nil); err != nil {
		t.Fatal(err)
	}
}

// TestServiceNamedLikeTheAgentsPrefix: a service whose name begins with
// the agent's (scripted-db beside scripted) is never taken for the agent
// (tmux would match a window name's prefix): an agent that ends before it
// is ready fails the spawn, though the service runs on.
func TestServiceNamedLikeTheAgentsPrefix(t *testing.T) {
	e := newTestEnv(t)
	e.withAgentConfig(agentConfig + "services:\n  scripted-db: {command: \"exec sleep 1000\"}\n")
	e.orchestrator("lead")
	lead := e.client("lead")
	spawn(t, lead, "s-1", map[string]any{"branch": "early", "prompt": "exit-early"})
	wantStatus(t, statusOf(t, lead, "s-1", "done", "failed"), "failed",
		"creation of child `early` failed: the agent ended before it was ready during agent start — the child was kept, stopped")
	if err := e.admin("destroy", wire.DestroyArgs{Name: "lead", Force: true}, nil); err != nil {
		t.Fatal(err)
	}
}
