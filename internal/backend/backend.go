// Package backend defines the one way the broker touches a sandbox.
// The interface is written for Incus system containers first; the local
// (bubblewrap) backend follows it.
package backend

import (
	"context"
	"errors"
	"io"
)

// SocketMountPath is where a sandbox sees its broker-socket directory.
const SocketMountPath = "/run/jailbee/orchestration"

// SocketDeviceName is the Incus disk device that carries the socket dir.
const SocketDeviceName = "jailbee-orchestration"

// AgentUID and AgentGID are the non-root ids commands and agents run as
// inside a sandbox unless a user is named.
const (
	AgentUID = 1000
	AgentGID = 1000
)

// Errors shared by every backend.
var (
	ErrNotFound   = errors.New("sandbox not found")
	ErrExists     = errors.New("sandbox already exists")
	ErrNotRunning = errors.New("sandbox is not running")
)

// Instance is what a backend knows of one sandbox.
type Instance struct {
	Name    string // backend instance name (unique per backend)
	UUID    string // stable instance uuid (Incus volatile.uuid)
	Running bool
}

// GitSource says where a new sandbox's checkout comes from.
type GitSource struct {
	Repo   string // host path of the source repository
	Commit string // commit to check out (full sha); empty: Branch's tip in Repo
	Branch string // branch to create/check out in the sandbox
}

// CreateOptions describes a new sandbox.
type CreateOptions struct {
	Name   string
	Source GitSource
}

// ExecOptions describes one command inside a sandbox.
type ExecOptions struct {
	Argv   []string
	User   string            // "" = the agent user; "root", or a numeric uid
	Env    map[string]string // added to the sandbox's base environment
	Dir    string            // "" = the checkout; a relative path is under the checkout
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
}

// Backend creates, runs and removes sandboxes.
type Backend interface {
	// Type names the implementation ("local", "incus").
	Type() string
	// Create makes a stopped sandbox with a checkout of src.
	Create(ctx context.Context, opts CreateOptions) (Instance, error)
	Start(ctx context.Context, name string) error
	Stop(ctx context.Context, name string) error
	// Destroy removes the sandbox and everything it holds.
	Destroy(ctx context.Context, name string) error
	// Exec runs a command inside a running sandbox and returns its exit status.
	Exec(ctx context.Context, name string, opts ExecOptions) (int, error)
	// AttachSocket binds the host directory dir read-only at SocketMountPath,
	// replacing any earlier attachment.
	AttachSocket(ctx context.Context, name, dir string) error
	// DetachSocket removes the socket attachment (no error if absent).
	DetachSocket(ctx context.Context, name string) error
	// List returns every sandbox this backend manages, with uuids, so the
	// broker can detect copies and uuid conflicts.
	List(ctx context.Context) ([]Instance, error)
	// GitRemote is a location host git can fetch the sandbox's repository
	// from (local: the checkout's host path; incus: a git ext:: URL). Used
	// by gitx; never shown to a sandbox.
	GitRemote(ctx context.Context, name string) (string, error)
}
