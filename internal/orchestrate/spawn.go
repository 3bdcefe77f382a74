package orchestrate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"agentbox/internal/agent"
	"agentbox/internal/backend"
	"agentbox/internal/gitx"
	"agentbox/internal/grant"
	"agentbox/internal/manifest"
	"agentbox/internal/secfs"
	"agentbox/internal/serial"
	"agentbox/internal/shortname"
	"agentbox/internal/store"
	"agentbox/internal/untrusted"
	"agentbox/internal/wire"
)

// Bounds of a spawn.
const (
	// agentStartTimeout: a child whose agent is not seen alive this long
	// after setup failed.
	agentStartTimeout = 120 * time.Second
	// readyGap is the least time between the two observations of one agent
	// identity that make a child ready.
	readyGap = 2 * time.Second
	// observeInterval paces the observations of a starting agent.
	observeInterval = 500 * time.Millisecond
	// agentCheckTimeout bounds one observation (two commands in the
	// sandbox), and each command that starts or ends an agent.
	agentCheckTimeout = 30 * time.Second
)

// PRRemote is the host repository's remote a kind pr spawn fetches
// refs/pull/<N>/head from.
const PRRemote = "origin"

// Phases a spawn's worker records before it takes them; a failure (or a
// broker that died) names the phase.
const (
	PhaseCreating = "creating"    // the sandbox: its record, unit and socket
	PhaseCloning  = "cloning"     // its checkout
	PhaseAgent    = "agent start" // its agent's start and readiness
)

// spawnDoc is what a spawned child keeps of its spawn (store.Sandbox.SpawnDoc).
type spawnDoc struct {
	Ref    string `json:"ref"` // the spawn manifest's id: its statuses' ref
	Kind   string `json:"kind"`
	Commit string `json:"commit"`       // the commit it starts from
	Source string `json:"source"`       // "orchestrator" (fork), "host" (new) or "pr"
	PR     int    `json:"pr,omitempty"` // kind pr: the pull request, fetched by the worker
	// WarmPaths: a fork's globs of ignored build outputs to seed.
	WarmPaths []string     `json:"warm_paths,omitempty"`
	Prompt    string       `json:"prompt"`         // passed to the agent
	Note      string       `json:"note,omitempty"` // the spawn's note
	OnDone    string       `json:"on_done"`        // destroy or keep
	Rights    grant.Rights `json:"rights"`
	Agent     agent.Spec   `json:"agent"`
	// Restart: Ref is a restart of the existing child (its sandbox is
	// started, not made); AgentOnly: only its agent is replaced.
	Restart   bool `json:"restart,omitempty"`
	AgentOnly bool `json:"agent_only,omitempty"`
	// sessionUp: services started, so the tmux session may exist.
	sessionUp bool
}

// what names the work of the spawn or restart in its statuses.
func (d spawnDoc) what() string {
	if d.Restart {
		return "restart"
	}
	return "creation"
}

// agentSeen is a child's agent as last seen (store.Sandbox.Agent).
type agentSeen struct {
	Window   string         `json:"window"`
	Identity agent.Identity `json:"identity"`
	// Ended: the watch saw it end (and told the orchestrator).
	Ended bool `json:"ended,omitempty"`
	// Idle is the state of its idle reports (idle.go).
	Idle idleEpisode `json:"idle,omitzero"`
}

// Spawn runs a spawn manifest (kinds fork and new): it refuses what it
// cannot run, journals the child (queued when the orchestrator's running
// children fill its grant's max_running_children, else created by a
// worker), and answers queued or started; the worker appends done (the
// agent is ready) or failed.
func (o *Orchestrator) Spawn(ctx context.Context, req wire.Caller, m *manifest.Manifest, from manifest.Sender) (store.Sent, error) {
	return o.admitted(ctx, req, m, func() (string, string, string, error) {
		return o.admitSpawn(ctx, req, m, from)
	})
}

// admitSpawn checks a spawn and records its child, queued or creating.
func (o *Orchestrator) admitSpawn(ctx context.Context, req wire.Caller, m *manifest.Manifest, from manifest.Sender) (state, detail, name string, err error) {
	s := m.Spawn
	branch := s.Branch
	if branch == "" && s.Kind == manifest.KindPR {
		branch = fmt.Sprintf("pr/%d", s.PR)
	}
	name = shortname.FromBranch(branch)
	if _, err := o.Store.Sandbox(ctx, name); err == nil {
		return "", "", "", refusef("`%s` already exists", name)
	}
	orch, err := o.Store.Sandbox(ctx, req.Sandbox)
	if err != nil {
		return "", "", "", err
	}
	if err := o.oneChildPerBranch(ctx, orch.Name, branch); err != nil {
		return "", "", "", err
	}
	effective := from.Grant.Capped(from.Repo.Orchestration.Cap)
	spec, err := agent.Resolve(s.Runner, effective, from.Repo)
	if err != nil {
		return "", "", "", refusef("%v", err)
	}
	doc := spawnDoc{Ref: m.ID, Kind: s.Kind, PR: s.PR, Prompt: s.Prompt, Note: s.Note, OnDone: s.EffectiveOnDone(effective), Rights: s.Rights, Agent: spec}
	sel := spawnStartup(s, from.Repo)
	if doc.Commit, doc.Source, err = o.spawnSource(ctx, orch, s); err != nil {
		return "", "", "", err
	}
	if s.Kind == manifest.KindFork {
		doc.WarmPaths = s.WarmPaths // [] disables the default
		if s.WarmPaths == nil {
			doc.WarmPaths = from.Repo.Fork.WarmPaths
		}
	}
	raw, err := json.Marshal(doc)
	if err != nil {
		return "", "", "", err
	}
	row := store.Sandbox{Name: name, UUID: "pending-" + orch.UUID + "-" + m.ID, Role: wire.RoleChild, Parent: orch.Name,
		Branch: branch, Repo: orch.Repo, State: store.StateCreating, Phase: PhaseCreating, Imported: doc.Commit, SpawnDoc: string(raw),
		Startup: sel.String()}
	o.queueMu.Lock() // the count and the record are one step (startQueued)
	defer o.queueMu.Unlock()
	ctx = serial.Pin(ctx) // the turn stays while the mutex is held
	kids, err := o.children(ctx, orch.Name)
	if err != nil {
		return "", "", "", err
	}
	active, queued := kids.active, kids.queued
	max := effective.MaxRunningChildren
	wait := len(active) >= max || queued > 0
	if err := o.Caps.admit(kids, wait); err != nil {
		return "", "", "", err
	}
	now := time.Now()
	if o.now != nil {
		now = o.now()
	}
	if err := o.spawns.check(orch.Name, now, o.Caps.withDefaults().MaxSpawnsPerHour); err != nil {
		return "", "", "", err
	}
	if wait {
		row.State, row.Phase, row.QueuedSeq = store.StateQueued, "", time.Now().UnixNano()
		if err := o.Store.CreateSandbox(ctx, row); err != nil {
			return "", "", "", err
		}
		o.spawns.add(orch.Name, now)
		return wire.StateQueued, queuedDetail(queued+1, active, max), name, nil
	}
	if err := o.Store.CreateSandbox(ctx, row); err != nil {
		return "", "", "", err
	}
	o.spawns.add(orch.Name, now)
	return wire.StateStarted, fmt.Sprintf("creation of child `%s` started", name), name, nil
}

// spawnSource is the commit a child starts from: for a fork, the
// orchestrator's committed HEAD (or its ref), read inside the
// orchestrator, whose work tree must be clean; for new, base (default: the
// repository's current branch) of the host repository.
func (o *Orchestrator) spawnSource(ctx context.Context, orch store.Sandbox, s *manifest.Spawn) (commit, source string, err error) {
	if s.Kind == manifest.KindPR {
		return "", "pr", nil // the worker fetches it: the network is slow
	}
	if s.Kind == manifest.KindNew {
		base := s.Base
		if base == "" {
			if base, err = gitx.CurrentBranch(ctx, orch.Repo); err != nil {
				return "", "", refusef("the host repository has no current branch: name a base")
			}
		}
		commit, err := hostBase(ctx, orch.Repo, base)
		return commit, "host", err
	}
	work, err := o.readWork(ctx, orch.Name)
	if err != nil {
		return "", "", refusef("cannot read your repository: %v", errors.Unwrap(err))
	}
	if work.dirty {
		return "", "", refusef("uncommitted changes: a fork starts from your committed HEAD; commit or remove them (prompt files too) before spawning")
	}
	if s.Ref == "" {
		return work.head, "orchestrator", nil
	}
	commit, err = gitx.RevParse(ctx, o.checkout(orch.Name), s.Ref)
	if err != nil {
		return "", "", refusef("`ref` %s names no commit in your repository", s.Ref)
	}
	return commit, "orchestrator", nil
}

// hostBase resolves base, a local branch of the host repository, to its
// commit.
func hostBase(ctx context.Context, repo, base string) (string, error) {
	commit, err := gitx.ResolveCommit(ctx, repo, "refs/heads/"+base)
	if err != nil {
		return "", refusef("base `%s` is not a branch of the host repository", base)
	}
	return commit, nil
}

// slots names an orchestrator's children that take a running slot
// (created and not stopped, or being created), by name, and counts those
// queued.
func (o *Orchestrator) slots(ctx context.Context, orch string) (active []string, queued int, err error) {
	kids, err := o.children(ctx, orch)
	return kids.active, kids.queued, err
}

// childCounts is an orchestrator's children: those that take a running
// slot, those queued for one, and how many are in each state.
type childCounts struct {
	active  []string
	queued  int
	total   int
	byState map[string]int
}

// children counts an orchestrator's children (see childCounts).
func (o *Orchestrator) children(ctx context.Context, orch string) (childCounts, error) {
	all, err := o.Store.Children(ctx, orch)
	if err != nil {
		return childCounts{}, err
	}
	kids := childCounts{byState: map[string]int{}}
	for _, c := range all {
		kids.total++
		kids.byState[c.State]++
		switch {
		case waitsForSlot(c):
			kids.queued++
		case c.State == store.StateCreating, c.State == store.StateRunning, c.State == store.StateReady:
			kids.active = append(kids.active, c.Name)
		}
	}
	return kids, nil
}

// maxHoldersNamed bounds the children a queued status names.
const maxHoldersNamed = 8

// queuedDetail is the detail of a queued spawn or restart: its place in
// the queue, and why it waits: the slots and the children that hold them
// (stopping or destroying one frees its slot).
func queuedDetail(pos int, holders []string, max int) string {
	d := fmt.Sprintf("queued at position %d: %d of %d slots are used", pos, len(holders), max)
	if len(holders) == 0 {
		return d
	}
	return d + " by " + namedList(holders)
}

// startWorker runs a child's creation in the background.
func (o *Orchestrator) startWorker(name string) {
	if o.Go == nil {
		return
	}
	o.Go(func(ctx context.Context) { o.createChild(ctx, name) })
}

// createChild is a spawn's worker: the sandbox, its checkout, its agent,
// then the agent's readiness; each phase recorded before it is taken. It
// reports done or failed to the orchestrator, then starts the next queued
// spawn of that orchestrator.
func (o *Orchestrator) createChild(ctx context.Context, name string) {
	sb, err := o.Store.Sandbox(ctx, name)
	if err != nil {
		return
	}
	var doc spawnDoc
	if err := json.Unmarshal([]byte(sb.SpawnDoc), &doc); err != nil {
		return
	}
	log := o.workerLog(sb, doc)
	defer log.Close()
	defer o.startQueued(context.WithoutCancel(ctx), sb.Parent)
	if doc.Restart {
		o.rerunChild(ctx, sb, doc, log)
		return
	}
	fmt.Fprintf(log, "%s spawn %s of child %s (%s from %s at %s)\n", stamp(), doc.Ref, name, doc.Kind, doc.Source, doc.Commit)

	phase := PhaseCreating
	fail := func(reason string, keep bool) {
		fmt.Fprintf(log, "%s failed during %s: %s\n", stamp(), phase, reason)
		o.failChild(context.WithoutCancel(ctx), sb, doc, phase, reason, keep)
	}
	if err := o.spawnRightsFit(ctx, sb, doc.Rights); err != nil {
		fmt.Fprintf(log, "%s error: %v\n", stamp(), err)
		fail(stepReason(err), false) // no sandbox yet: nothing was granted
		return
	}
	if err := o.buildChild(ctx, &sb, doc, log, &phase); err != nil {
		fmt.Fprintf(log, "%s error: %v\n", stamp(), err)
		fail("see the worker log", false)
		return
	}
	if doc.sessionUp, err = o.runStartup(ctx, sb, log, &phase); err != nil {
		fmt.Fprintf(log, "%s error: %v\n", stamp(), err)
		fail(stepReason(err), true) // kept: the orchestrator may look at it
		return
	}
	phase = PhaseAgent
	if err := o.Store.SetPhase(ctx, name, phase); err != nil {
		fail("its record could not be written", true)
		return
	}
	o.runAgent(ctx, sb, doc, log, func(reason string) { fail(reason, true) })
}

// runAgent starts a child's agent and waits for its readiness, then
// records it ready, appends done to the orchestrator's manifest and
// watches the agent; fail reports why not.
func (o *Orchestrator) runAgent(ctx context.Context, sb store.Sandbox, doc spawnDoc, log io.Writer, fail func(reason string)) {
	name := sb.Name
	seen, err := o.startAgent(ctx, name, doc, log)
	if err != nil {
		fmt.Fprintf(log, "%s agent: %v\n", stamp(), err)
		reason := "see the worker log"
		if errors.Is(err, errNoAgentSeen) || errors.Is(err, errAgentEnded) {
			reason = err.Error()
		}
		fail(reason)
		return
	}
	if seen.Ended {
		fmt.Fprintf(log, "%s agent %s reported done and ended\n", stamp(), doc.Agent.Name)
	} else {
		fmt.Fprintf(log, "%s agent %s ready (pid %d)\n", stamp(), doc.Agent.Name, seen.Identity.PID)
	}
	raw, _ := json.Marshal(seen)
	if err := o.Store.SetAgent(ctx, name, string(raw)); err != nil {
		fail("its record could not be written")
		return
	}
	if err := o.Store.SetState(ctx, name, store.StateReady); err != nil {
		fail("its record could not be written")
		return
	}
	o.Store.SetPhase(ctx, name, "")
	detail := fmt.Sprintf("child `%s` is ready", name)
	if o.doneAccepted(ctx, name) {
		detail += "; it already reported done"
	} else if doc.Restart {
		detail += "; agent is alive"
	}
	o.appendStatus(ctx, sb.Parent, doc.Ref, wire.StateDone, detail)
	o.watchAgent(name, seen.Identity)
}

// buildChild makes the child's sandbox (makeSandbox) and fills its
// checkout from the spawn's source.
func (o *Orchestrator) buildChild(ctx context.Context, sb *store.Sandbox, doc spawnDoc, log io.Writer, phase *string) error {
	return o.makeSandbox(ctx, sb, false, func(ctx context.Context) error {
		fmt.Fprintf(log, "%s sandbox %s started\n", stamp(), sb.Name)
		if err := o.recordSpawnRights(ctx, sb.Name, doc.Rights); err != nil {
			return err
		}
		*phase = PhaseCloning
		if err := o.Store.SetPhase(ctx, sb.Name, *phase); err != nil {
			return err
		}
		src := gitx.HostRepo(sb.Repo)
		if doc.Source == "pr" {
			commit, err := gitx.FetchPR(ctx, sb.Repo, PRRemote, doc.PR)
			if err != nil {
				return err
			}
			fmt.Fprintf(log, "%s pull request %d of %s is at %s\n", stamp(), doc.PR, PRRemote, commit)
			if err := o.Store.SetImported(ctx, sb.Name, commit); err != nil {
				return err
			}
			doc.Commit = commit
		}
		if doc.Source == "orchestrator" {
			src = o.checkout(sb.Parent)
		}
		if err := o.fillFrom(ctx, sb.Name, src, sb.Branch, doc.Commit); err != nil {
			return err
		}
		fmt.Fprintf(log, "%s checkout of %s at %s done\n", stamp(), sb.Branch, doc.Commit)
		if doc.Source == "orchestrator" {
			o.seedWarmPaths(ctx, sb.Parent, sb.Name, doc.Commit, doc.WarmPaths, log)
		}
		return nil
	})
}

// seedClaudeHome seeds the agent user's home in sandbox name for Claude
// Code (agent.ClaudeHomeArgv); files that are there are kept.
func (o *Orchestrator) seedClaudeHome(ctx context.Context, name string) error {
	ctx, cancel := context.WithTimeout(ctx, agentCheckTimeout)
	defer cancel()
	stderr := &untrusted.Buffer{Max: maxStderrKept}
	code, err := o.Runner(name).Run(ctx, gitx.Cmd{Argv: agent.ClaudeHomeArgv(backend.WorkspacePath), Stderr: stderr})
	if err != nil || code != 0 {
		return fmt.Errorf("cannot prepare the agent's home (exit %d): %v %q", code, err, stderr.String())
	}
	return nil
}

// startAgent starts the child's agent in its tmux session and waits until
// it is ready: the same identity seen alive twice, readyGap apart, within
// agentStartTimeout.
func (o *Orchestrator) startAgent(ctx context.Context, name string, doc spawnDoc, log io.Writer) (agentSeen, error) {
	run, spec := o.Runner(name), doc.Agent
	newSession := true
	if doc.AgentOnly || doc.sessionUp {
		// The child runs, or its services do: the tmux session may hold
		// other windows.
		hctx, cancel := context.WithTimeout(ctx, agentCheckTimeout)
		code, err := run.Run(hctx, gitx.Cmd{Argv: agent.HasSessionArgv()})
		cancel()
		newSession = err != nil || code != 0
	}
	if spec.IsClaude() {
		if err := o.seedClaudeHome(ctx, name); err != nil {
			return agentSeen{}, err
		}
	}
	// Each command in the child is bounded: its tmux is the child's to
	// stall, and the spawn's or restart's status waits on them.
	stdout, stderr := &untrusted.Buffer{Max: agent.MaxPaneOutput}, &untrusted.Buffer{Max: maxStderrKept}
	sctx, cancel := context.WithTimeout(ctx, agentCheckTimeout)
	code, err := run.Run(sctx, gitx.Cmd{Argv: agent.WithStat(agent.StartArgv(spec, doc.Prompt, newSession)), Dir: backend.WorkspacePath,
		Stdout: stdout, Stderr: stderr})
	cancel()
	if err != nil || code != 0 {
		return agentSeen{}, fmt.Errorf("tmux exited %d: %v %q", code, err, stderr.String())
	}
	deadline := time.Now().Add(agentStartTimeout)
	var first agent.Identity
	var firstAt time.Time
	// tmux's word for the pane it made, and the stat of its process.
	pid, startID, startAlive, seen, pidErr := agent.ParsePane(stdout.Bytes())
	for time.Now().Before(deadline) {
		var id agent.Identity
		var alive bool
		switch {
		case seen:
			id, alive, seen = startID, startAlive, false
		case first == (agent.Identity{}) && pidErr == nil:
			id, alive = o.identityOf(ctx, name, pid)
		default:
			id, alive = o.observeAgent(ctx, name, spec.Name)
		}
		switch {
		case !alive && o.doneAccepted(ctx, name):
			// Its done report was accepted before it ended: a finished
			// child, not a failed one.
			return agentSeen{Window: spec.Name, Identity: first, Ended: true}, nil
		case !alive && first != (agent.Identity{}):
			return agentSeen{}, errAgentEnded
		case !alive:
		case first == (agent.Identity{}) || id != first:
			first, firstAt = id, time.Now()
			fmt.Fprintf(log, "%s agent seen: pid %d\n", stamp(), id.PID)
		case time.Since(firstAt) >= readyGap:
			return agentSeen{Window: spec.Name, Identity: id}, nil
		}
		select {
		case <-ctx.Done():
			return agentSeen{}, ctx.Err()
		case <-time.After(observeInterval):
		}
	}
	return agentSeen{}, errNoAgentSeen
}

// doneAccepted says whether child name's done report (of its current
// agent: a restart clears the last one) was accepted.
func (o *Orchestrator) doneAccepted(ctx context.Context, name string) bool {
	sb, err := o.Store.Sandbox(ctx, name)
	return err == nil && sb.DoneHead != ""
}

// Why an agent did not become ready.
var (
	errNoAgentSeen = fmt.Errorf("no agent was seen within %d s after setup", int(agentStartTimeout/time.Second))
	errAgentEnded  = errors.New("the agent ended before it was ready")
)

// observeAgent reads the identity of the process in the agent's tmux
// window (the sandbox answers: it can only misreport its own agent).
func (o *Orchestrator) observeAgent(ctx context.Context, name, window string) (agent.Identity, bool) {
	// One bound for the look and, when it needs one, the stat after it.
	ctx, cancel := context.WithTimeout(ctx, agentCheckTimeout)
	defer cancel()
	out, err := o.lookAt(ctx, name, agent.WithStat(agent.PaneArgv(window)), agent.MaxPaneOutput)
	if err != nil {
		return agent.Identity{}, false
	}
	pid, id, alive, seen, err := agent.ParsePane(out)
	if err != nil {
		return agent.Identity{}, false
	}
	if seen {
		return id, alive
	}
	return o.identityOf(ctx, name, pid)
}

// identityOf reads the identity of process pid in the sandbox name.
func (o *Orchestrator) identityOf(ctx context.Context, name string, pid int) (agent.Identity, bool) {
	out, err := o.lookAt(ctx, name, agent.IdentityArgv(pid), 4096)
	if err != nil {
		return agent.Identity{}, false
	}
	id, alive, err := agent.ParseStat(pid, out)
	return id, err == nil && alive
}

// lookAt runs argv in sandbox name to look at its agent, within
// agentCheckTimeout, and returns at most limit bytes of what it printed
// (sandbox-controlled); an error when it could not run or exited non-zero.
func (o *Orchestrator) lookAt(ctx context.Context, name string, argv []string, limit int) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, agentCheckTimeout)
	defer cancel()
	out := &untrusted.Buffer{Max: limit}
	code, err := o.Runner(name).Run(ctx, gitx.Cmd{Argv: argv, Stdout: out})
	if err == nil && code != 0 {
		err = fmt.Errorf("exit %d", code)
	}
	return out.Bytes(), err
}

// failChild reports a failed spawn or restart to the orchestrator and
// removes the child, or keeps it for a look at what its agent did:
// stopped, or running after an agent_only restart.
func (o *Orchestrator) failChild(ctx context.Context, sb store.Sandbox, doc spawnDoc, phase, reason string, keep bool) {
	outcome := "the child was removed"
	switch {
	case keep && doc.AgentOnly:
		outcome = "the child was kept running"
		o.Store.SetState(ctx, sb.Name, store.StateRunning)
		o.Store.SetPhase(ctx, sb.Name, "")
	case keep && doc.Restart:
		outcome = "the child was kept, stopped"
		if err := o.StopSandbox(ctx, sb.Name); err != nil {
			o.logger().Error("stop failed child", "sandbox", sb.Name, "err", err)
		}
		o.Store.SetPhase(ctx, sb.Name, "")
	case keep:
		outcome = "the child was kept, stopped"
		if err := o.Backend.Stop(ctx, sb.Name); err != nil && !errors.Is(err, backend.ErrNotFound) {
			o.logger().Error("stop failed child", "sandbox", sb.Name, "err", err)
		}
		o.Store.SetState(ctx, sb.Name, store.StateFailed)
		o.Store.SetPhase(ctx, sb.Name, "")
	default:
		if o.Unserve != nil {
			o.Unserve(sb.Name)
		}
		if err := o.Backend.Destroy(ctx, sb.Name); err != nil && !errors.Is(err, backend.ErrNotFound) {
			o.logger().Error("remove failed child", "sandbox", sb.Name, "err", err)
		}
		o.Store.DeleteSandbox(ctx, sb.Name)
	}
	o.appendStatus(ctx, sb.Parent, doc.Ref, wire.StateFailed,
		fmt.Sprintf("%s of child `%s` failed: %s during %s — %s", doc.what(), sb.Name, reason, phase, outcome))
}

// appendStatus records a later status of an orchestrator's manifest,
// unread, and wakes its waiters.
func (o *Orchestrator) appendStatus(ctx context.Context, sandbox, ref, state, detail string) {
	if _, err := o.Store.RecordStatus(ctx, sandbox, ref, "", state, detail, false); err != nil {
		o.logger().Error("record status", "sandbox", sandbox, "manifest", ref, "err", err)
		return
	}
	o.notify(sandbox)
}

// startQueued starts queued spawns of orch while it has free slots,
// oldest first. Finished workers and stop or destroy manifests call it at
// once: queueMu makes counting the slots and taking one a single step, and
// a worker starts only for a child whose claim changed its row.
func (o *Orchestrator) startQueued(ctx context.Context, orch string) {
	max, ok := o.maxRunning(ctx, orch)
	if !ok {
		return
	}
	o.queueMu.Lock()
	defer o.queueMu.Unlock()
	ctx = serial.Pin(ctx) // the turn stays while the mutex is held
	for {
		active, _, err := o.slots(ctx, orch)
		if err != nil || len(active) >= max {
			return
		}
		next, ok := o.oldestQueued(ctx, orch)
		if !ok {
			return
		}
		var doc spawnDoc
		json.Unmarshal([]byte(next.SpawnDoc), &doc)
		phase, detail := PhaseCreating, fmt.Sprintf("creation of child `%s` started", next.Name)
		if doc.Restart {
			phase, detail = PhaseStarting, fmt.Sprintf("restart of child `%s` started", next.Name)
		}
		claimed, err := o.Store.ClaimQueued(ctx, next.Name, next.QueuedSeq, store.StateCreating, phase)
		if err != nil {
			return
		}
		if !claimed {
			continue // it left the queue meanwhile (destroyed): look again
		}
		o.appendStatus(ctx, orch, doc.Ref, wire.StateStarted, detail)
		o.startWorker(next.Name)
	}
}

// maxRunning is orch's max_running_children, its grant capped by its
// repository's config; false when orch has none to read.
func (o *Orchestrator) maxRunning(ctx context.Context, orch string) (int, bool) {
	sb, err := o.Store.Sandbox(ctx, orch)
	if err != nil || sb.Grant == "" {
		return 0, false
	}
	g, err := o.parsedGrant(sb.Grant)
	if err != nil {
		return 0, false
	}
	repo, err := LoadRepoConfig(sb.Repo)
	if err != nil {
		return 0, false
	}
	return g.Capped(repo.Orchestration.Cap).MaxRunningChildren, true
}

func (o *Orchestrator) oldestQueued(ctx context.Context, orch string) (store.Sandbox, bool) {
	kids, err := o.Store.Children(ctx, orch)
	if err != nil {
		return store.Sandbox{}, false
	}
	var best store.Sandbox
	for _, c := range kids {
		if waitsForSlot(c) && (best.Name == "" || c.QueuedSeq < best.QueuedSeq) {
			best = c
		}
	}
	return best, best.Name != ""
}

// RecoverSpawns is run by a starting broker: a child whose creation a
// previous broker did not finish is reported failed and removed; queued
// spawns resume where slots are free.
func (o *Orchestrator) RecoverSpawns(ctx context.Context) {
	all, err := o.Store.Sandboxes(ctx)
	if err != nil {
		return
	}
	parents := map[string]bool{}
	for _, sb := range all {
		if sb.SpawnDoc == "" {
			continue
		}
		parents[sb.Parent] = true
		if sb.Cleanup && sb.DoneHead != "" {
			o.destroyAfterDone(sb.Name, sb.DoneHead) // its report said so
		}
		if sb.State == store.StateReady {
			var seen agentSeen
			json.Unmarshal([]byte(sb.Agent), &seen)
			o.watchAgent(sb.Name, seen.Identity) // its agent runs on in its sandbox
			continue
		}
		if sb.State == store.StateQueued || sb.Phase == "" {
			continue // not started, or its worker finished
		}
		var doc spawnDoc
		json.Unmarshal([]byte(sb.SpawnDoc), &doc)
		// A restart's child had work of its own: it is kept.
		o.failChild(ctx, sb, doc, sb.Phase, "the worker stopped", doc.Restart)
	}
	for p := range parents {
		o.startQueued(ctx, p)
	}
}

// Bounds of the worker logs. Each spawn and restart opens one, which a
// child's setup and on_start steps fill with their output (64 KiB a
// step), and they outlive the child (logs NAME reads a destroyed one's):
// an orchestrator restarting a failing child, or spawning and destroying
// one, in a loop would otherwise fill the broker's disk.
const (
	// MaxWorkerLogBytes bounds one worker log; past it, one line says
	// the rest was cut.
	MaxWorkerLogBytes = 1 << 20
	// MaxWorkerLogs bounds the worker logs kept: opening one more removes
	// the oldest (by modification time).
	MaxWorkerLogs = 256
)

// workerLog opens the spawn's worker log, <LogDir>/<child>.<ref>.log
// (owner only), bounded by MaxWorkerLogBytes, with the oldest logs past
// MaxWorkerLogs removed; or a discard when there is no LogDir.
func (o *Orchestrator) workerLog(sb store.Sandbox, doc spawnDoc) io.WriteCloser {
	if o.LogDir == "" {
		return nopCloser{io.Discard}
	}
	if err := secfs.EnsurePrivateDir(o.LogDir); err != nil {
		return nopCloser{io.Discard}
	}
	path := filepath.Join(o.LogDir, sb.Name+"."+doc.Ref+".log")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nopCloser{io.Discard}
	}
	o.logger().Info("spawn worker", "sandbox", sb.Name, "manifest", doc.Ref, "log", path)
	pruneWorkerLogs(o.LogDir, MaxWorkerLogs, path)
	var size int64
	if fi, err := f.Stat(); err == nil {
		size = fi.Size() // a name and id used again append
	}
	return &cappedLog{f: f, left: MaxWorkerLogBytes - size}
}

// pruneWorkerLogs removes the oldest worker logs in dir past keep, never
// the one at current.
func pruneWorkerLogs(dir string, keep int, current string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	type logFile struct {
		path string
		mod  time.Time
	}
	var logs []logFile
	for _, e := range entries {
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), ".log") {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		logs = append(logs, logFile{filepath.Join(dir, e.Name()), fi.ModTime()})
	}
	slices.SortFunc(logs, func(a, b logFile) int { return a.mod.Compare(b.mod) })
	left := len(logs)
	for _, l := range logs {
		if left <= keep {
			return
		}
		if l.path != current && os.Remove(l.path) == nil {
			left--
		}
	}
}

// cappedLog writes a worker log up to its bound, then one line that says
// so; what comes after is dropped (reported written: the worker goes on).
type cappedLog struct {
	f    *os.File
	left int64
	cut  bool
}

func (c *cappedLog) Write(p []byte) (int, error) {
	if int64(len(p)) <= c.left {
		n, err := c.f.Write(p)
		c.left -= int64(n)
		return n, err
	}
	if !c.cut {
		c.cut = true
		c.f.Write(p[:max(c.left, 0)])
		fmt.Fprintf(c.f, "\n%s the worker log is cut here: it reached %d bytes\n", stamp(), MaxWorkerLogBytes)
		c.left = 0
	}
	return len(p), nil
}

func (c *cappedLog) Close() error { return c.f.Close() }

// WorkerLogs lists a child's worker logs, oldest first.
func (o *Orchestrator) WorkerLogs(name string) []string {
	if o.LogDir == "" {
		return nil
	}
	matches, _ := filepath.Glob(filepath.Join(o.LogDir, name+".*.log"))
	return matches
}

func stamp() string { return time.Now().UTC().Format("2006-01-02T15:04:05.000Z07:00") }

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }
