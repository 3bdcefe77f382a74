package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"agentbox/internal/agent"
	"agentbox/internal/backend"
	"agentbox/internal/fdpass"
	"agentbox/internal/grant"
	"agentbox/internal/orchestrate"
	"agentbox/internal/wire"
)

// maxAdminFDs is the most descriptors one admin request carries: an
// exec's stdin, stdout and stderr.
const maxAdminFDs = 3

// listenAdmin serves the host admin socket: <state>/admin.sock, mode 0600
// in the 0700 state dir, and only for the broker's own uid (or root).
func (b *Broker) listenAdmin() error {
	path := filepath.Join(b.cfg.StateDir, AdminSock)
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return fmt.Errorf("admin socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return err
	}
	b.mu.Lock()
	b.admin = ln
	b.mu.Unlock()
	b.goWorker(func() {
		b.acceptLoop(ln, "admin", func(conn *net.UnixConn) {
			if !hostPeer(conn) {
				b.refuseConn(conn, wire.Errorf(wire.CodeDenied, "admin socket is for the broker's own user"))
				return
			}
			b.goWorker(func() {
				b.serveConn(b.ctx, newRightsConn(conn, maxAdminFDs), nil, b.dispatchAdmin)
			})
		})
	})
	return nil
}

// hostPeer reports whether the peer runs as the broker's uid or root.
func hostPeer(conn *net.UnixConn) bool {
	raw, err := conn.SyscallConn()
	if err != nil {
		return false
	}
	var uid = -1
	raw.Control(func(fd uintptr) {
		if cred, err := getPeerUID(int(fd)); err == nil {
			uid = cred
		}
	})
	return uid == os.Geteuid() || uid == 0
}

func (b *Broker) dispatchAdmin(ctx context.Context, cc *connCtx, req *wire.Request) *reply {
	files := cc.takeFiles()
	defer closeFiles(files)
	log := b.log.With("admin_op", truncate(req.Op, 32))
	var rep *reply
	switch req.Op {
	case "ping":
		rep = replyOK(map[string]any{"backend": b.cfg.Backend.Type()})
	case "ls":
		rep = b.adminList(ctx)
	case "usage":
		rep = b.adminUsage(ctx, req.Args)
	case "ps":
		rep = b.adminPs(ctx, req.Args, log)
	case "exec":
		rep = b.adminExec(ctx, cc, req.Args, files, log)
	case "outbox-ls", "outbox-show", "outbox-resolve":
		rep = b.adminOutbox(ctx, req.Op, req.Args, log)
	case "new", "destroy", "start", "stop", "fetch", "rights":
		// Mutations run on the executor, in order with sends.
		var r *reply
		b.interruptFor(req.Op, req.Args)
		err := b.runExec(ctx, nil, nil, func(ctx context.Context) { r = b.adminMutation(ctx, req.Op, req.Args, log) })
		if err != nil {
			r = replyErr(err)
		}
		rep = r
	default:
		rep = replyErr(wire.Errorf(wire.CodeUnknownOp, "unknown admin op %q", truncate(req.Op, 32)))
	}
	if rep.resp != nil && rep.resp.Error != nil {
		log.Info("admin request refused", "code", rep.resp.Error.Code, "detail", rep.resp.Error.Detail)
	}
	return rep
}

// interruptFor ends, before a host stop or destroy --force queues, the
// work the broker does in that sandbox: it never waits on what the
// sandbox it ends controls.
func (b *Broker) interruptFor(op string, raw json.RawMessage) {
	var a wire.DestroyArgs // the stop's NameArgs decode into it too
	if (op != "stop" && op != "destroy") || json.Unmarshal(raw, &a) != nil || a.Name == "" {
		return
	}
	if op == "stop" || a.Force {
		b.orchestrator.Interrupt(a.Name)
	}
}

// adminMutation runs new, destroy, start, stop or fetch.
func (b *Broker) adminMutation(ctx context.Context, op string, raw json.RawMessage, log *slog.Logger) *reply {
	var result any
	var err error
	switch op {
	case "new":
		result, err = b.adminNew(ctx, raw)
	case "destroy":
		var a wire.DestroyArgs
		if werr := decodeArgs(raw, &a); werr != nil {
			return replyErr(werr)
		}
		var n int
		n, err = b.orchestrator.DestroySandbox(ctx, a.Name, a.Force)
		result = wire.DestroyResult{Destroyed: n}
	case "fetch":
		var a wire.FetchArgs
		if werr := decodeArgs(raw, &a); werr != nil {
			return replyErr(werr)
		}
		var res orchestrate.FetchResult
		res, err = b.orchestrator.FetchSandbox(ctx, orchestrate.FetchRequest{Name: a.Name, Repo: a.Repo, Branch: a.Branch})
		result = wire.FetchResult{Ref: res.Ref, SHA: res.SHA}
	case "rights":
		result, err = b.adminRights(ctx, raw)
	case "start", "stop":
		var a wire.NameArgs
		if werr := decodeArgs(raw, &a); werr != nil {
			return replyErr(werr)
		}
		result = map[string]any{}
		if op == "start" {
			var note string
			note, err = b.orchestrator.StartSandbox(ctx, a.Name)
			result = wire.StartResult{Note: note}
		} else {
			err = b.orchestrator.StopSandbox(ctx, a.Name)
		}
	}
	// Every admin mutation's arguments name its sandbox (and a new child
	// its orchestrator): what it changed is in their tree.
	var target struct{ Name, Parent string }
	json.Unmarshal(raw, &target)
	b.refresh(target.Name, target.Parent)
	if err != nil {
		return b.adminFailure(op, err, log)
	}
	log.Info("admin request done")
	return replyOK(result)
}

// adminFailure turns an orchestrate error into the reply: a refusal says
// its cause; a fault is logged with its root cause and reported as it is
// (the admin socket's callers are the host user).
func (b *Broker) adminFailure(op string, err error, log *slog.Logger) *reply {
	var we *wire.Error
	if errors.As(err, &we) {
		return replyErr(we) // the request itself was refused (its arguments, its grant)
	}
	if r, ok := orchestrate.AsRefusal(err); ok {
		code := wire.CodeBadRequest
		if errors.Is(err, orchestrate.ErrNoSuchSandbox) {
			code = wire.CodeNotFound
		}
		return replyErr(&wire.Error{Code: code, Detail: r.Detail})
	}
	log.Error("admin request failed", "err", err)
	return replyErr(wire.Errorf(wire.CodeInternal, "%s failed: %v", op, err))
}

// adminRights shows a sandbox's rights, after the hand-made changes the
// request asks for.
func (b *Broker) adminRights(ctx context.Context, raw json.RawMessage) (any, error) {
	var a wire.RightsArgs
	if werr := decodeArgs(raw, &a); werr != nil {
		return nil, werr
	}
	add := grant.Rights{Mounts: grant.Dedupe(a.Add.Mounts), Loose: a.Add.Loose, Egress: grant.Dedupe(a.Add.Egress)}
	remove := grant.Rights{Mounts: grant.Dedupe(a.Remove.Mounts), Loose: a.Remove.Loose, Egress: grant.Dedupe(a.Remove.Egress)}
	rights, notes, err := b.orchestrator.HandRights(ctx, a.Name, add, remove)
	if err != nil {
		return nil, err
	}
	res := wire.RightsResult{Rights: []wire.RightInfo{}, Notes: notes}
	for _, r := range rights {
		info := wire.RightInfo{Kind: r.Kind, Item: r.Item, Owner: r.Owner}
		if !r.Expires.IsZero() {
			info.ExpiresAt = r.Expires.UTC().Format(time.RFC3339)
		}
		res.Rights = append(res.Rights, info)
	}
	return res, nil
}

func (b *Broker) adminNew(ctx context.Context, raw json.RawMessage) (any, error) {
	var a wire.NewArgs
	if werr := decodeArgs(raw, &a); werr != nil {
		return nil, werr
	}
	req := orchestrate.CreateRequest{Name: a.Name, Role: a.Role, Parent: a.Parent, Repo: a.Repo, Branch: a.Branch}
	if a.Role == wire.RoleOrchestrator {
		req.Grant = defaultGrant()
		if len(a.Grant) > 0 {
			g, err := parseGrant(a.Grant)
			if err != nil {
				return nil, wire.Errorf(wire.CodeBadRequest, "invalid grant: %v", err)
			}
			req.Grant = g
		}
	} else if len(a.Grant) > 0 {
		return nil, wire.Errorf(wire.CodeBadRequest, "a grant is only for an orchestrator")
	}
	sb, err := b.orchestrator.CreateSandbox(ctx, req)
	if err != nil {
		return nil, err
	}
	b.log.Info("sandbox created", "sandbox", sb.Name, "role", sb.Role, "branch", sb.Branch, "host_uid", sb.HostUID)
	return wire.NewResult{Name: sb.Name, UUID: sb.UUID, Branch: sb.Branch}, nil
}

func (b *Broker) adminList(ctx context.Context) *reply {
	sbs, err := b.store.Sandboxes(ctx)
	if err != nil {
		return replyErr(err)
	}
	usage, err := b.store.UsageRows(ctx)
	if err != nil {
		return replyErr(err)
	}
	tokens := make(map[string]int64, len(usage))
	for _, r := range usage {
		tokens[r.UUID] = r.InputTokens + r.OutputTokens
	}
	running := map[string]bool{}
	if insts, err := b.cfg.Backend.List(ctx); err == nil {
		for _, in := range insts {
			running[in.Name] = in.Running
		}
	}
	out := make([]wire.SandboxInfo, 0, len(sbs))
	for _, sb := range sbs {
		info := wire.SandboxInfo{Name: sb.Name, Role: sb.Role, State: sb.State, Running: running[sb.Name], Branch: sb.Branch, UUID: sb.UUID,
			Tokens: tokens[sb.UUID]}
		if sb.Parent != "" {
			p := sb.Parent
			info.Parent = &p
			info.State = orchestrate.ChildState(sb)
			if ref := orchestrate.LastManifest(sb); ref != "" {
				if st, ok, err := b.store.LatestStatus(ctx, sb.Parent, ref); err == nil && ok {
					info.LastStatus = &st
				}
			}
		}
		if s := b.SocketPath(sb.Name); s != "" {
			info.Socket = &s
		}
		out = append(out, info)
	}
	return replyOK(out)
}

// adminUsage answers "usage" from broker.db (a read: not on the
// executor). With a name: that name's rows (a name used again has one per
// sandbox) and, unless it is a child now, the rows of the tree it roots.
// Each tree of the rows gets its total over all its rows.
func (b *Broker) adminUsage(ctx context.Context, raw json.RawMessage) *reply {
	var a wire.UsageArgs
	if werr := decodeArgs(raw, &a); werr != nil {
		return replyErr(werr)
	}
	rows, err := b.store.UsageRows(ctx)
	if err != nil {
		return replyErr(err)
	}
	sbs, err := b.store.Sandboxes(ctx)
	if err != nil {
		return replyErr(err)
	}
	live := make(map[string]bool, len(sbs))
	exists, child := false, false
	for _, sb := range sbs {
		live[sb.UUID] = true
		if sb.Name == a.Name {
			exists, child = true, sb.Role == wire.RoleChild
		}
	}
	res := wire.UsageResult{Rows: []wire.UsageRow{}, Trees: []wire.TreeUsage{}}
	totals := map[string]*wire.TreeUsage{}
	for _, r := range rows {
		u := r.Usage
		t := totals[r.Tree]
		if t == nil {
			t = &wire.TreeUsage{Tree: r.Tree}
			totals[r.Tree] = t
		}
		t.Usage.Add(u)
		if a.Name != "" && r.Name != a.Name && (child || r.Tree != a.Name) {
			continue
		}
		res.Rows = append(res.Rows, wire.UsageRow{Name: r.Name, UUID: r.UUID, Tree: r.Tree, Usage: u,
			Destroyed: !live[r.UUID], Updated: r.Updated.UTC()})
	}
	if len(res.Rows) == 0 && a.Name != "" && !exists {
		return b.adminFailure("usage", b.orchestrator.NoSuchSandbox(ctx, a.Name), b.log)
	}
	// Rows are sorted by tree: each tree's total follows once.
	for i, r := range res.Rows {
		if i == 0 || res.Rows[i-1].Tree != r.Tree {
			res.Trees = append(res.Trees, *totals[r.Tree])
		}
	}
	return replyOK(res)
}

// adminPs lists a sandbox's services and their state, which tmux inside
// the sandbox tells (never the sandbox's files read on the host).
func (b *Broker) adminPs(ctx context.Context, raw json.RawMessage, log *slog.Logger) *reply {
	var a wire.NameArgs
	if werr := decodeArgs(raw, &a); werr != nil {
		return replyErr(werr)
	}
	infos, err := b.orchestrator.Services(ctx, a.Name)
	if err != nil {
		return b.adminFailure("ps", err, log)
	}
	res := wire.PsResult{Services: make([]wire.ServiceInfo, 0, len(infos))}
	for _, s := range infos {
		si := wire.ServiceInfo{Name: s.Name, Selected: s.Selected, State: s.State, PID: s.PID}
		if s.State == agent.ServiceExited && s.Code >= 0 {
			si.ExitCode = &s.Code
		}
		res.Services = append(res.Services, si)
	}
	return replyOK(res)
}

// adminExec runs a command in a sandbox with the caller's descriptors as
// its streams, and answers with its exit status once it has ended. The
// caller hanging up first ends the command.
func (b *Broker) adminExec(ctx context.Context, cc *connCtx, raw json.RawMessage, files []*os.File, log *slog.Logger) *reply {
	var a wire.ExecArgs
	if werr := decodeArgs(raw, &a); werr != nil {
		return replyErr(werr)
	}
	if len(files) != 3 {
		return replyErr(wire.Errorf(wire.CodeBadRequest, "exec needs the command's stdin, stdout and stderr as 3 descriptors (got %d)", len(files)))
	}
	if len(a.Argv) == 0 {
		return replyErr(wire.Errorf(wire.CodeBadRequest, "exec needs a command"))
	}
	if _, err := b.store.Sandbox(ctx, a.Name); err != nil {
		return b.adminFailure("exec", b.orchestrator.NoSuchSandbox(ctx, a.Name), log)
	}
	env := a.Env
	if srv := b.server(a.Name); srv != nil && srv.model != nil && b.cfg.Model != nil {
		// `claude` run by hand (an orchestrator's own agent) reaches its
		// model like a child's; the caller's variables win.
		env = agent.ClaudeEnv()
		maps.Copy(env, a.Env)
	}
	runCtx, stop := cc.watchHangup(ctx)
	code, err := b.cfg.Backend.Exec(runCtx, a.Name, backend.ExecOptions{
		Argv: a.Argv, User: a.User, Env: env, Dir: a.Dir, TTY: a.TTY,
		Stdin: files[0], Stdout: files[1], Stderr: files[2],
	})
	hungUp := runCtx.Err() != nil && ctx.Err() == nil
	stop()
	switch {
	case hungUp:
		return &reply{hangup: true}
	case errors.Is(err, backend.ErrNotRunning):
		return replyErr(wire.Errorf(wire.CodeBadRequest, "sandbox `%s` is not running (start it with 'jailbee start %s')", a.Name, a.Name))
	case errors.Is(err, backend.ErrUnsupported):
		return replyErr(wire.Errorf(wire.CodeBadRequest, "%v", err))
	case err != nil:
		log.Error("exec failed", "sandbox", a.Name, "err", err)
		return replyErr(wire.Errorf(wire.CodeInternal, "exec in `%s` failed: %v", a.Name, err))
	}
	return replyOK(wire.ExecResult{Exit: code})
}

// parseGrant validates a grant document strictly (the spec's schema) and
// returns its canonical encoding.
func parseGrant(raw json.RawMessage) (string, error) {
	g, err := grant.Parse(raw)
	if err != nil {
		return "", err
	}
	out, err := json.Marshal(g)
	return string(out), err
}

// defaultGrant is an orchestrator's grant when `jailbee new` names none.
func defaultGrant() string {
	out, _ := json.Marshal(grant.Default())
	return string(out)
}

// rightsConn is an admin connection whose reads also collect descriptors
// the client sent as SCM_RIGHTS, at most max per request; more are closed
// at once and the request is refused.
type rightsConn struct {
	*net.UnixConn
	max int

	mu    sync.Mutex
	files []*os.File
	extra bool // more than max arrived
}

func newRightsConn(c *net.UnixConn, max int) *rightsConn { return &rightsConn{UnixConn: c, max: max} }

func (c *rightsConn) Read(p []byte) (int, error) {
	n, files, truncated, err := fdpass.Read(c.UnixConn, p, c.max)
	if len(files) > 0 || truncated {
		c.collect(files, truncated)
	}
	return n, err
}

func (c *rightsConn) collect(files []*os.File, truncated bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.extra = c.extra || truncated
	for _, f := range files {
		if len(c.files) >= c.max {
			f.Close()
			c.extra = true
			continue
		}
		c.files = append(c.files, f)
	}
}

// take returns the descriptors received so far and forgets them; nil when
// more than max arrived (all closed).
func (c *rightsConn) take() []*os.File {
	c.mu.Lock()
	defer c.mu.Unlock()
	files, extra := c.files, c.extra
	c.files, c.extra = nil, false
	if extra {
		closeFiles(files)
		return nil
	}
	return files
}

func (c *rightsConn) Close() error {
	closeFiles(c.take())
	return c.UnixConn.Close()
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}
