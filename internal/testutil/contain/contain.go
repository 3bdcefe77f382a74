// Package contain runs a test binary whose tests attack host paths (tree
// removal under symlink swaps, sandbox escapes) where a regression cannot
// damage the machine: as root, TestMain re-executes the binary in a mount
// namespace of its own in which every filesystem is read-only except one
// scratch directory, which becomes TMPDIR (so t.TempDir is inside it).
// A broken removal then fails with EROFS instead of deleting /etc.
// Sandbox units outlive the process that starts them; what the tests
// leave running, even when the binary panics at its -timeout and runs no
// cleanup, is adopted by the re-executing process and killed once the
// run ends (reap.go).
//
// Use it from TestMain:
//
//	func TestMain(m *testing.M) { contain.Main(m, nil, nil) }
//
// Not as root, the tests run as they are: an unprivileged user cannot
// remove what matters on the host.
package contain

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// scratchEnv names the scratch directory in the re-executed binary.
const scratchEnv = "AGENTBOX_CONTAINED_SCRATCH"

// Main runs the tests contained (root) or directly, and exits. before
// (if not nil) runs first, outside the namespace: builds that need a
// writable cache belong there; its error ends the run.
func Main(m *testing.M, before func() error, after func()) {
	if fuzzOnly(os.Args[1:]) {
		os.Exit(m.Run())
	}
	if before != nil && os.Getenv(scratchEnv) == "" {
		if err := before(); err != nil {
			fmt.Fprintf(os.Stderr, "contain: %v\n", err)
			os.Exit(1)
		}
	}
	code := run(m)
	if after != nil && os.Getenv(scratchEnv) == "" {
		after()
	}
	os.Exit(code)
}

// fuzzOnly reports whether the binary runs a fuzz target's engine and no
// test: `go test -run '^$' -fuzz X` (the coordinator) or a worker it
// started. A fuzz target parses bytes and attacks no host path; it needs
// neither the tests' builds nor the namespace, whose read-only
// filesystems would stop the engine writing its corpus and a failing
// input (and a worker, started in the namespace, would seal it again).
func fuzzOnly(args []string) bool {
	fuzz, noTests := false, false
	for _, a := range args {
		switch {
		case a == "-test.fuzzworker" || a == "-test.fuzzworker=true":
			return true
		case strings.HasPrefix(a, "-test.fuzz=") && a != "-test.fuzz=":
			fuzz = true
		case a == "-test.run=^$":
			noTests = true
		}
	}
	return fuzz && noTests
}

func run(m *testing.M) int {
	if scratch := os.Getenv(scratchEnv); scratch != "" {
		if os.Geteuid() != 0 {
			// A test re-ran itself as another uid: it inherited the
			// sealed namespace already.
			return m.Run()
		}
		if err := seal(scratch); err != nil {
			fmt.Fprintf(os.Stderr, "contain: %v\n", err)
			return 1
		}
		return m.Run()
	}
	if os.Geteuid() != 0 {
		return m.Run()
	}
	scratch, err := os.MkdirTemp("", "ct")
	if err == nil {
		// Tests re-run themselves as other uids from copies in here.
		err = os.Chmod(scratch, 0o755)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "contain: %v\n", err)
		return 1
	}
	code := reexec(scratch)
	if err := os.RemoveAll(scratch); err != nil {
		fmt.Fprintf(os.Stderr, "contain: remove scratch: %v\n", err)
	}
	return code
}

// reexec runs this test binary again, with the same arguments, in a new
// mount namespace, and returns its exit status. What the run leaves
// running is killed (runReaping).
func reexec(scratch string) int {
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "contain: %v\n", err)
		return 1
	}
	cmd := exec.Command(exe, os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), scratchEnv+"="+scratch, "TMPDIR="+scratch)
	// Go makes / private in the new namespace: nothing here reaches the host.
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	code, err := runReaping(cmd)
	if err != nil {
		fmt.Fprintf(os.Stderr, "contain: %v\n", err)
		return 1
	}
	return code
}

// seal makes every mount read-only, then scratch writable again. The
// kernel's own filesystems (proc, sys, dev, cgroup) stay as they are.
func seal(scratch string) error {
	mounts, err := mountPoints()
	if err != nil {
		return err
	}
	for _, mp := range mounts {
		if kernelMount(mp) {
			continue
		}
		// MS_REMOUNT|MS_BIND changes this mount's flags only.
		if err := unix.Mount("", mp, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("remount %s read-only: %w", mp, err)
		}
	}
	// go test (caching results) reads the files a test opened from a log
	// it names, and writes profiles to its output directory.
	writable := append([]string{scratch}, outputDirs(os.Args[1:])...)
	for _, dir := range writable {
		if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s: %w", dir, err)
		}
		if err := unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("%s read-write: %w", dir, err)
		}
	}
	// Prove it: the host's /etc must refuse a write.
	f, err := os.CreateTemp("/etc", ".contain-probe-")
	if err == nil {
		f.Close()
		os.Remove(f.Name())
		return fmt.Errorf("/etc is still writable")
	}
	return nil
}

// fileFlags are the test binary's flags that name a file it writes: go
// test's log of opened files (its result cache) and the profiles.
var fileFlags = map[string]bool{"test.testlogfile": true, "test.cpuprofile": true, "test.memprofile": true,
	"test.blockprofile": true, "test.mutexprofile": true, "test.trace": true, "test.coverprofile": true}

// outputDirs are the directories the test binary must write outside the
// scratch directory: -test.outputdir (where relative profile names go)
// and the directory of every absolute file a fileFlags flag names, so a
// benchmark can be profiled contained.
func outputDirs(args []string) []string {
	var dirs []string
	for i, a := range args {
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if name != "test.outputdir" && !fileFlags[name] {
			continue
		}
		if !hasValue && i+1 < len(args) {
			value = args[i+1]
		}
		switch {
		case name == "test.outputdir" && value != "":
			dirs = append(dirs, value)
		case fileFlags[name] && filepath.IsAbs(value):
			dirs = append(dirs, filepath.Dir(value))
		}
	}
	return dirs
}

// kernelMount reports mounts left writable: pseudo filesystems the tests
// need (/proc/self/fd, cgroups, /dev/null).
func kernelMount(mp string) bool {
	for _, p := range []string{"/proc", "/sys", "/dev"} {
		if mp == p || strings.HasPrefix(mp, p+"/") {
			return true
		}
	}
	return false
}

// mountPoints lists this namespace's mount points from /proc/self/mountinfo.
func mountPoints() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		out = append(out, filepath.Clean(unescape(fields[4])))
	}
	return out, sc.Err()
}

// unescape decodes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
