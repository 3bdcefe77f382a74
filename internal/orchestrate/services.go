package orchestrate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"agentbox/internal/agent"
	"agentbox/internal/backend"
	"agentbox/internal/config"
	"agentbox/internal/gitx"
	"agentbox/internal/manifest"
	"agentbox/internal/store"
	"agentbox/internal/untrusted"
	"agentbox/internal/wire"
)

// Phases of a child's start between its sandbox and its agent: the
// autostart profile's missing one-shot setup, the services, the profile's
// on_start commands.
const (
	PhaseSetup    = "setup"
	PhaseServices = "services"
	PhaseOnStart  = "on_start"
)

// Bounds of a start's steps.
const (
	// stepTimeout bounds one setup or on_start command.
	stepTimeout = 30 * time.Minute
	// maxStepOutput bounds the output of a step kept in the worker log.
	maxStepOutput = 64 << 10
	// maxStderrKept bounds what an error keeps of a tmux or set-up
	// command's stderr in the child.
	maxStderrKept = 1024
)

// startup is a child's selection (store.Sandbox.Startup): its autostart
// profile and its explicit services.
type startup struct {
	// Profile is "" for none: no setup, no on_start, every service.
	Profile string `json:"profile,omitempty"`
	// Services: nil for the profile's (or every service), else these
	// (empty: none). Never omitted: null and [] differ.
	Services []string `json:"services"`
}

// parseStartup reads a stored selection; "" (a sandbox made on the host,
// or before selections were kept) is the default one.
func parseStartup(raw string) startup {
	var sel startup
	json.Unmarshal([]byte(raw), &sel)
	return sel
}

func (sel startup) String() string {
	raw, _ := json.Marshal(sel)
	return string(raw)
}

// spawnStartup is the selection a spawn stores: its profile, else the
// repository's default, and its explicit services.
func spawnStartup(s *manifest.Spawn, repo *config.Repo) startup {
	sel := startup{Profile: s.AutostartProfile, Services: s.Services}
	if sel.Profile == "" {
		sel.Profile = repo.Autostart.DefaultProfile
	}
	return sel
}

// restarted is the selection after restart r: a named profile replaces
// the stored one, explicit services replace the stored ones; omission
// keeps them.
func (sel startup) restarted(r *manifest.Restart) startup {
	if r.AutostartProfile != "" {
		sel.Profile = r.AutostartProfile
	}
	if r.Services != nil {
		sel.Services = r.Services
	}
	return sel
}

// startPlan is what a child's start runs, in order.
type startPlan struct {
	setup    []string
	services []string // dependencies first
	onStart  []string
}

// plan resolves the selection against the repository's config (which may
// have changed since it was stored).
func (sel startup) plan(repo *config.Repo) (startPlan, error) {
	var prof config.AutostartProfile
	if sel.Profile != "" {
		var ok bool
		if prof, ok = repo.Autostart.Profiles[sel.Profile]; !ok {
			return startPlan{}, fmt.Errorf("autostart profile `%s` is not defined", sel.Profile)
		}
	}
	names := sel.Services
	if names == nil {
		names = prof.Services
	}
	if names == nil {
		names = repo.AllServices()
	}
	for _, n := range names {
		if !repo.ServiceDefined(n) {
			return startPlan{}, fmt.Errorf("service `%s` is not defined", n)
		}
	}
	return startPlan{setup: prof.Setup, services: repo.StartOrder(repo.WithDependencies(names)), onStart: prof.OnStart}, nil
}

// stepError is a start step's failure, its reason fit for the
// orchestrator's status (no command text, no output: those are in the
// worker log).
type stepError struct{ reason string }

func (e *stepError) Error() string { return e.reason }

// stepReason is the status reason of a start's failure.
func stepReason(err error) string {
	var se *stepError
	if errors.As(err, &se) {
		return se.reason
	}
	if r, ok := AsRefusal(err); ok {
		return r.Detail
	}
	return "see the worker log"
}

// runStartup runs a child's start between its sandbox and its agent:
// the missing setup, the services in dependency order, on_start; each
// phase recorded before it is taken. started says whether the tmux
// session may exist (a service started).
func (o *Orchestrator) runStartup(ctx context.Context, sb store.Sandbox, log io.Writer, phase *string) (started bool, err error) {
	repo, err := LoadRepoConfig(sb.Repo)
	if err != nil {
		return false, err
	}
	plan, err := parseStartup(sb.Startup).plan(repo)
	if err != nil {
		return false, &stepError{reason: err.Error()}
	}
	enter := func(p string) error {
		*phase = p
		return o.Store.SetPhase(ctx, sb.Name, p)
	}
	if len(plan.setup) > 0 {
		if err := enter(PhaseSetup); err != nil {
			return false, err
		}
		if err := o.runSetup(ctx, sb.Name, plan.setup, log); err != nil {
			return false, err
		}
	}
	started = len(plan.services) > 0
	if started {
		if err := enter(PhaseServices); err != nil {
			return false, err
		}
		for _, s := range plan.services {
			if err := o.startService(ctx, sb.Name, s, repo.Services[s].Command, log); err != nil {
				return true, err
			}
		}
	}
	if len(plan.onStart) > 0 {
		if err := enter(PhaseOnStart); err != nil {
			return started, err
		}
		for i, cmd := range plan.onStart {
			if err := o.runStep(ctx, sb.Name, fmt.Sprintf("on_start command %d", i+1), cmd, log); err != nil {
				return started, err
			}
		}
	}
	return started, nil
}

// runSetup runs the setup commands sandbox name has not yet run to
// success, recording each that succeeds: a restart runs only the missing.
func (o *Orchestrator) runSetup(ctx context.Context, name string, setup []string, log io.Writer) error {
	done, err := o.Store.Prepared(ctx, name)
	if err != nil {
		return err
	}
	for i, cmd := range setup {
		step := "setup:" + cmd
		what := fmt.Sprintf("setup command %d", i+1)
		if done[step] {
			fmt.Fprintf(log, "%s %s already ran in this sandbox\n", stamp(), what)
			continue
		}
		if err := o.runStep(ctx, name, what, cmd, log); err != nil {
			return err
		}
		if err := o.Store.SetPrepared(ctx, name, step); err != nil {
			return err
		}
		done[step] = true // the same command twice runs once
	}
	return nil
}

// runStep runs one setup or on_start command with sh -c in the checkout
// as the agent user; its output (bounded, made printable, each line after
// "  | ") goes to the worker log.
func (o *Orchestrator) runStep(ctx context.Context, name, what, cmd string, log io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	fmt.Fprintf(log, "%s %s: %s\n", stamp(), what, cmd)
	out := &untrusted.Buffer{Max: maxStepOutput}
	code, err := o.Runner(name).Run(ctx, gitx.Cmd{Argv: []string{"sh", "-c", cmd}, Dir: backend.WorkspacePath, Stdout: out, Stderr: out})
	if text := agent.PaneLines(out.Bytes()); len(text) > 0 {
		// The sandbox's text: each line marked, so none passes for one of
		// the worker's own stamped lines.
		fmt.Fprintf(log, "%s %s output:\n  | %s\n", stamp(), what, strings.Join(text, "\n  | "))
	}
	switch {
	case err != nil:
		fmt.Fprintf(log, "%s %s: %v\n", stamp(), what, err)
		return &stepError{reason: what + " could not run"}
	case code != 0:
		return &stepError{reason: fmt.Sprintf("%s exited %d (its output is in the worker log)", what, code)}
	}
	return nil
}

// startService (re)starts service s in its tmux window.
func (o *Orchestrator) startService(ctx context.Context, name, s, cmd string, log io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, agentCheckTimeout)
	defer cancel()
	stderr := &untrusted.Buffer{Max: maxStderrKept}
	code, err := o.Runner(name).Run(ctx, gitx.Cmd{Argv: agent.StartServiceArgv(s, cmd), Dir: backend.WorkspacePath, Stderr: stderr})
	if err != nil || code != 0 {
		fmt.Fprintf(log, "%s service %s: exit %d: %v %q\n", stamp(), s, code, err, stderr.String())
		return &stepError{reason: fmt.Sprintf("service `%s` could not be started", s)}
	}
	fmt.Fprintf(log, "%s service %s started\n", stamp(), s)
	return nil
}

// Refresh runs a refresh manifest: the named services of a running child
// start again, each in a fresh window, in the order named. Only services
// of the child's selection (dependencies included) can be refreshed: the
// others never run in it. Refused while its agent may be at work, unless
// force.
func (o *Orchestrator) Refresh(ctx context.Context, req wire.Caller, m *manifest.Manifest) (store.Sent, error) {
	x := m.Refresh
	return o.childManifest(ctx, req, m, x.Child, func(sb store.Sandbox) (string, error) {
		switch {
		case sb.Phase != "":
			return "", refusef("`%s` is being started: wait for its last spawn or restart's final status", sb.Name)
		case sb.State != store.StateReady && sb.State != store.StateRunning:
			return "", refusef("`%s` is not running: restart it (its services start with it)", sb.Name)
		}
		repo, err := LoadRepoConfig(sb.Repo)
		if err != nil {
			return "", err
		}
		plan, err := parseStartup(sb.Startup).plan(repo)
		if err != nil {
			return "", refusef("the services of `%s` cannot be told: %v", sb.Name, err)
		}
		if sb.Startup == "" {
			plan.services = nil // made on the host: its starts run none
		}
		for _, s := range x.Services {
			if !slices.Contains(plan.services, s) {
				return "", refusef("service `%s` is not among the services of `%s` (%s)", s, sb.Name, namedList(plan.services))
			}
		}
		if !x.Force {
			if err := o.idleGate(ctx, sb); err != nil {
				return "", err
			}
		}
		for _, s := range x.Services {
			if err := o.startService(ctx, sb.Name, s, repo.Services[s].Command, io.Discard); err != nil {
				return "", err
			}
		}
		return fmt.Sprintf("services %s of child `%s` restarted", namedList(x.Services), sb.Name), nil
	})
}

// idleGate refuses a refresh while the child's agent may be at work: it
// passes once the agent reported done or ended, or when its adapter
// (Claude Code) judges it idle or waiting for input. An agent without an
// adapter that still runs counts as busy (fail closed).
func (o *Orchestrator) idleGate(ctx context.Context, sb store.Sandbox) error {
	var seen agentSeen
	json.Unmarshal([]byte(sb.Agent), &seen)
	if sb.DoneHead != "" || seen.Ended || seen.Window == "" {
		return nil
	}
	var doc spawnDoc
	json.Unmarshal([]byte(sb.SpawnDoc), &doc)
	if doc.Agent.IsClaude() && o.claudeActivity(ctx, sb.Name, seen.Identity).Counts() {
		return nil
	}
	if _, alive, known := o.agentAlive(ctx, sb.Name, seen.Window); known && !alive {
		return nil
	}
	return refusef("`%s` is busy: its agent is at work and has not reported done (refresh with force to restart the services anyway)", sb.Name)
}

// ServiceInfo is one service of a sandbox as ps shows it.
type ServiceInfo struct {
	Name     string
	Selected bool // in the sandbox's selection: its starts run it
	agent.ServiceState
}

// Services lists the services of sandbox name's repository with their
// state, read from tmux inside the sandbox (`jailbee ps`).
func (o *Orchestrator) Services(ctx context.Context, name string) ([]ServiceInfo, error) {
	sb, err := o.Store.Sandbox(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return nil, o.NoSuchSandbox(ctx, name)
	}
	if err != nil {
		return nil, err
	}
	repo, err := LoadRepoConfig(sb.Repo)
	if err != nil {
		return nil, err
	}
	var selected []string // none stored: no start runs services
	if plan, err := parseStartup(sb.Startup).plan(repo); err == nil && sb.Startup != "" {
		selected = plan.services
	}
	all := repo.AllServices()
	// No session (or a sandbox that does not run): nothing started.
	out, _ := o.lookAt(ctx, name, agent.ListServicesArgv(), agent.MaxServicesOutput)
	states := agent.ParseServices(out, all)
	infos := make([]ServiceInfo, 0, len(all))
	for _, s := range all {
		st, ok := states[s]
		if !ok {
			st = agent.ServiceState{State: agent.ServiceNotStarted}
		}
		infos = append(infos, ServiceInfo{Name: s, Selected: slices.Contains(selected, s), ServiceState: st})
	}
	return infos, nil
}
