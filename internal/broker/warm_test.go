package broker_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"agentbox/internal/broker"
)

// TestSpawnForkWarmPaths: a fork gets the orchestrator's git-ignored build
// outputs that its warm_paths (or the repository's fork.warm_paths) match,
// symlinks as symlinks; a glob matching nothing and a fork from another
// commit are skipped with a note in the worker log, never a failure.
func TestSpawnForkWarmPaths(t *testing.T) {
	e := newTestEnv(t)
	e.withAgent()
	cfg := agentConfig + "fork:\n  warm_paths: [\"target\"]\n"
	if err := os.WriteFile(filepath.Join(e.repo, ".jailbee", "config.yaml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.repo, ".gitignore"), []byte("target/\n*.cache\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	hostGit(t, e.repo, "add", ".")
	hostGit(t, e.repo, "commit", "-q", "-m", "ignore build outputs")
	first := hostGit(t, e.repo, "rev-parse", "HEAD~1") // has the agent, not the ignore rules
	e.orchestrator("lead")
	lead := e.client("lead")
	e.mustExec("lead", "sh", "-c", "mkdir -p target/debug && echo built > target/debug/app && ln -s /etc/passwd target/link && echo c > web.cache && echo c > other.cache")

	wantStatus(t, spawn(t, lead, "s-1", map[string]any{"version": 2, "branch": "one", "prompt": "stay-busy", "on_done": "keep",
		"warm_paths": []string{"target", "*.cache", "nothing/here"}}), "started", "creation of child `one` started")
	wantStatus(t, statusOf(t, lead, "s-1", "done", "failed"), "done", "child `one` is ready")
	if got := e.mustExec("one", "sh", "-c", "cat target/debug/app web.cache other.cache; readlink target/link; git status --porcelain"); got != "built\nc\nc\n/etc/passwd" {
		t.Fatalf("the fork's warm paths: %q", got)
	}
	log := readFile(t, filepath.Join(e.state, broker.LogDir, "one.s-1.log"))
	if !strings.Contains(log, "warm paths: `nothing/here` matches no ignored path of the source") || !strings.Contains(log, "warm paths: seeded 3 paths") {
		t.Fatalf("worker log:\n%s", log)
	}

	stop := func(name string) {
		t.Helper()
		wantStatus(t, sendManifest(t, lead, map[string]any{"id": "stop-" + name, "type": "stop", "child": name}), "done", "child `"+name+"` stopped")
	}
	stop("one") // the default grant runs two children at once

	// Without warm_paths: the repository's fork.warm_paths; [] disables it.
	spawn(t, lead, "s-2", map[string]any{"branch": "two", "prompt": "stay-busy", "on_done": "keep"})
	statusOf(t, lead, "s-2", "done", "failed")
	if got := e.mustExec("two", "sh", "-c", "cat target/debug/app; ls *.cache 2>/dev/null | wc -l"); got != "built\n0" {
		t.Fatalf("the default warm paths: %q", got)
	}
	spawn(t, lead, "s-3", map[string]any{"version": 2, "branch": "three", "prompt": "stay-busy", "on_done": "keep", "warm_paths": []string{}})
	statusOf(t, lead, "s-3", "done", "failed")
	if got := e.mustExec("three", "sh", "-c", "test -e target && echo seeded || echo none"); got != "none" {
		t.Fatalf("warm_paths [] seeded: %q", got)
	}
	stop("two")
	stop("three")

	// A fork from another commit than the source's HEAD: skipped.
	wantStatus(t, spawn(t, lead, "s-4", map[string]any{"version": 2, "branch": "four", "ref": first, "prompt": "stay-busy", "on_done": "keep"}),
		"started", "creation of child `four` started")
	wantStatus(t, statusOf(t, lead, "s-4", "done", "failed"), "done", "child `four` is ready")
	if log := readFile(t, filepath.Join(e.state, broker.LogDir, "four.s-4.log")); !strings.Contains(log, "warm paths: skipped: the source is at ") {
		t.Fatalf("worker log of a fork from another commit:\n%s", log)
	}
}
