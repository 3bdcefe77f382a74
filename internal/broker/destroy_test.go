package broker_test

// The admin destroy op and its guard against losing a sandbox's work.

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"agentbox/internal/backend/incus/incustest"
	"agentbox/internal/testutil/wait"
	"agentbox/internal/wire"
)

// trace is what a sandbox has on the host, to check it is all gone.
type trace struct {
	name, uuid, sockDir string
	uid                 int
}

func (e *testEnv) trace(name string) trace {
	e.t.Helper()
	info := e.info(name)
	tr := trace{name: name, uuid: info.UUID}
	if e.incusProject == "" {
		// On Incus every container shares one idmap: its processes are
		// told apart by their cgroup instead (sandboxProcesses).
		tr.uid = e.hostUID(name)
	}
	if info.Socket != nil {
		tr.sockDir = filepath.Dir(*info.Socket)
	}
	return tr
}

// assertGone checks that nothing of the sandbox is left: record, ls entry,
// backend instance and directory, socket dir, cgroups, processes.
func (e *testEnv) assertGone(tr trace) {
	e.t.Helper()
	if _, err := e.b.Store().Sandbox(context.Background(), tr.name); err == nil {
		e.t.Errorf("%s: still in broker.db", tr.name)
	}
	for _, sb := range e.list() {
		if sb.Name == tr.name {
			e.t.Errorf("%s: still listed: %+v", tr.name, sb)
		}
	}
	insts, err := e.be.List(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	for _, in := range insts {
		if in.Name == tr.name || in.UUID == tr.uuid {
			e.t.Errorf("%s: still in the backend: %+v", tr.name, in)
		}
	}
	paths := append([]string{filepath.Join(e.state, "sandboxes", tr.name)}, cgroupDirs(e.t, tr.uuid)...)
	if tr.sockDir != "" {
		paths = append(paths, tr.sockDir)
	}
	if e.incusProject != "" {
		paths = append(paths, filepath.Dir(incustest.RootFS(e.incusProject, tr.name)))
	}
	for _, p := range paths {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			e.t.Errorf("%s: %s is left (%v)", tr.name, p, err)
		}
	}
	if tr.uid != 0 || e.incusProject != "" {
		if ps, ok := e.sandboxProcesses(tr.name, tr.uid); ok && len(ps) > 0 {
			e.t.Errorf("%s: its processes are left: %v", tr.name, ps)
		}
	}
	if e.b.SocketPath(tr.name) != "" {
		e.t.Errorf("%s: still served", tr.name)
	}
}

// destroy runs the admin destroy and returns how many were destroyed.
func (e *testEnv) destroy(name string, force bool) (int, error) {
	e.t.Helper()
	var res wire.DestroyResult
	err := e.admin("destroy", wire.DestroyArgs{Name: name, Force: force}, &res)
	return res.Destroyed, err
}

func TestAdminDestroyGuard(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	start := hostGit(t, e.repo, "rev-parse", "HEAD")
	const commit = "git -c user.name=a -c user.email=a@example.com commit -q"

	for _, tc := range []struct {
		name  string
		setup func(e *testEnv, name string) // makes the sandbox's state
		// refusal is the detail of destroy without --force (nil: it destroys).
		refusal func(e *testEnv, name string) string
	}{
		{"clean", func(*testEnv, string) {}, nil},
		{"committed-and-clean", func(e *testEnv, name string) {
			// Work committed, and HEAD back where it was imported: nothing
			// to lose.
			e.mustExec(name, "sh", "-c", "echo x > f && git add f && "+commit+" -m f && git reset -q --hard HEAD~1")
		}, nil},
		{"untracked", func(e *testEnv, name string) { e.mustExec(name, "touch", "new-file") },
			func(e *testEnv, name string) string {
				return "`" + name + "` has uncommitted changes: commit them, or use --force"
			}},
		{"staged", func(e *testEnv, name string) { e.mustExec(name, "sh", "-c", "echo x > f && git add f") },
			func(e *testEnv, name string) string {
				return "`" + name + "` has uncommitted changes: commit them, or use --force"
			}},
		{"committed", func(e *testEnv, name string) { e.mustExec(name, "sh", "-c", commit+" --allow-empty -m work") },
			func(e *testEnv, name string) string {
				head := e.mustExec(name, "git", "rev-parse", "HEAD")
				return "`" + name + "` has commits that were never imported (HEAD " + head[:12] + ", last imported " + start[:12] + "): import them, or fetch them into the host repository with 'jailbee fetch " + name + "', or use --force"
			}},
		{"detached", func(e *testEnv, name string) { e.mustExec(name, "git", "checkout", "-q", "--detach") },
			func(e *testEnv, name string) string {
				return "the HEAD of `" + name + "` is detached, so its work cannot be checked: check out its branch, or use --force"
			}},
		// Stopped by the broker: what it recorded at the stop counts.
		{"stopped-clean", func(e *testEnv, name string) { e.stopByBroker(name) }, nil},
		{"stopped-dirty", func(e *testEnv, name string) {
			e.mustExec(name, "touch", "new-file")
			e.stopByBroker(name)
		}, func(e *testEnv, name string) string {
			return "`" + name + "` has uncommitted changes: commit them, or use --force"
		}},
		{"stopped-commits", func(e *testEnv, name string) {
			e.mustExec(name, "sh", "-c", commit+" --allow-empty -m work")
			e.stopByBroker(name)
		}, func(e *testEnv, name string) string {
			head := e.row(name).StopHead
			return "`" + name + "` has commits that were never imported (HEAD " + head[:12] + ", last imported " + start[:12] + "): import them, or fetch them into the host repository with 'jailbee fetch " + name + "', or use --force"
		}},
		// Stopped behind the broker's back: the round records it stopped,
		// with no HEAD.
		{"stopped-otherwise", func(e *testEnv, name string) { e.stopBehindTheBroker(name) },
			func(e *testEnv, name string) string { return notRecorded(name) }},
		// Stopped by the broker, started, given work, then ended on its
		// own: the first stop's HEAD no longer counts.
		{"stopped-started-ended", func(e *testEnv, name string) {
			e.stopByBroker(name)
			if err := e.admin("start", wire.NameArgs{Name: name}, nil); err != nil {
				e.t.Fatal(err)
			}
			e.mustExec(name, "sh", "-c", commit+" --allow-empty -m work")
			e.stopBehindTheBroker(name)
		}, func(e *testEnv, name string) string { return notRecorded(name) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := e.withT(t)
			name := "c-" + tc.name
			e.child(name, "orch")
			tc.setup(e, name)
			tr := e.trace(name)
			if tc.refusal != nil {
				want := tc.refusal(e, name)
				before := e.info(name)
				n, err := e.destroy(name, false)
				wantWireError(t, "destroy", err, wire.CodeBadRequest, want)
				if n != 0 {
					t.Fatalf("refused destroy reports %d destroyed", n)
				}
				// Nothing was touched: the record, the unit, the socket.
				if after := e.info(name); !reflect.DeepEqual(after, before) {
					t.Fatalf("after the refused destroy: %+v, before %+v", after, before)
				}
				if len(unread(t, e.client(name))) != 0 {
					t.Fatal("unexpected items")
				}
			}
			n, err := e.destroy(name, tc.refusal != nil)
			if err != nil || n != 1 {
				t.Fatalf("destroy (force %v): %d, %v", tc.refusal != nil, n, err)
			}
			e.assertGone(tr)
		})
	}

	_, err := e.destroy("nope", false)
	wantWireError(t, "destroy of a missing sandbox", err, wire.CodeNotFound, "no sandbox named nope")
	_, err = e.destroy("nope", true)
	wantWireError(t, "destroy --force of a missing sandbox", err, wire.CodeNotFound, "no sandbox named nope")
}

func TestAdminDestroyOrchestratorWithChildren(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	e.orchestrator("other")
	e.child("k1", "orch")
	e.child("k2", "orch")
	e.child("k3", "other")
	// A message from the family, to be gone with it.
	sendMessage(t, e.client("k1"), map[string]any{"id": "m-1", "body": "hi"})
	traces := []trace{e.trace("orch"), e.trace("k1"), e.trace("k2")}

	n, err := e.destroy("orch", false)
	wantWireError(t, "destroy of an orchestrator with children", err, wire.CodeBadRequest,
		"`orch` has 2 children: destroy them first, or use --force to destroy them too")
	if n != 0 || len(e.list()) != 5 {
		t.Fatalf("refused destroy: %d destroyed, ls %+v", n, e.list())
	}
	if n, err := e.destroy("orch", true); err != nil || n != 3 {
		t.Fatalf("destroy --force: %d, %v", n, err)
	}
	for _, tr := range traces {
		e.assertGone(tr)
	}
	// The other family is untouched.
	if got := e.list(); len(got) != 2 || got[0].Name != "k3" || got[1].Name != "other" || !got[0].Running || !got[1].Running {
		t.Fatalf("ls after destroying orch: %+v", got)
	}
	sendMessage(t, e.client("other"), map[string]any{"id": "m-2", "to": "k3", "body": "still here"})
	if got := unread(t, e.client("k3")); len(got) != 1 {
		t.Fatalf("k3's inbox: %+v", got)
	}
	// A clean orchestrator without children goes without --force.
	if n, err := e.destroy("k3", false); err != nil || n != 1 {
		t.Fatalf("destroy k3: %d, %v", n, err)
	}
	if n, err := e.destroy("other", false); err != nil || n != 1 {
		t.Fatalf("destroy other: %d, %v", n, err)
	}
	if got := e.list(); len(got) != 0 {
		t.Fatalf("ls at the end: %+v", got)
	}
}

// stopByBroker stops a sandbox through the admin socket.
// stopBehindTheBroker stops name's unit through the backend and waits for
// the broker's round to record it stopped.
func (e *testEnv) stopBehindTheBroker(name string) {
	e.t.Helper()
	if err := e.be.Stop(context.Background(), name); err != nil {
		e.t.Fatal(err)
	}
	wait.For(e.t, "the round records `"+name+"` stopped", func() bool {
		return e.info(name).State == "stopped"
	})
}

func notRecorded(name string) string {
	return "the HEAD of `" + name + "` was not recorded when it stopped (it could not be read, or the sandbox ended without a stop by the broker), so its work cannot be checked: start it again, or use --force"
}

func (e *testEnv) stopByBroker(name string) {
	e.t.Helper()
	if err := e.admin("stop", wire.NameArgs{Name: name}, nil); err != nil {
		e.t.Fatal(err)
	}
}

// TestAdminDestroyQueuedChild: a queued child has no work, so the host
// destroys it without --force, and its orchestrator gets its spawn's (or
// restart's) final failed status naming the destroy, not queued for ever.
// A child stopped on the host frees its slot for the queue.
func TestAdminDestroyQueuedChild(t *testing.T) {
	e := newTestEnv(t)
	e.withAgent()
	e.orchestratorOneSlot("lead")
	lead := e.client("lead")
	spawn(t, lead, "s-1", map[string]any{"branch": "one", "prompt": "stay-busy", "on_done": "keep"})
	wantStatus(t, statusOf(t, lead, "s-1", "done", "failed"), "done", "child `one` is ready")

	wantStatus(t, spawn(t, lead, "s-2", map[string]any{"branch": "two", "prompt": "stay-busy"}), "queued",
		"queued at position 1: 1 of 1 slots are used by `one`")
	if err := e.admin("destroy", wire.DestroyArgs{Name: "two"}, nil); err != nil {
		t.Fatalf("destroy the queued child without --force: %v", err)
	}
	wantStatus(t, statusOf(t, lead, "s-2", "done", "failed"), "failed",
		"creation of child `two` failed: it was destroyed on the host before it started")

	wantStatus(t, spawn(t, lead, "s-3", map[string]any{"branch": "three", "prompt": "stay-busy", "on_done": "keep"}), "queued",
		"queued at position 1: 1 of 1 slots are used by `one`")
	if err := e.admin("stop", wire.NameArgs{Name: "one"}, nil); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, statusOf(t, lead, "s-3", "done", "failed"), "done", "child `three` is ready")

	// The orchestrator's own destroy manifest, without force, likewise.
	spawn(t, lead, "s-4", map[string]any{"branch": "four", "prompt": "stay-busy"})
	wantStatus(t, sendManifest(t, lead, map[string]any{"id": "d-4", "type": "destroy", "child": "four"}), "done", "child `four` destroyed")
	wantStatus(t, statusOf(t, lead, "s-4", "done", "failed"), "failed",
		"creation of child `four` failed: it was destroyed by your destroy `d-4` before it started")

	wantStatus(t, sendManifest(t, lead, restart("r-1", "one", "stay-busy", nil)), "queued",
		"queued at position 1: 1 of 1 slots are used by `three`")
	if err := e.admin("destroy", wire.DestroyArgs{Name: "one"}, nil); err != nil {
		t.Fatalf("destroy the child whose restart is queued (its work imported): %v", err)
	}
	wantStatus(t, statusOf(t, lead, "r-1", "done", "failed"), "failed",
		"restart of child `one` failed: it was destroyed on the host before it started")
	for _, s := range e.list() {
		if s.Name == "one" || s.Name == "two" || s.Name == "four" {
			t.Errorf("destroyed child still listed: %+v", s)
		}
	}
}

// TestAdminDestroyTwiceAtOnce: a destroy removes the sandbox's files
// outside the broker's turn, so a second destroy of the same sandbox can
// run meanwhile and finish first. Both succeed, and nothing is left.
func TestAdminDestroyTwiceAtOnce(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	// Enough files that removing them outlasts the second destroy.
	e.mustExec("orch", "sh", "-c", "mkdir -p \"$HOME/flood\" && cd \"$HOME/flood\" && seq 100000 | xargs touch")
	tr := e.trace("orch")
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := e.destroy("orch", true)
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("destroy: %v", err)
		}
	}
	e.assertGone(tr)
}
