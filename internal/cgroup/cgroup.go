// Package cgroup puts each sandbox in its own control group, so that its
// whole process tree is limited (pids, memory, CPU weight) and can be
// killed as one unit.
//
// It works on cgroup v2 when the host's unified hierarchy offers the pids,
// memory and cpu controllers, and otherwise on the v1 pids, memory and cpu
// controllers (plus freezer, when mounted, for killing). Groups live at
// <controller mount>/jailbee/<name> (one directory per v1 controller, one
// on v2). Only the standard library and golang.org/x/sys/unix are used.
package cgroup

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"agentbox/internal/mountinfo"
)

// Parent is the directory, directly under each controller's mount point,
// that holds every sandbox group.
const Parent = "jailbee"

// Bounds of Limits, matching what the broker's configuration accepts. A
// zero field is always allowed and means "no limit" (see Limits).
const (
	MinPids          int64 = 16
	MaxPids          int64 = 4194304 // PID_MAX_LIMIT; pids.max refuses more
	MinMemoryBytes   int64 = 32 << 20
	MaxMemoryBytes   int64 = 1 << 40
	MinCPUWeight           = 1
	MaxCPUWeight           = 10000
	DefaultCPUWeight       = 100 // a new group's weight on v2 (cpu.shares 1024 on v1)
)

// Internal constants.
const (
	// v1 cpu.shares per 100 of v2 weight, and the smallest share the kernel takes.
	v1SharesPerDefaultWeight = 1024
	v1MinShares              = 2
	// Remove retries an rmdir that fails with EBUSY (a killed process takes
	// a moment to leave its group) for this long.
	removeBusyTimeout = 2 * time.Second
	removeBusyPoll    = 10 * time.Millisecond
	// Kill's pause between rounds, and how long it waits for a freezer to
	// report FROZEN before killing anyway (a task in uninterruptible sleep
	// can hold a v1 group in FREEZING).
	killPoll   = 5 * time.Millisecond
	freezeWait = 500 * time.Millisecond
	freezePoll = time.Millisecond
	// Directory mode of created groups (the cgroup fs ignores most of it).
	dirMode = 0o755
)

// Controllers this package limits, in the order they are set up and joined,
// and the v1 freezer, used by Kill when it is mounted.
var needed = []string{"pids", "memory", "cpu"}

const freezer = "freezer"

// Where a process's own cgroup is read from.
const selfCgroupFile = "/proc/self/cgroup"

// MaxNameLen bounds a group name.
const MaxNameLen = 128

var nameRE = regexp.MustCompile(fmt.Sprintf(`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,%d}$`, MaxNameLen-1))

// ValidateName reports whether name can be a group name: a single safe path
// component of at most MaxNameLen characters from [a-zA-Z0-9._-] that
// starts with a letter or digit (so never ".", ".." or a hidden name).
func ValidateName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("cgroup: invalid group name %q: want 1-%d of [a-zA-Z0-9._-], starting with a letter or digit", name, MaxNameLen)
	}
	return nil
}

// Limits of one group. A zero field means "no limit": on a new group the
// kernel default is left in place, and on a reused group the earlier value
// is reset to that default (pids.max and the memory limit unlimited, CPU
// weight 100), so the group ends up with exactly these limits.
type Limits struct {
	// Pids caps the number of processes and threads (pids.max).
	Pids int64
	// MemoryBytes caps memory, swap included (no swap beyond it). The
	// kernel keeps whole pages: it rounds a value down to the page size.
	MemoryBytes int64
	// CPUWeight is the share of CPU under contention, on the v2 scale
	// 1..10000 (100 is the default); on v1 it becomes cpu.shares =
	// weight*1024/100. Limits read back always report it (100 when unset).
	CPUWeight int
}

// Validate checks each non-zero field against its bounds.
func (l Limits) Validate() error {
	if l.Pids != 0 && (l.Pids < MinPids || l.Pids > MaxPids) {
		return fmt.Errorf("cgroup: pids limit %d out of range %d..%d", l.Pids, MinPids, MaxPids)
	}
	if l.MemoryBytes != 0 && (l.MemoryBytes < MinMemoryBytes || l.MemoryBytes > MaxMemoryBytes) {
		return fmt.Errorf("cgroup: memory limit %d bytes out of range %d..%d", l.MemoryBytes, MinMemoryBytes, MaxMemoryBytes)
	}
	if l.CPUWeight != 0 && (l.CPUWeight < MinCPUWeight || l.CPUWeight > MaxCPUWeight) {
		return fmt.Errorf("cgroup: cpu weight %d out of range %d..%d", l.CPUWeight, MinCPUWeight, MaxCPUWeight)
	}
	return nil
}

// Hierarchy is what the host offers: cgroup v2 with the needed controllers
// in its unified tree, or v1 with each needed controller mounted. It holds
// no open files and is safe for concurrent use.
type Hierarchy struct {
	version int
	// v2: the mount point, and the cgroup shown at it ("/" unless the
	// mount is a bind of a subtree).
	v2Mount, v2MountRoot string
	// v1: controller name -> mount point (pids, memory, cpu; freezer if mounted).
	v1 map[string]string
	// Tests only: called after each directory this package creates, so a
	// fake v2 tree can add the files the kernel would.
	onMkdir func(dir string) error
	// Tests only: where the process's own cgroup is read from.
	selfCgroup string
}

// Version is 1 or 2.
func (h *Hierarchy) Version() int { return h.version }

// Mountpoint is where controller ("pids", "memory", "cpu", "freezer") is
// mounted: the unified mount on v2, "" if it is not mounted.
func (h *Hierarchy) Mountpoint(controller string) string {
	if h.version == 2 {
		if controller == freezer || slices.Contains(needed, controller) {
			return h.v2Mount
		}
		return ""
	}
	return h.v1[controller]
}

// Detect reads /proc/self/mountinfo. A cgroup2 mount counts only when its
// cgroup.controllers lists pids, memory and cpu (on a hybrid host the
// unified mount usually has none of them); otherwise each of pids, memory
// and cpu must be mounted as a v1 hierarchy (possibly co-mounted, as
// "cpu,cpuacct").
func Detect() (*Hierarchy, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	mounts, err := parseMountinfo(data)
	if err != nil {
		return nil, err
	}
	return detect(mounts, func(dir string) ([]string, error) {
		b, err := readControl(filepath.Join(dir, "cgroup.controllers"))
		return strings.Fields(string(b)), err
	})
}

type mountEntry struct {
	root, point, fstype string
	super               []string // super options: v1 controllers appear here
}

// parseMountinfo reads the cgroup and cgroup2 entries of a mountinfo file
// (proc(5): ID PARENT MAJ:MIN ROOT POINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPER).
func parseMountinfo(data []byte) ([]mountEntry, error) {
	var out []mountEntry
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		sep := slices.Index(f, "-")
		if sep < 6 || len(f) < sep+4 {
			return nil, fmt.Errorf("cgroup: malformed mountinfo line %q", sc.Text())
		}
		fstype := f[sep+1]
		if fstype != "cgroup" && fstype != "cgroup2" {
			continue
		}
		out = append(out, mountEntry{
			root:   mountinfo.Unescape(f[3]),
			point:  mountinfo.Unescape(f[4]),
			fstype: fstype,
			super:  strings.Split(f[sep+3], ","),
		})
	}
	return out, sc.Err()
}

func detect(mounts []mountEntry, controllersOf func(dir string) ([]string, error)) (*Hierarchy, error) {
	// A mount showing the whole hierarchy ("/") is preferred over a bind of
	// a subtree of it.
	slices.SortStableFunc(mounts, func(a, b mountEntry) int {
		return boolInt(a.root != "/") - boolInt(b.root != "/")
	})
	var v2Seen []string
	for _, m := range mounts {
		if m.fstype != "cgroup2" {
			continue
		}
		have, err := controllersOf(m.point)
		if err != nil {
			v2Seen = append(v2Seen, fmt.Sprintf("%s (unreadable: %v)", m.point, err))
			continue
		}
		if containsAll(have, needed) {
			return &Hierarchy{version: 2, v2Mount: m.point, v2MountRoot: m.root}, nil
		}
		v2Seen = append(v2Seen, fmt.Sprintf("%s (controllers %q)", m.point, have))
	}
	v1 := map[string]string{}
	for _, m := range mounts {
		if m.fstype != "cgroup" {
			continue
		}
		for _, c := range append(slices.Clone(needed), freezer) {
			if _, dup := v1[c]; !dup && slices.Contains(m.super, c) {
				v1[c] = m.point
			}
		}
	}
	var missing []string
	for _, c := range needed {
		if v1[c] == "" {
			missing = append(missing, c)
		}
	}
	if len(missing) == 0 {
		return &Hierarchy{version: 1, v1: v1}, nil
	}
	v2 := "no cgroup2 mount"
	if len(v2Seen) > 0 {
		v2 = "cgroup2 at " + strings.Join(v2Seen, ", ") + " lacks some"
	}
	return nil, fmt.Errorf("cgroup: no usable hierarchy: %s of pids, memory, cpu, and cgroup v1 has no %s controller mounted", v2, strings.Join(missing, ", "))
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

// Usable reports whether this process can create and limit groups and move
// processes into them, and if not, why, in one sentence a user can act on.
// It only inspects permissions; nothing is created.
func (h *Hierarchy) Usable() error {
	if h.version == 1 {
		return h.usableV1()
	}
	return h.usableV2()
}

func (h *Hierarchy) usableV1() error {
	if uid := os.Geteuid(); uid != 0 {
		return fmt.Errorf("cgroup v1 limits need root, and the broker runs as uid %d: run it as root, or on a cgroup v2 host with a subtree delegated to it", uid)
	}
	for _, c := range h.v1Controllers() {
		dir := h.v1[c]
		if p := filepath.Join(dir, Parent); exists(p) {
			dir = p
		}
		if err := writable(dir); err != nil {
			if errors.Is(err, unix.EROFS) {
				return fmt.Errorf("cgroup v1 controller %s is mounted read-only at %s: give the broker a writable cgroup mount (in a container, run it privileged or with /sys/fs/cgroup mounted read-write)", c, h.v1[c])
			}
			return fmt.Errorf("cgroup v1 controller %s: %s is not writable (%v): run the broker as root on the host", c, dir, err)
		}
	}
	return nil
}

func (h *Hierarchy) usableV2() error {
	uid := os.Geteuid()
	root := h.v2Mount
	parent := filepath.Join(root, Parent)
	chown := fmt.Sprintf("chown %d %s %s/cgroup.procs %s/cgroup.subtree_control %s/cgroup.threads", uid, parent, parent, parent, parent)
	if err := writable(root); errors.Is(err, unix.EROFS) {
		return fmt.Errorf("cgroup v2 is mounted read-only at %s: give the broker a writable cgroup mount (in a container, run it with /sys/fs/cgroup mounted read-write)", root)
	}
	rootCtl := filepath.Join(root, "cgroup.subtree_control")
	if !enabledIn(rootCtl) && writable(rootCtl) != nil {
		return fmt.Errorf("cgroup v2: the pids, memory and cpu controllers are not enabled below %s and uid %d cannot enable them: as root, run echo '+pids +memory +cpu' > %s", root, uid, rootCtl)
	}
	switch _, err := os.Lstat(parent); {
	case errors.Is(err, fs.ErrNotExist):
		if writable(root) != nil {
			return fmt.Errorf("cgroup v2: %s does not exist and uid %d cannot create it: as root, run mkdir %s && %s", parent, uid, parent, chown)
		}
	case err != nil:
		return fmt.Errorf("cgroup v2: %w", err)
	default:
		parentCtl := filepath.Join(parent, "cgroup.subtree_control")
		if writable(parent) != nil || writable(filepath.Join(parent, "cgroup.procs")) != nil ||
			(!enabledIn(parentCtl) && writable(parentCtl) != nil) {
			return fmt.Errorf("cgroup v2: %s is not delegated to uid %d: as root, run %s", parent, uid, chown)
		}
	}
	// Moving a process needs write access to cgroup.procs of the nearest
	// common ancestor of its current and its new group. The launchers that
	// join are this process's children, in its cgroup.
	own, err := h.ownCgroupV2()
	if err != nil {
		return err
	}
	common := commonAncestor(own, "/"+Parent+"/x")
	if writable(filepath.Join(root, common, "cgroup.procs")) != nil {
		return fmt.Errorf("cgroup v2: the broker's cgroup %s is outside %s, so uid %d cannot move sandboxes into their groups: start the broker inside the delegated subtree (as root, mkdir %s/.broker, chown it to uid %d, and write the broker's pid to its cgroup.procs)", filepath.Join(root, own), parent, uid, parent, uid)
	}
	return nil
}

// ownCgroupV2 is this process's v2 cgroup, relative to the mount point.
func (h *Hierarchy) ownCgroupV2() (string, error) {
	file := h.selfCgroup
	if file == "" {
		file = selfCgroupFile
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("cgroup v2: %w", err)
	}
	for line := range strings.Lines(string(data)) {
		if p, ok := strings.CutPrefix(strings.TrimSpace(line), "0::"); ok {
			rel, err := filepath.Rel(h.v2MountRoot, p)
			if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
				return "", fmt.Errorf("cgroup v2: the broker's cgroup %s is not below the cgroup mounted at %s (%s): run the broker where its own cgroup is visible", p, h.v2Mount, h.v2MountRoot)
			}
			if rel == "." {
				return "/", nil
			}
			return "/" + rel, nil
		}
	}
	return "", fmt.Errorf("cgroup v2: %s has no v2 entry", file)
}

// commonAncestor of two absolute slash-separated cgroup paths.
func commonAncestor(a, b string) string {
	as, bs := strings.Split(strings.Trim(a, "/"), "/"), strings.Split(strings.Trim(b, "/"), "/")
	var common []string
	for i := 0; i < len(as) && i < len(bs) && as[i] == bs[i] && as[i] != ""; i++ {
		common = append(common, as[i])
	}
	return "/" + strings.Join(common, "/")
}

// enabledIn reports whether a cgroup.subtree_control file lists every needed controller.
func enabledIn(subtreeControl string) bool {
	b, err := readControl(subtreeControl)
	return err == nil && containsAll(strings.Fields(string(b)), needed)
}

// writable is access(2) for writing with the effective ids, as the kernel
// checks them on open.
func writable(path string) error {
	return unix.Faccessat(unix.AT_FDCWD, path, unix.W_OK, unix.AT_EACCESS)
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// v1Controllers are the v1 controllers in use, in join order: the needed
// ones, then freezer when mounted.
func (h *Hierarchy) v1Controllers() []string {
	cs := slices.Clone(needed)
	if h.v1[freezer] != "" {
		cs = append(cs, freezer)
	}
	return cs
}

// readControl reads a control file without following a symlink.
func readControl(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(f); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return buf.Bytes(), nil
}

// writeControl writes value to an existing control file in one write (the
// kernel parses each write on its own), never creating it and never
// following a symlink.
func writeControl(path, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	if _, err := f.Write([]byte(value)); err != nil {
		f.Close()
		return fmt.Errorf("write %q to %s: %w", value, path, err)
	}
	return f.Close()
}

// readInt reads a control file holding one number, or "max" (returned as -1).
func readInt(path string) (int64, error) {
	b, err := readControl(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return -1, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cgroup: %s: %w", path, err)
	}
	return n, nil
}
