package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"agentbox/internal/backend"
	"agentbox/internal/gitx"
	"agentbox/internal/grant"
	"agentbox/internal/store"
	"agentbox/internal/wire"
)

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
		for {
			conn, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			if !hostPeer(conn) {
				b.refuseConn(conn, wire.Errorf(wire.CodeDenied, "admin socket is for the broker's own user"))
				continue
			}
			b.goWorker(func() { b.serveConn(b.ctx, conn, b.dispatchAdmin) })
		}
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
	var rep *reply
	switch req.Op {
	case "ping":
		rep = replyOK(map[string]any{"backend": b.cfg.Backend.Type()})
	case "ls":
		rep = b.adminList(ctx)
	case "exec_info":
		rep = b.adminExecInfo(ctx, req.Args)
	case "new", "destroy":
		// Mutations run on the executor, in order with sends.
		var r *reply
		err := b.runExec(ctx, nil, func() {
			if req.Op == "new" {
				r = b.adminNew(ctx, req.Args)
			} else {
				r = b.adminDestroy(ctx, req.Args)
			}
		})
		if err != nil {
			r = replyErr(err)
		}
		rep = r
	default:
		rep = replyErr(wire.Errorf(wire.CodeUnknownOp, "unknown admin op %q", truncate(req.Op, 32)))
	}
	if rep.resp.Error != nil {
		b.log.Info("admin request", "op", req.Op, "code", rep.resp.Error.Code, "detail", rep.resp.Error.Detail)
	}
	return rep
}

// SandboxInfo is one entry of `jailbee ls --json`.
type SandboxInfo struct {
	Name   string  `json:"name"`
	Role   string  `json:"role"`
	Parent *string `json:"parent"`
	State  string  `json:"state"`
	Branch string  `json:"branch"`
	UUID   string  `json:"uuid"`
	Socket *string `json:"socket"`
}

func (b *Broker) adminList(ctx context.Context) *reply {
	sbs, err := b.store.Sandboxes(ctx)
	if err != nil {
		return replyErr(err)
	}
	out := make([]SandboxInfo, 0, len(sbs))
	for _, sb := range sbs {
		info := SandboxInfo{Name: sb.Name, Role: sb.Role, State: sb.State, Branch: sb.Branch, UUID: sb.UUID}
		if sb.Parent != "" {
			p := sb.Parent
			info.Parent = &p
		}
		if s := b.SocketPath(sb.Name); s != "" {
			info.Socket = &s
		}
		out = append(out, info)
	}
	return replyOK(out)
}

// NewArgs are the admin new op's arguments.
type NewArgs struct {
	Name   string          `json:"name"`
	Repo   string          `json:"repo"`
	Branch string          `json:"branch"`
	Role   string          `json:"role"`
	Parent string          `json:"parent,omitempty"`
	Grant  json.RawMessage `json:"grant,omitempty"`
}

func adminErr(format string, args ...any) *reply {
	return replyErr(wire.Errorf(wire.CodeBadRequest, format, args...))
}

func (b *Broker) adminNew(ctx context.Context, raw json.RawMessage) *reply {
	var a NewArgs
	if werr := decodeArgs(raw, &a); werr != nil {
		return replyErr(werr)
	}
	if backend.ValidateName(a.Name) != nil {
		return adminErr("name must match ^[a-z0-9][a-z0-9-]{0,63}$")
	}
	if _, err := b.store.Sandbox(ctx, a.Name); err == nil {
		return adminErr("sandbox `%s` already exists", a.Name)
	}
	sb := store.Sandbox{Name: a.Name, Role: a.Role, State: "running"}
	switch a.Role {
	case store.RoleOrchestrator:
		sb.Grant = defaultGrant()
		if len(a.Grant) > 0 {
			g, err := parseGrant(a.Grant)
			if err != nil {
				return adminErr("invalid grant: %v", err)
			}
			sb.Grant = g
		}
	case store.RoleChild:
		parent, err := b.store.Sandbox(ctx, a.Parent)
		if err != nil || parent.Role != store.RoleOrchestrator {
			return adminErr("parent `%s` is not an orchestrator", a.Parent)
		}
		sb.Parent = parent.Name
		if a.Repo == "" {
			a.Repo = parent.Repo
		}
	default:
		return adminErr("role must be orchestrator or child")
	}
	if !filepath.IsAbs(a.Repo) {
		return adminErr("repo must be an absolute path")
	}
	sb.Repo = a.Repo
	branch, commit, err := resolveSource(ctx, a.Repo, a.Branch)
	if err != nil {
		return adminErr("%v", err)
	}
	sb.Branch = branch
	inst, err := b.cfg.Backend.Create(ctx, backend.CreateOptions{Name: a.Name, Source: backend.GitSource{Repo: a.Repo, Commit: commit, Branch: branch}})
	if errors.Is(err, backend.ErrExists) {
		// Not in broker.db but present in the backend: left by a create
		// the broker did not finish (it died between the two).
		return adminErr("a sandbox `%s` exists in the backend without a broker record (an interrupted create?): remove it with 'jailbee destroy %s --force'", a.Name, a.Name)
	}
	if err != nil {
		b.log.Error("create sandbox", "name", a.Name, "err", err)
		return adminErr("cannot create sandbox `%s` (see the broker log)", a.Name)
	}
	sb.UUID = inst.UUID
	if err := b.cfg.Backend.Start(ctx, a.Name); err != nil {
		b.cfg.Backend.Destroy(ctx, a.Name)
		return replyErr(err)
	}
	if err := b.store.CreateSandbox(ctx, sb); err != nil {
		b.cfg.Backend.Destroy(ctx, a.Name)
		return replyErr(err)
	}
	if err := b.serveSandbox(sb); err != nil {
		b.log.Error("serve new sandbox", "name", a.Name, "err", err)
		b.store.DeleteSandbox(ctx, a.Name)
		b.cfg.Backend.Destroy(ctx, a.Name)
		return adminErr("cannot serve the socket of `%s`: %v", a.Name, err)
	}
	b.runRound()
	b.log.Info("sandbox created", "name", a.Name, "role", a.Role, "branch", branch)
	return replyOK(map[string]any{"name": a.Name, "uuid": sb.UUID, "branch": branch, "socket": b.SocketPath(a.Name)})
}

// resolveSource picks the branch (default: the repo's current branch) and
// the commit to start from: the branch's tip if it exists, else HEAD.
func resolveSource(ctx context.Context, repo, branch string) (string, string, error) {
	if branch == "" {
		cur, err := gitx.CurrentBranch(ctx, repo)
		if err != nil {
			return "", "", fmt.Errorf("cannot tell the repository's current branch (name one with --branch)")
		}
		branch = cur
	}
	if commit, err := gitx.ResolveCommit(ctx, repo, "refs/heads/"+branch); err == nil {
		return branch, commit, nil
	}
	commit, err := gitx.ResolveCommit(ctx, repo, "HEAD")
	if err != nil {
		return "", "", fmt.Errorf("the repository has no commit to start from")
	}
	return branch, commit, nil
}

// DestroyArgs are the admin destroy op's arguments.
type DestroyArgs struct {
	Name  string `json:"name"`
	Force bool   `json:"force"`
}

func (b *Broker) adminDestroy(ctx context.Context, raw json.RawMessage) *reply {
	var a DestroyArgs
	if werr := decodeArgs(raw, &a); werr != nil {
		return replyErr(werr)
	}
	sb, err := b.store.Sandbox(ctx, a.Name)
	if errors.Is(err, store.ErrNotFound) && a.Force && backend.ValidateName(a.Name) == nil {
		// A backend instance without a broker record: nothing else refers
		// to it, so --force removes it.
		if err := b.cfg.Backend.Destroy(ctx, a.Name); err == nil {
			b.log.Info("unrecorded sandbox destroyed", "name", a.Name)
			return replyOK(map[string]any{"destroyed": 1})
		}
	}
	if err != nil {
		return replyErr(wire.Errorf(wire.CodeNotFound, "no sandbox `%s`", truncate(a.Name, 64)))
	}
	var victims []store.Sandbox
	if sb.Role == store.RoleOrchestrator {
		all, err := b.store.Sandboxes(ctx)
		if err != nil {
			return replyErr(err)
		}
		for _, c := range all {
			if c.Parent == sb.Name {
				victims = append(victims, c)
			}
		}
		if len(victims) > 0 && !a.Force {
			return adminErr("`%s` has %d children: destroy them first, or use --force to destroy them too", sb.Name, len(victims))
		}
	}
	victims = append(victims, sb)
	if !a.Force {
		if dirty := b.dirty(ctx, sb.Name); dirty != "" {
			return adminErr("%s", dirty)
		}
	}
	for _, v := range victims {
		b.stopServing(v.Name)
		if err := b.cfg.Backend.Destroy(ctx, v.Name); err != nil && !errors.Is(err, backend.ErrNotFound) {
			b.log.Error("destroy sandbox", "name", v.Name, "err", err)
			return adminErr("cannot destroy `%s` (see the broker log)", v.Name)
		}
		if err := b.store.DeleteSandbox(ctx, v.Name); err != nil {
			return replyErr(err)
		}
		b.log.Info("sandbox destroyed", "name", v.Name)
	}
	b.runRound()
	return replyOK(map[string]any{"destroyed": len(victims)})
}

// dirty returns a refusal when the sandbox's checkout has uncommitted
// changes, "" when it is clean or cannot be inspected from the host.
func (b *Broker) dirty(ctx context.Context, name string) string {
	remote, err := b.cfg.Backend.GitRemote(ctx, name)
	if err != nil || !filepath.IsAbs(remote) {
		return ""
	}
	clean, err := gitx.IsClean(ctx, remote)
	if err == nil && !clean {
		return fmt.Sprintf("`%s` has uncommitted changes: commit them, or use --force", name)
	}
	return ""
}

// ExecInfo tells a host command how to reach a sandbox's backend.
type ExecInfo struct {
	Backend  string `json:"backend"`
	StateDir string `json:"state_dir"`
	Insecure bool   `json:"insecure"`
	State    string `json:"state"`
}

func (b *Broker) adminExecInfo(ctx context.Context, raw json.RawMessage) *reply {
	var a struct {
		Name string `json:"name"`
	}
	if werr := decodeArgs(raw, &a); werr != nil {
		return replyErr(werr)
	}
	sb, err := b.store.Sandbox(ctx, a.Name)
	if err != nil {
		return replyErr(wire.Errorf(wire.CodeNotFound, "no sandbox `%s`", truncate(a.Name, 64)))
	}
	return replyOK(ExecInfo{Backend: b.cfg.Backend.Type(), StateDir: b.cfg.StateDir, Insecure: b.cfg.Insecure, State: sb.State})
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
