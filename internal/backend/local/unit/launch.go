package unit

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// Descriptors of the launcher (its extra files, in this order).
const (
	// SpecFD carries the LaunchSpec as JSON, closed by the launcher.
	SpecFD = 4
	// StatusFD is bubblewrap's --json-status-fd: the broker learns the
	// sandbox's pid 1 from it.
	StatusFD = 5
)

// StageDir is where the launcher, as root in a mount namespace of its
// own, binds the sandbox's host directories so that the sandbox's
// unprivileged uid can reach them: their host parents (the broker's state
// dir, /root) are closed to it. bubblewrap binds them from here.
const StageDir = "/tmp"

// maxSpecBytes bounds the launch spec: bubblewrap's arguments.
const maxSpecBytes = 1 << 20

// LaunchSpec is what the broker hands the launcher on SpecFD.
type LaunchSpec struct {
	// UID and GID are the sandbox's host ids the launcher drops to before
	// it runs bubblewrap; -1 keeps the launcher's own (a non-root broker).
	UID int `json:"uid"`
	GID int `json:"gid"`
	// CgroupProcs are the cgroup.procs files the launcher joins, so that
	// bubblewrap and every process of the sandbox are in its cgroups.
	CgroupProcs []string `json:"cgroup_procs,omitempty"`
	// Stage lists host paths bound at StageDir/Name (root only).
	Stage []StageEntry `json:"stage,omitempty"`
	Bwrap string       `json:"bwrap"`
	Args  []string     `json:"args"`
	Env   []string     `json:"env"`
}

// StageEntry is one host path (a directory or a file) to stage.
type StageEntry struct {
	Source string `json:"source"`
	Name   string `json:"name"` // a single path component
}

// LaunchMain is `jailbee _sandbox-launch`. It executes bubblewrap and
// returns only on failure, with the reason on stderr.
func LaunchMain() int {
	fmt.Fprintf(os.Stderr, "sandbox-launch: %v\n", launch())
	return 1
}

// launch becomes bubblewrap; it returns only with what stopped it.
func launch() error {
	spec, err := readSpec()
	if err != nil {
		return err
	}
	for _, p := range spec.CgroupProcs {
		if err := joinCgroup(p); err != nil {
			return err
		}
	}
	if len(spec.Stage) > 0 {
		if err := stage(spec.Stage); err != nil {
			return err
		}
	}
	if spec.UID >= 0 {
		// Groups first: setresuid takes the privilege the others need.
		if err := syscall.Setgroups([]int{}); err != nil {
			return fmt.Errorf("setgroups: %w", err)
		}
		if err := syscall.Setresgid(spec.GID, spec.GID, spec.GID); err != nil {
			return fmt.Errorf("setresgid: %w", err)
		}
		if err := syscall.Setresuid(spec.UID, spec.UID, spec.UID); err != nil {
			return fmt.Errorf("setresuid: %w", err)
		}
		if os.Geteuid() != spec.UID || os.Getuid() != spec.UID {
			return fmt.Errorf("still running as uid %d", os.Geteuid())
		}
	}
	// no_new_privs is per thread: set it on the thread that executes.
	runtime.LockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	argv := append([]string{"bwrap"}, spec.Args...)
	return fmt.Errorf("exec bubblewrap: %w", syscall.Exec(spec.Bwrap, argv, spec.Env))
}

func readSpec() (LaunchSpec, error) {
	f := os.NewFile(SpecFD, "spec")
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxSpecBytes+1))
	if err != nil {
		return LaunchSpec{}, fmt.Errorf("read spec: %w", err)
	}
	if len(data) > maxSpecBytes {
		return LaunchSpec{}, fmt.Errorf("spec over %d bytes", maxSpecBytes)
	}
	var spec LaunchSpec
	if err := json.Unmarshal(data, &spec); err != nil {
		return LaunchSpec{}, fmt.Errorf("decode spec: %w", err)
	}
	if !filepath.IsAbs(spec.Bwrap) {
		return LaunchSpec{}, fmt.Errorf("bubblewrap path %q is not absolute", spec.Bwrap)
	}
	return spec, nil
}

// joinCgroup moves the launcher into one cgroup; its children inherit it.
func joinCgroup(procs string) error {
	f, err := os.OpenFile(procs, os.O_WRONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("join cgroup: %w", err)
	}
	defer f.Close()
	if _, err := f.WriteString(strconv.Itoa(os.Getpid())); err != nil {
		return fmt.Errorf("join cgroup %s: %w", procs, err)
	}
	return nil
}

// stage binds each entry at StageDir/Name on a fresh tmpfs. The launcher
// runs in a mount namespace of its own (the broker starts it with
// CLONE_NEWNS, / private), so nothing here is seen by the host. Sources
// are opened before the tmpfs hides StageDir, and bound through their
// descriptors, so a source under StageDir works too.
func stage(entries []StageEntry) error {
	type opened struct {
		fd    int
		isDir bool
		name  string
	}
	var srcs []opened
	defer func() {
		for _, s := range srcs {
			unix.Close(s.fd)
		}
	}()
	for _, e := range entries {
		if e.Name == "" || e.Name == "." || e.Name == ".." || filepath.Base(e.Name) != e.Name {
			return fmt.Errorf("stage name %q is not one path component", e.Name)
		}
		fd, err := unix.Open(e.Source, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s: %w", e.Name, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return err
		}
		isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
		if !isDir && st.Mode&unix.S_IFMT != unix.S_IFREG {
			unix.Close(fd)
			return fmt.Errorf("%s is neither a directory nor a regular file", e.Name)
		}
		srcs = append(srcs, opened{fd, isDir, e.Name})
	}
	if err := unix.Mount("jailbee-stage", StageDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=1m"); err != nil {
		return fmt.Errorf("mount staging tmpfs: %w", err)
	}
	for _, s := range srcs {
		target := filepath.Join(StageDir, s.name)
		if s.isDir {
			err := unix.Mkdir(target, 0o755)
			if err != nil {
				return err
			}
		} else {
			fd, err := unix.Open(target, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
			if err != nil {
				return err
			}
			unix.Close(fd)
		}
		src := "/proc/self/fd/" + strconv.Itoa(s.fd)
		if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s: %w", s.name, err)
		}
	}
	return nil
}
