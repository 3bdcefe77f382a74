package orchestrate

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"agentbox/internal/agent"
	"agentbox/internal/gitx"
	"agentbox/internal/manifest"
	"agentbox/internal/serial"
	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// PhaseStarting is a restart's first step: the stopped sandbox starts.
const PhaseStarting = "starting"

// Restart runs a restart manifest. A stopped (or failed, kept) child
// starts again with a new prompt: queued when its orchestrator has no
// free slot, else started; its worker starts the sandbox and the agent
// and appends done (ready) or failed. With agent_only a running child
// whose agent reported done or ended gets a fresh agent in its tmux
// window instead, never queued.
func (o *Orchestrator) Restart(ctx context.Context, req wire.Caller, m *manifest.Manifest, from manifest.Sender) (store.Sent, error) {
	return o.admitted(ctx, req, m, func() (string, string, string, error) {
		return o.admitRestart(ctx, req, m, from)
	})
}

// admitted runs a manifest whose work goes to a child's worker: the id is
// journaled, admit checks and records the work, its first status is
// stored, and a started worker runs.
func (o *Orchestrator) admitted(ctx context.Context, req wire.Caller, m *manifest.Manifest,
	admit func() (state, detail, child string, err error)) (store.Sent, error) {
	prev, found, err := o.Store.BeginManifest(ctx, req.Sandbox, m.ID, string(m.Type))
	if err != nil || found {
		return prev, err
	}
	state, detail, name, err := admit()
	if r, ok := AsRefusal(err); ok {
		return o.Store.FinishManifest(ctx, req.Sandbox, m.ID, wire.StateRefused, r.Detail)
	}
	if err != nil {
		o.logger().Error("manifest failed", "sandbox", req.Sandbox, "manifest", m.ID, "type", m.Type, "err", err)
		return o.Store.FinishManifest(ctx, req.Sandbox, m.ID, wire.StateFailed, fmt.Sprintf("%s failed (see the broker log)", m.Type))
	}
	sent, err := o.Store.FinishManifest(ctx, req.Sandbox, m.ID, state, detail)
	if err == nil && state == wire.StateStarted {
		o.startWorker(name)
	}
	return sent, err
}

// admitRestart checks a restart and records it on the child.
func (o *Orchestrator) admitRestart(ctx context.Context, req wire.Caller, m *manifest.Manifest, from manifest.Sender) (state, detail, name string, err error) {
	r := m.Restart
	sb, err := o.childOf(ctx, req, r.Child)
	if err != nil {
		return "", "", "", err
	}
	name = sb.Name
	switch {
	case sb.State == store.StateQueued:
		return "", "", "", refusef("`%s` is queued: it has not started", name)
	case sb.State == store.StateCreating || sb.Phase != "":
		return "", "", "", refusef("`%s` is being started: wait for its last spawn or restart's final status", name)
	case restartQueued(sb):
		return "", "", "", refusef("`%s` already has a restart queued", name)
	}
	var doc spawnDoc
	if sb.SpawnDoc != "" {
		if err := json.Unmarshal([]byte(sb.SpawnDoc), &doc); err != nil {
			return "", "", "", fmt.Errorf("spawn document of %s: %w", name, err)
		}
	} else {
		doc = spawnDoc{Kind: "host", OnDone: manifest.OnDoneKeep}
	}
	effective := from.Grant.Capped(from.Repo.Orchestration.Cap)
	switch {
	case r.Runner.Set || doc.Agent.Name == "":
		// null (or a child that never had an agent): the current default;
		// an object: that runner.
		if doc.Agent, err = agent.Resolve(r.Runner.Runner, effective, from.Repo); err != nil {
			return "", "", "", refusef("%v", err)
		}
	}
	if r.OnDone != "" {
		doc.OnDone = r.OnDone
	}
	doc.Ref, doc.Prompt, doc.Restart, doc.AgentOnly = m.ID, r.Prompt, true, r.AgentOnly
	if r.AgentOnly {
		return o.admitAgentOnly(ctx, sb, doc)
	}
	if sb.State != store.StateStopped && sb.State != store.StateFailed {
		return "", "", "", refusef("`%s` is running: stop it first", name)
	}
	raw, err := json.Marshal(doc)
	if err != nil {
		return "", "", "", err
	}
	// Stored before the boot: a queued restart boots with it too.
	sel := parseStartup(sb.Startup)
	if sb.Startup == "" {
		// None stored (made on the host): the normal default.
		sel.Profile = from.Repo.Autostart.DefaultProfile
	}
	if err := o.Store.SetStartup(ctx, name, sel.restarted(r).String()); err != nil {
		return "", "", "", err
	}
	o.queueMu.Lock() // the count and the record are one step (startQueued)
	defer o.queueMu.Unlock()
	ctx = serial.Pin(ctx) // the turn stays while the mutex is held
	active, queued, err := o.slots(ctx, sb.Parent)
	if err != nil {
		return "", "", "", err
	}
	if max := effective.MaxRunningChildren; len(active) >= max || queued > 0 {
		if err := o.Store.SetRestart(ctx, name, string(raw), store.StateStopped, "", time.Now().UnixNano()); err != nil {
			return "", "", "", err
		}
		return wire.StateQueued, queuedDetail(queued+1, active, max), name, nil
	}
	if err := o.Store.SetRestart(ctx, name, string(raw), store.StateCreating, PhaseStarting, 0); err != nil {
		return "", "", "", err
	}
	return wire.StateStarted, fmt.Sprintf("restart of child `%s` started", name), name, nil
}

// admitAgentOnly checks an agent_only restart: a running child whose
// agent reported done or has ended, never one whose agent may still be
// at work or cannot be seen.
func (o *Orchestrator) admitAgentOnly(ctx context.Context, sb store.Sandbox, doc spawnDoc) (string, string, string, error) {
	if sb.State != store.StateReady && sb.State != store.StateRunning {
		return "", "", "", refusef("`%s` is not running: restart it without agent_only", sb.Name)
	}
	var seen agentSeen
	json.Unmarshal([]byte(sb.Agent), &seen)
	if sb.DoneHead == "" && !seen.Ended {
		if seen.Window == "" {
			return "", "", "", refusef("`%s` has no watched agent: restart it without agent_only", sb.Name)
		}
		_, alive, known := o.agentAlive(ctx, sb.Name, seen.Window)
		switch {
		case !known:
			return "", "", "", refusef("the agent of `%s` cannot be checked: try again, or stop and restart the child", sb.Name)
		case alive:
			return "", "", "", refusef("`%s` is busy: its agent is still at work and has not reported done", sb.Name)
		}
	}
	raw, err := json.Marshal(doc)
	if err != nil {
		return "", "", "", err
	}
	// State running, not ready: the old agent's watch ends.
	if err := o.Store.SetRestart(ctx, sb.Name, string(raw), store.StateRunning, PhaseAgent, 0); err != nil {
		return "", "", "", err
	}
	if seen.Window != "" {
		// Bounded: the child's tmux is the child's to stall, and this is
		// its orchestrator's send.
		kctx, cancel := context.WithTimeout(ctx, agentCheckTimeout)
		o.Runner(sb.Name).Run(kctx, gitx.Cmd{Argv: agent.KillWindowArgv(seen.Window)})
		cancel()
	}
	return wire.StateStarted, fmt.Sprintf("restart of child `%s` started", sb.Name), sb.Name, nil
}

// agentAlive says whether the agent in window is alive; known is false
// when the sandbox could not be asked at all.
func (o *Orchestrator) agentAlive(ctx context.Context, name, window string) (id agent.Identity, alive, known bool) {
	if id, alive := o.observeAgent(ctx, name, window); alive {
		return id, true, true
	}
	return agent.Identity{}, false, o.answers(ctx, name)
}

// answers says whether sandbox name runs a command at all.
func (o *Orchestrator) answers(ctx context.Context, name string) bool {
	ctx, cancel := context.WithTimeout(ctx, agentCheckTimeout)
	defer cancel()
	code, err := o.Runner(name).Run(ctx, gitx.Cmd{Argv: []string{"true"}})
	return err == nil && code == 0
}

// restartQueued: a stopped child waiting for a slot to restart in.
func restartQueued(sb store.Sandbox) bool {
	return sb.QueuedSeq > 0 && sb.State == store.StateStopped
}

// waitsForSlot: a spawn or restart waiting in its orchestrator's queue.
func waitsForSlot(sb store.Sandbox) bool {
	return sb.State == store.StateQueued || restartQueued(sb)
}

// rerunChild is a restart's worker: the sandbox starts (unless
// agent_only), then the agent, then its readiness. Failures keep the
// child: stopped, or running for agent_only.
func (o *Orchestrator) rerunChild(ctx context.Context, sb store.Sandbox, doc spawnDoc, log io.Writer) {
	phase := PhaseStarting
	fail := func(reason string) {
		fmt.Fprintf(log, "%s failed during %s: %s\n", stamp(), phase, reason)
		o.failChild(context.WithoutCancel(ctx), sb, doc, phase, reason, true)
	}
	fmt.Fprintf(log, "%s restart %s of child %s (agent %s)\n", stamp(), doc.Ref, sb.Name, doc.Agent.Name)
	if !doc.AgentOnly {
		if err := o.StartUnit(ctx, sb.Name); err != nil {
			fmt.Fprintf(log, "%s start: %v\n", stamp(), err)
			fail("see the worker log")
			return
		}
		if err := o.Store.SetRestarted(ctx, sb.Name); err != nil {
			fail("its record could not be written")
			return
		}
		fmt.Fprintf(log, "%s sandbox %s started\n", stamp(), sb.Name)
		var err error
		if sb, err = o.Store.Sandbox(ctx, sb.Name); err != nil {
			fail("its record could not be read")
			return
		}
		if doc.sessionUp, err = o.runStartup(ctx, sb, log, &phase); err != nil {
			fmt.Fprintf(log, "%s error: %v\n", stamp(), err)
			fail(stepReason(err))
			return
		}
		phase = PhaseAgent
		if err := o.Store.SetPhase(ctx, sb.Name, phase); err != nil {
			fail("its record could not be written")
			return
		}
	}
	phase = PhaseAgent
	o.runAgent(ctx, sb, doc, log, fail)
}
