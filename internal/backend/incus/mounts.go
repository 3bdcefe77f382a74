package incus

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"agentbox/internal/backend"
	"agentbox/internal/mountinfo"
)

// Root inside a container may mount anything over anything in its own
// mount namespace: a fake over the jailbee client the broker runs there
// (every Exec's framer), or a directory of its own over the socket
// directory. The devices Incus placed are still there, underneath, and
// `incus exec` would run the fake. So the backend looks at what a path
// inside really resolves to, from the host: the mount table of the
// container's init (/proc/PID/mountinfo, which any host user may read,
// and whose mount namespace is the one `incus exec` enters). The mount a
// path ends on must be the device's: the same filesystem and the same
// file or directory in it (mountinfo's major:minor and root) as the host
// path the device names. Exec refuses while the client is covered, and a
// round's Restore puts both back on top.
//
// What this does not stop: root inside can ptrace any process of its
// container, the genuine framer included. A command's output is only as
// trustworthy as the container it ran in; what this stops is the broker
// running a program root inside chose in place of its own.

// mountEntry is one line of a mountinfo file.
type mountEntry struct {
	id, parent int
	dev        string // major:minor
	root       string // the mounted file or directory, in its filesystem
	point      string // where it is mounted
}

// mountID names a file or directory of a filesystem.
type mountID struct{ dev, root string }

func (m mountEntry) ident() mountID { return mountID{m.dev, m.root} }

// parseMountinfo reads the lines of a mountinfo file.
func parseMountinfo(data []byte) ([]mountEntry, error) {
	var out []mountEntry
	for line := range bytes.Lines(data) {
		f := strings.Fields(string(line))
		if len(f) < 5 {
			continue
		}
		id, err1 := strconv.Atoi(f[0])
		parent, err2 := strconv.Atoi(f[1])
		if err1 != nil || err2 != nil {
			return nil, errors.New("a malformed mount table")
		}
		out = append(out, mountEntry{id: id, parent: parent, dev: f[2], root: mountinfo.Unescape(f[3]), point: mountinfo.Unescape(f[4])})
	}
	if len(out) == 0 {
		return nil, errors.New("an empty mount table")
	}
	return out, nil
}

// visibleMount is the mount a path resolves into: from the root mount,
// down each component of p, always taking the topmost mount stacked on a
// mount point. ok is false for a table without a root mount.
func visibleMount(mounts []mountEntry, p string) (mountEntry, bool) {
	top := func(cur mountEntry, point string) mountEntry {
		for {
			i := slices.IndexFunc(mounts, func(m mountEntry) bool {
				return m.parent == cur.id && m.id != cur.id && m.point == point
			})
			if i < 0 {
				return cur
			}
			// Of several on one point (shadowed by propagation), the last.
			for j := len(mounts) - 1; j > i; j-- {
				if mounts[j].parent == cur.id && mounts[j].id != cur.id && mounts[j].point == point {
					i = j
					break
				}
			}
			cur = mounts[i]
		}
	}
	ids := map[int]bool{}
	for _, m := range mounts {
		ids[m.id] = true
	}
	// The root mount: at "/", its parent outside the table (or itself).
	i := slices.IndexFunc(mounts, func(m mountEntry) bool {
		return m.point == "/" && (m.parent == m.id || !ids[m.parent])
	})
	if i < 0 {
		return mountEntry{}, false
	}
	cur := top(mounts[i], "/")
	p = path.Clean("/" + p)
	prefix := ""
	for c := range strings.SplitSeq(strings.TrimPrefix(p, "/"), "/") {
		if c == "" {
			continue
		}
		prefix += "/" + c
		cur = top(cur, prefix)
	}
	return cur, true
}

// placedAt reports whether p resolves to the mount of want in the table:
// a mount on p itself, of that file or directory.
func placedAt(mounts []mountEntry, p string, want mountID) bool {
	m, ok := visibleMount(mounts, p)
	return ok && m.point == path.Clean(p) && m.ident() == want
}

// hostMountID is what a bind mount of the host path p shows in a
// container's mount table: the host's own mount p is on, and p within
// its filesystem.
func hostMountID(p string) (mountID, error) {
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return mountID{}, errors.New("a placed file is gone from the host")
	}
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return mountID{}, fmt.Errorf("read the host's mount table: %w", err)
	}
	mounts, err := parseMountinfo(data)
	if err != nil {
		return mountID{}, err
	}
	m, ok := visibleMount(mounts, real)
	if !ok {
		return mountID{}, errors.New("the host's mount table has no root")
	}
	rel, err := filepath.Rel(m.point, real)
	if err != nil {
		return mountID{}, err
	}
	return mountID{dev: m.dev, root: path.Join(m.root, rel)}, nil
}

// Things the backend places in a sandbox, as Instance.Covered names them.
const (
	coveredClient = "client" // the jailbee client at ClientPath
	coveredSocket = "socket" // the socket directory at SocketMountPath
	coveredModel  = "model"  // the model socket's directory at ModelMountPath
)

// coverName is what Instance.Covered calls a directory of kind.
func coverName(kind backend.SocketKind) string {
	if kind == backend.ModelSocket {
		return coveredModel
	}
	return coveredSocket
}

// socketDir is a directory attached to a container as kind.
type socketDir struct {
	kind backend.SocketKind
	dir  string
}

// attached are the socket directories a container has (each "" for none).
func attached(socket, model string) []socketDir {
	var out []socketDir
	if socket != "" {
		out = append(out, socketDir{backend.OrchestrationSocket, socket})
	}
	if model != "" {
		out = append(out, socketDir{backend.ModelSocket, model})
	}
	return out
}

// covered lists what of the client and the socket directories something
// inside the running container covers: client, if the backend places
// one, and each of dirs.
func (b *Backend) covered(ctx context.Context, name string, dirs []socketDir, client bool) ([]string, error) {
	mounts, err := b.initMounts(ctx, name)
	if unreadable(err) {
		mounts = nil // nothing is seen placed: all of it counts as covered
	} else if err != nil {
		return nil, err
	}
	return b.coveredIn(mounts, dirs, client)
}

// coveredIn is covered over mounts, a mount table already read.
func (b *Backend) coveredIn(mounts []mountEntry, dirs []socketDir, client bool) ([]string, error) {
	var out []string
	check := func(what, inside, host string) error {
		want, err := b.hostID(host, false)
		if err != nil {
			if what != coveredClient {
				return nil // a directory gone from the host serves nothing to cover
			}
			return err
		}
		if placedAt(mounts, inside, want) {
			return nil
		}
		// The host's own mounts may have changed since: look again.
		if want, err = b.hostID(host, true); err != nil {
			return err
		}
		if !placedAt(mounts, inside, want) {
			out = append(out, what)
		}
		return nil
	}
	if client && b.opts.Client != "" {
		if err := check(coveredClient, ClientPath, b.opts.Client); err != nil {
			return nil, err
		}
	}
	for _, d := range dirs {
		if err := check(coverName(d.kind), d.kind.MountPath(), d.dir); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// hostID is hostMountID, remembered (again: look afresh).
func (b *Backend) hostID(p string, again bool) (mountID, error) {
	b.mu.Lock()
	id, ok := b.hostIDs[p]
	b.mu.Unlock()
	if ok && !again {
		return id, nil
	}
	id, err := hostMountID(p)
	if err != nil {
		return mountID{}, err
	}
	b.mu.Lock()
	if len(b.hostIDs) > 4096 {
		clear(b.hostIDs) // socket directories come and go
	}
	b.hostIDs[p] = id
	b.mu.Unlock()
	return id, nil
}

// ErrCovered: something inside the sandbox covers the jailbee client the
// broker placed there.
var ErrCovered = errors.New("the jailbee client inside the sandbox is covered by something else (a mount by root inside?): no command runs there until the broker puts it back")

// checkClient returns ErrCovered when the client inside the running
// container is not the one the backend placed.
func (b *Backend) checkClient(ctx context.Context, name string) error {
	if b.opts.Client == "" {
		return nil
	}
	covered, err := b.covered(ctx, name, nil, true)
	if err != nil {
		return err
	}
	if len(covered) > 0 {
		return fmt.Errorf("exec in %s: %w", name, ErrCovered)
	}
	return nil
}

// initProc is a container's init as last seen: its host pid and start
// time (a pid reused after the container restarted has another).
type initProc struct {
	pid   int
	start string
}

// initMounts reads the mount table of the running container's init.
func (b *Backend) initMounts(ctx context.Context, name string) ([]mountEntry, error) {
	for attempt := 0; attempt < 2; attempt++ {
		b.mu.Lock()
		p, ok := b.inits[name]
		b.mu.Unlock()
		if !ok || attempt > 0 {
			var err error
			if p, err = b.lookInit(ctx, name); unreadable(err) {
				return nil, fmt.Errorf("read the mount table of %s: %w", name, err)
			} else if err != nil {
				return nil, err
			}
		}
		data, err := readMountinfo(p.pid)
		if errors.Is(err, errMountTableTooLarge) {
			return nil, fmt.Errorf("read the mount table of %s: %w", name, err)
		}
		if err == nil && procStart(p.pid) == p.start {
			return parseMountinfo(data)
		}
	}
	return nil, fmt.Errorf("read the mount table of %s: its init keeps changing", name)
}

// maxMountTable bounds what is read of a container's mount table. Root
// inside makes mounts at will (16 binds of /usr on itself, each doubled
// by propagation, make 65,000), and the kernel's cost of each line of
// the table grows with their number: that whole table took 2 min 16 s to
// read, and every Exec and every round (all sandboxes') read it. A
// container has some 25 mounts (2.5 KiB); this holds 25 times as many.
const maxMountTable = 64 << 10

// errMountTableTooLarge: a container's mount table is past
// maxMountTable. What it covers cannot be told: it counts as covering
// everything (fail closed).
var errMountTableTooLarge = fmt.Errorf("more than %d KiB of mounts (made by root inside?): what they cover is not looked at", maxMountTable>>10)

// readMountinfo reads /proc/PID/mountinfo, at most maxMountTable bytes.
func readMountinfo(pid int) ([]byte, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxMountTable+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxMountTable {
		return nil, errMountTableTooLarge
	}
	return data, nil
}

// maxState bounds what is read of Incus's answer for a container's state
// (lookInit), which lists every network interface and address inside:
// root inside makes those at will (30,000 addresses on lo made 3.3 MiB,
// and 8 MiB of the broker's memory, at each look). A container has a
// few KiB; this holds some 2,000 addresses.
const maxState = 256 << 10

// errStateTooLarge: a container's state is past maxState. Its init
// cannot be told, nor what covers what: it counts as covering
// everything (fail closed), like errMountTableTooLarge.
var errStateTooLarge = fmt.Errorf("Incus's state of the container is more than %d KiB (network addresses made by root inside?): what it covers is not looked at", maxState>>10)

// unreadable reports whether err says what a container covers cannot be
// told (a mount table or state past its bound).
func unreadable(err error) bool {
	return errors.Is(err, errMountTableTooLarge) || errors.Is(err, errStateTooLarge)
}

// lookInit asks Incus for the running container's init.
func (b *Backend) lookInit(ctx context.Context, name string) (initProc, error) {
	if backend.ValidateName(name) != nil {
		return initProc{}, fmt.Errorf("%w: %q", backend.ErrNotFound, name)
	}
	var st struct {
		Status string `json:"status"`
		PID    int    `json:"pid"`
	}
	data, err := b.incusMax(ctx, nil, maxState, "query", b.projectPath("/1.0/instances/"+url.PathEscape(name)+"/state"))
	if errors.Is(err, errPrintedTooMuch) {
		return initProc{}, fmt.Errorf("the state of %s: %w", name, errStateTooLarge)
	} else if err != nil {
		return initProc{}, err
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return initProc{}, fmt.Errorf("the state of %s: %w", name, err)
	}
	if st.Status != "Running" || st.PID <= 0 {
		b.forgetInit(name)
		return initProc{}, fmt.Errorf("%w: %s", backend.ErrNotRunning, name)
	}
	p := initProc{pid: st.PID, start: procStart(st.PID)}
	if p.start == "" {
		return initProc{}, fmt.Errorf("%w: %s", backend.ErrNotRunning, name)
	}
	b.mu.Lock()
	b.inits[name] = p
	b.mu.Unlock()
	return p, nil
}

func (b *Backend) forgetInit(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.inits, name)
}

// procStart is the start time of a host process ("" if there is none):
// field 22 of /proc/PID/stat, after the command name in parentheses.
func procStart(pid int) string {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 20 {
		return ""
	}
	return f[19]
}

// Restore implements backend.Backend: each placed device something
// inside covers (Instance.Covered) is removed and added again, which
// mounts it on top of whatever covers it.
func (b *Backend) Restore(ctx context.Context, name string) error {
	in, err := b.raw(ctx, name)
	if err != nil {
		return err
	}
	if in.Status != "Running" {
		return nil
	}
	// A table past its bound stays past it whatever is mounted: adding
	// the devices again would only cost a change of the container in
	// every round.
	mounts, err := b.initMounts(ctx, name)
	if unreadable(err) {
		return fmt.Errorf("restore in %s: %w", name, err)
	} else if err != nil {
		return err
	}
	dirs := attached(in.Devices[backend.SocketDeviceName]["source"], in.Devices[backend.ModelDeviceName]["source"])
	covered, err := b.coveredIn(mounts, dirs, true)
	if err != nil {
		return err
	}
	for _, what := range covered {
		dev := clientDevice
		switch what {
		case coveredSocket:
			dev = backend.SocketDeviceName
		case coveredModel:
			dev = backend.ModelDeviceName
		}
		conf := in.Devices[dev]
		if conf == nil {
			continue
		}
		add := []string{"config", "device", "add", name, dev, conf["type"]}
		for _, k := range slices.Sorted(maps.Keys(conf)) {
			if k != "type" {
				add = append(add, k+"="+conf[k])
			}
		}
		if err := b.retryConfig(ctx, "config", "device", "remove", name, dev); err != nil && !errors.Is(err, errNoDevice) {
			return fmt.Errorf("restore %s in %s: %w", what, name, err)
		}
		if err := b.retryConfig(ctx, add...); err != nil {
			return fmt.Errorf("restore %s in %s: %w", what, name, err)
		}
	}
	if covered, err = b.covered(ctx, name, dirs, true); err != nil {
		return err
	}
	if len(covered) > 0 {
		return fmt.Errorf("restore in %s: still covered: %s", name, strings.Join(covered, " and "))
	}
	return nil
}
