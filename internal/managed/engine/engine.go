// Package engine is branchbox's narrow door to the Docker Engine API,
// through Docker's official Go client: local image checks (never a pull),
// container inspection, the port proxies, and finding and removing what a
// launch owns by its labels.
package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"
	"github.com/docker/go-connections/nat"
)

// Labels branchbox and Compose put on what a launch owns.
const (
	// ComposeProjectLabel is Compose's own label on the containers,
	// networks and volumes of a project.
	ComposeProjectLabel = "com.docker.compose.project"
	// ComposeServiceLabel is Compose's label naming a container's service.
	ComposeServiceLabel = "com.docker.compose.service"
	// ProjectLabel marks what branchbox creates outside Compose (the port
	// proxies) with the launch's Compose project name.
	ProjectLabel = "io.branchbox.project"
	// RoleLabel says what such an object is for.
	RoleLabel = "io.branchbox.role"
	// RolePortProxy is RoleLabel's value on a port proxy.
	RolePortProxy = "port-proxy"
)

// ErrNotFound reports an object the engine does not have.
var ErrNotFound = errors.New("not found")

// Engine is a connected Docker Engine API client.
type Engine struct {
	c *client.Client
}

// Open connects to the engine named by the environment (DOCKER_HOST, else
// the default socket) and negotiates the API version.
func Open() (*Engine, error) {
	c, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return nil, fmt.Errorf("docker engine: %w", err)
	}
	return &Engine{c: c}, nil
}

// Close releases the client's connections.
func (e *Engine) Close() error { return e.c.Close() }

// Ping checks that the engine answers.
func (e *Engine) Ping(ctx context.Context) error {
	if _, err := e.c.Ping(ctx); err != nil {
		return fmt.Errorf("the Docker engine does not answer: is dockerd running? (%w)", err)
	}
	return nil
}

// ImagePresent reports whether ref is an image the engine has locally.
// It never pulls.
func (e *Engine) ImagePresent(ctx context.Context, ref string) (bool, error) {
	_, err := e.c.ImageInspect(ctx, ref)
	if cerrdefs.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// ImageID is the local content id ("sha256:<64 hex>") of the image ref
// names on the engine; ErrNotFound when the engine has no such image. It
// never pulls.
func (e *Engine) ImageID(ctx context.Context, ref string) (string, error) {
	img, err := e.c.ImageInspect(ctx, ref)
	if cerrdefs.IsNotFound(err) {
		return "", ErrNotFound
	}
	if err != nil {
		return "", fmt.Errorf("docker engine: inspect image: %w", err)
	}
	return img.ID, nil
}

// ImageEnv is the environment the image ref names on the engine sets
// (its Config.Env, in order; empty, never nil, when it sets none). It
// never pulls.
func (e *Engine) ImageEnv(ctx context.Context, ref string) ([]string, error) {
	img, err := e.c.ImageInspect(ctx, ref)
	if err != nil {
		return nil, fmt.Errorf("docker engine: inspect image: %w", err)
	}
	env := []string{}
	if img.Config != nil {
		env = append(env, img.Config.Env...)
	}
	return env, nil
}

// Inspect returns the engine's view of container id.
func (e *Engine) Inspect(ctx context.Context, id string) (container.InspectResponse, error) {
	c, err := e.c.ContainerInspect(ctx, id)
	if cerrdefs.IsNotFound(err) {
		return c, ErrNotFound
	}
	return c, err
}

// Owned is what the engine holds of one launch.
type Owned struct {
	Containers []string // Compose's containers (ids)
	Proxies    []string // branchbox's port proxies (ids)
	Networks   []string // names
	Volumes    []string // names, Compose's and the named spools
}

// Empty reports whether nothing is left.
func (o Owned) Empty() bool {
	return len(o.Containers)+len(o.Proxies)+len(o.Networks)+len(o.Volumes) == 0
}

// Owned lists what belongs to Compose project project, plus the named
// volumes (the spools) that exist.
func (e *Engine) Owned(ctx context.Context, project string, named []string) (Owned, error) {
	var o Owned
	var err error
	if o.Containers, err = e.containers(ctx, ComposeProjectLabel+"="+project); err != nil {
		return o, err
	}
	if o.Proxies, err = e.containers(ctx, ProjectLabel+"="+project); err != nil {
		return o, err
	}
	nets, err := e.c.NetworkList(ctx, network.ListOptions{Filters: filters.NewArgs(filters.Arg("label", ComposeProjectLabel+"="+project))})
	if err != nil {
		return o, fmt.Errorf("docker engine: list networks: %w", err)
	}
	for _, n := range nets {
		o.Networks = append(o.Networks, n.Name)
	}
	vols, err := e.c.VolumeList(ctx, volume.ListOptions{Filters: filters.NewArgs(filters.Arg("label", ComposeProjectLabel+"="+project))})
	if err != nil {
		return o, fmt.Errorf("docker engine: list volumes: %w", err)
	}
	seen := map[string]bool{}
	for _, v := range vols.Volumes {
		seen[v.Name] = true
		o.Volumes = append(o.Volumes, v.Name)
	}
	for _, name := range named {
		if seen[name] {
			continue
		}
		_, err := e.c.VolumeInspect(ctx, name)
		if cerrdefs.IsNotFound(err) {
			continue
		}
		if err != nil {
			return o, fmt.Errorf("docker engine: inspect volume %s: %w", name, err)
		}
		o.Volumes = append(o.Volumes, name)
	}
	return o, nil
}

// ProjectContainers lists every container of Compose project project,
// running or not, as id and the service its label names ("" when it has
// none).
func (e *Engine) ProjectContainers(ctx context.Context, project string) (map[string]string, error) {
	list, err := e.c.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", ComposeProjectLabel+"="+project))})
	if err != nil {
		return nil, fmt.Errorf("docker engine: list containers: %w", err)
	}
	out := make(map[string]string, len(list))
	for _, c := range list {
		out[c.ID] = c.Labels[ComposeServiceLabel]
	}
	return out, nil
}

func (e *Engine) containers(ctx context.Context, label string) ([]string, error) {
	list, err := e.c.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", label))})
	if err != nil {
		return nil, fmt.Errorf("docker engine: list containers: %w", err)
	}
	ids := make([]string, 0, len(list))
	for _, c := range list {
		ids = append(ids, c.ID)
	}
	return ids, nil
}

// Remove removes what o lists: containers first (with their anonymous
// volumes), since networks and volumes in use cannot go. Objects already
// gone are not errors; the first other failure is returned after trying
// everything.
func (e *Engine) Remove(ctx context.Context, o Owned) error {
	var first error
	keep := func(err error, what string) {
		if err != nil && !cerrdefs.IsNotFound(err) && first == nil {
			first = fmt.Errorf("docker engine: remove %s: %w", what, err)
		}
	}
	for _, id := range append(append([]string(nil), o.Proxies...), o.Containers...) {
		keep(e.c.ContainerRemove(ctx, id, container.RemoveOptions{Force: true, RemoveVolumes: true}), "container "+ShortID(id))
	}
	for _, n := range o.Networks {
		keep(e.c.NetworkRemove(ctx, n), "network "+n)
	}
	for _, v := range o.Volumes {
		keep(e.c.VolumeRemove(ctx, v, true), "volume "+v)
	}
	return first
}

// Proxy is one loopback port proxy.
type Proxy struct {
	Project string
	Image   string // the exact port_proxy_image
	Network string // the primary container's network
	Target  string // the primary container's address on Network
	Host    uint16 // published on 127.0.0.1 only
	Runtime uint16 // the primary's port
	Name    string
}

// StartProxy creates and starts a port proxy: the proxy image run with
// the two arguments "RUNTIME" and "TARGET:RUNTIME", on the primary's
// network, its port published on the host's loopback only. The engine
// never pulls on create: a missing image fails.
func (e *Engine) StartProxy(ctx context.Context, p Proxy) (string, error) {
	port := nat.Port(strconv.Itoa(int(p.Runtime)) + "/tcp")
	cfg := &container.Config{
		Image:        p.Image,
		Cmd:          []string{strconv.Itoa(int(p.Runtime)), p.Target + ":" + strconv.Itoa(int(p.Runtime))},
		ExposedPorts: nat.PortSet{port: struct{}{}},
		Labels:       map[string]string{ProjectLabel: p.Project, RoleLabel: RolePortProxy},
	}
	host := &container.HostConfig{
		NetworkMode:    container.NetworkMode(p.Network),
		PortBindings:   nat.PortMap{port: {{HostIP: "127.0.0.1", HostPort: strconv.Itoa(int(p.Host))}}},
		ReadonlyRootfs: true,
		CapDrop:        []string{"ALL"},
		SecurityOpt:    []string{"no-new-privileges"},
	}
	created, err := e.c.ContainerCreate(ctx, cfg, host, nil, nil, p.Name)
	if err != nil {
		return "", fmt.Errorf("docker engine: create the port proxy for %d: %w", p.Host, err)
	}
	if err := e.c.ContainerStart(ctx, created.ID, container.StartOptions{}); err != nil {
		return created.ID, fmt.Errorf("docker engine: start the port proxy for %d: %w", p.Host, err)
	}
	return created.ID, nil
}

// ShortID is a container id's first 12 hex digits, as docker shows it.
func ShortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// maxExecOutput bounds what Exec keeps of a command's stdout.
const maxExecOutput = 64 << 10

// Exec runs cmd in container id as user, with no stdin and the
// container's own environment, and returns its stdout (at most 64 KiB)
// and exit status. It goes through the Engine API, not the docker CLI: a
// check that runs before every dispatch should not pay for a CLI start.
func (e *Engine) Exec(ctx context.Context, id, user string, cmd ...string) ([]byte, int, error) {
	created, err := e.c.ContainerExecCreate(ctx, id, container.ExecOptions{User: user, Cmd: cmd, AttachStdout: true, AttachStderr: true})
	if err != nil {
		return nil, 0, fmt.Errorf("docker engine: exec: %w", err)
	}
	att, err := e.c.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{})
	if err != nil {
		return nil, 0, fmt.Errorf("docker engine: exec: %w", err)
	}
	defer att.Close()
	var stdout bytes.Buffer
	if _, err := stdcopy.StdCopy(&Capped{W: &stdout, N: maxExecOutput}, io.Discard, att.Reader); err != nil {
		return nil, 0, fmt.Errorf("docker engine: exec output: %w", err)
	}
	ins, err := e.c.ContainerExecInspect(ctx, created.ID)
	if err != nil {
		return nil, 0, fmt.Errorf("docker engine: exec status: %w", err)
	}
	if ins.Running {
		return nil, 0, errors.New("docker engine: exec: still running after its output ended")
	}
	return stdout.Bytes(), ins.ExitCode, nil
}

// Capped passes the first N bytes written on to W and drops the rest, so
// a chatty command cannot make branchbox hold unbounded output.
type Capped struct {
	W io.Writer
	N int
}

func (c *Capped) Write(p []byte) (int, error) {
	if c.N > 0 {
		k := min(len(p), c.N)
		c.W.Write(p[:k])
		c.N -= k
	}
	return len(p), nil
}

// UsernsRemap reports whether the engine maps containers into a user
// namespace: then a uid in a container is not the same uid on the host.
func (e *Engine) UsernsRemap(ctx context.Context) (bool, error) {
	info, err := e.c.Info(ctx)
	if err != nil {
		return false, fmt.Errorf("docker engine: info: %w", err)
	}
	for _, opt := range info.SecurityOptions {
		if strings.Contains(opt, "name=userns") {
			return true, nil
		}
	}
	return false, nil
}

// VolumeDir returns the host directory holding named volume name's data.
// Only a plain volume of the local driver qualifies (no driver options:
// a local volume with options can bind any host path), so the directory
// is the engine's own.
func (e *Engine) VolumeDir(ctx context.Context, name string) (string, error) {
	v, err := e.c.VolumeInspect(ctx, name)
	if cerrdefs.IsNotFound(err) {
		return "", ErrNotFound
	}
	if err != nil {
		return "", fmt.Errorf("docker engine: inspect volume: %w", err)
	}
	if v.Driver != "local" || len(v.Options) != 0 || v.Name != name || !filepath.IsAbs(v.Mountpoint) {
		return "", fmt.Errorf("docker engine: volume %s is not a plain local volume", name)
	}
	return v.Mountpoint, nil
}
