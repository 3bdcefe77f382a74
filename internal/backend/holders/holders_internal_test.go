package holders

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"agentbox/internal/testutil/contain"

	"golang.org/x/sys/unix"
)

// childEnv runs the test binary as a child of a test (childMain).
const childEnv = "HOLDERS_TEST_CHILD"

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(childMain(strings.Fields(mode)))
	}
	contain.Main(m, nil, nil)
}

// childMain runs in a mount namespace of its own: it mounts a tmpfs,
// prints its mount id, takes hold of it (or not) as mode says, prints
// "ready" and waits for its stdin to close.
//
//	fds N       N descriptors in all, none on the mount
//	maps N      N pieces of files mapped in all, none on the mount
//	epoll W N   an epoll descriptor watching W descriptors, duplicated
//	            N times, none on the mount
//	threads T N T more threads sharing a table of N descriptors
//	fd          a descriptor on the mount
//	exe         its executable (and nothing else) on the mount
//	nested      a child in a mount namespace of its own holds a
//	            descriptor on the mount; exit code 42 says it was killed
//	held        that child (stdin: its parent's end of a pipe)
func childMain(mode []string) int {
	if mode[0] == "held" {
		var b [1]byte
		os.Stdin.Read(b[:]) // until the parent ends
		return 0
	}
	fail := func(err error) int { fmt.Println("error:", err); return 1 }
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fail(err)
	}
	dir, err := os.MkdirTemp("", "holders")
	if err != nil {
		return fail(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		return fail(err)
	}
	d, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return fail(err)
	}
	id, err := MountID(d)
	unix.Close(d)
	if err != nil {
		return fail(err)
	}
	fmt.Println(id)
	num := func(i int) int { n, _ := strconv.Atoi(mode[i]); return n }
	switch mode[0] {
	case "fds":
		if err := fillFDs(num(1)); err != nil {
			return fail(err)
		}
	case "threads":
		for range num(1) {
			go func() {
				runtime.LockOSThread()
				var b [1]byte
				unix.Read(0, b[:]) // until stdin closes
			}()
		}
		if err := fillFDs(num(2)); err != nil {
			return fail(err)
		}
	case "maps":
		if err := fillMaps(num(1)); err != nil {
			return fail(err)
		}
	case "epoll":
		if err := epollList(num(1), num(2)); err != nil {
			return fail(err)
		}
	case "fd":
		if _, err := os.Open(dir); err != nil {
			return fail(err)
		}
	case "nested":
		f, err := os.Open(dir)
		if err != nil {
			return fail(err)
		}
		r, w, err := os.Pipe()
		if err != nil {
			return fail(err)
		}
		held := exec.Command("/proc/self/exe", "-test.run=^$")
		held.Env = append(os.Environ(), childEnv+"=held")
		held.Stdin, held.ExtraFiles = r, []*os.File{f}
		held.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
		if err := held.Start(); err != nil {
			return fail(err)
		}
		f.Close()
		r.Close()
		fmt.Println("ready")
		var b [1]byte
		os.Stdin.Read(b[:])
		w.Close()
		held.Wait()
		if st, ok := held.ProcessState.Sys().(syscall.WaitStatus); ok && st.Signaled() && st.Signal() == syscall.SIGKILL {
			return 42
		}
		return 0
	case "exe":
		// The program's "ready" says it unmapped itself.
		p := filepath.Join(dir, "exe")
		if err := os.WriteFile(p, selfUnmapping(), 0o755); err != nil {
			return fail(err)
		}
		return fail(unix.Exec(p, []string{p}, nil))
	}
	fmt.Println("ready")
	var b [1]byte
	os.Stdin.Read(b[:])
	return 0
}

// selfUnmapping is a static x86-64 program of 496 bytes that copies its
// code to an anonymous mapping, unmaps every mapping of its own file
// from there, prints "ready" and reads its stdin to the end: its only
// hold on the mount it was run from is its executable (mm's exe_file).
// Source (gcc -nostdlib -static -no-pie -Wl,--build-id=none -Wl,-N -s):
//
//	_start: mmap(0, 4096, RWX, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0) -> rbx
//	        copy stub..stub_end to rbx; r12 = _start &^ 4095; jmp rbx
//	stub:   munmap(r12, 1 MiB); write(1, "ready\n", 6)
//	        while read(0, sp, 1) > 0 {}; exit(0)
func selfUnmapping() []byte {
	b, err := hex.DecodeString("" +
		"7f454c4602010100000000000000000002003e0001000000780040000000000040000000000000003001000000000000" +
		"000000004000380001004000030002000100000007000000780000000000000078004000000000007800400000000000" +
		"a600000000000000a6000000000000000100000000000000b80900000031ffbe00100000ba0700000041ba2200000049" +
		"c7c0ffffffff4531c90f054889c3488d351a0000004889dfb95f000000f3a44c8d25c2ffffff4981e400f0ffffffe3b8" +
		"0b0000004c89e7be000010000f05686164790a48b800000000000072656a00c704247265616466c7442404790ab80100" +
		"0000bf010000004889e6ba060000000f0531c031ff4889e6ba010000000f054883f8007fecb83c00000031ff0f05002e" +
		"7368737472746162002e7465787400000000000000000000000000000000000000000000000000000000000000000000" +
		"00000000000000000000000000000000000000000000000000000000000000000b000000010000000700000000000000" +
		"78004000000000007800000000000000a600000000000000000000000000000001000000000000000000000000000000" +
		"0100000003000000000000000000000000000000000000001e0100000000000011000000000000000000000000000000" +
		"01000000000000000000000000000000")
	if err != nil {
		panic(err)
	}
	return b
}

// fillFDs dups /dev/null until the process has n descriptors.
func fillFDs(n int) error {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	lim.Cur = min(uint64(n+64), lim.Max)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	null, err := unix.Open("/dev/null", unix.O_RDONLY, 0)
	if err != nil {
		return err
	}
	for have := countFDs(); have < n; have++ {
		if _, err := unix.Dup(null); err != nil {
			return err
		}
	}
	if have := countFDs(); have != n {
		return fmt.Errorf("%d descriptors, want %d", have, n)
	}
	return nil
}

// fillMaps maps one page of a file again and again until the process
// maps n pieces of files (each its own: the pieces' file offsets do not
// follow on, so none merge).
func fillMaps(n int) error {
	f, err := os.CreateTemp("", "maps")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if err := f.Truncate(4096); err != nil {
		return err
	}
	have := countNames("/proc/self/map_files")
	for ; have < n; have++ {
		if _, err := unix.Mmap(int(f.Fd()), 0, 4096, unix.PROT_READ, unix.MAP_SHARED); err != nil {
			return err
		}
	}
	if have := countNames("/proc/self/map_files"); have != n {
		return fmt.Errorf("%d mapped pieces, want %d", have, n)
	}
	return nil
}

// epollList makes an epoll descriptor whose interest list holds w
// entries (each eventfd of a few, under one descriptor number after
// another, closed once added: the entries stay while the eventfds are
// open) and duplicates it n times.
func epollList(w, n int) error {
	const files, first = 25, 1000
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	lim.Cur = min(uint64(first+w/files+n+64), lim.Max)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	ep, err := unix.EpollCreate1(0)
	if err != nil {
		return err
	}
	var efds [files]int
	for i := range efds {
		if efds[i], err = unix.Eventfd(0, 0); err != nil {
			return err
		}
	}
	for k := first; k < first+w/files; k++ {
		for _, e := range efds {
			if err := unix.Dup2(e, k); err != nil {
				return err
			}
			if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, k, &unix.EpollEvent{Events: unix.EPOLLIN}); err != nil {
				return err
			}
		}
		unix.Close(k)
	}
	for range n {
		if _, err := unix.Dup(ep); err != nil {
			return err
		}
	}
	return nil
}

func countNames(dir string) int {
	names, err := readNames(dir)
	if err != nil {
		return -1
	}
	return len(names)
}

func countFDs() int {
	f, err := os.Open("/proc/self/fd")
	if err != nil {
		return -1
	}
	defer f.Close()
	names, _ := f.Readdirnames(-1)
	return len(names) - 1 // f's own
}

type proc struct {
	cmd   *exec.Cmd
	stdin io.Closer
}

// child starts childMain with mode and returns it and its mount's id.
func child(t *testing.T, mode string) (proc, uint64) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (a mount namespace, a tmpfs)")
	}
	cmd := exec.Command("/proc/self/exe", "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+mode)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	sc := bufio.NewScanner(stdout)
	var lines []string
	for sc.Scan() && sc.Text() != "ready" {
		lines = append(lines, sc.Text())
	}
	if len(lines) != 1 {
		t.Fatalf("child %s: %q", mode, lines)
	}
	id, err := strconv.ParseUint(lines[0], 10, 64)
	if err != nil {
		t.Fatalf("child %s: %q", mode, lines)
	}
	return proc{cmd, stdin}, id
}

// killed ends the child (stdin closed) and reports whether it had been
// killed instead.
func killed(t *testing.T, p proc) bool {
	t.Helper()
	p.stdin.Close()
	cmd := p.cmd
	err := cmd.Wait()
	if st, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && st.Signaled() && st.Signal() == syscall.SIGKILL {
		return true
	}
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	return false
}

func kill(t *testing.T, p proc, id uint64) {
	t.Helper()
	if err := Kill(t.Context(), p.cmd.Process.Pid, Target{MountID: id}); err != nil {
		t.Fatalf("Kill: %v", err)
	}
}

// TestKillHolder: a process with a descriptor on the mount is ended.
func TestKillHolder(t *testing.T) {
	p, id := child(t, "fd")
	kill(t, p, id)
	if !killed(t, p) {
		t.Fatal("a process with a descriptor on the detached mount lives on")
	}
}

// TestKillNestedNamespace: a process of the sandbox in a mount namespace
// of its own (root inside may make one) that kept a descriptor on the
// mount holds it as much as any: it is found and ended.
func TestKillNestedNamespace(t *testing.T) {
	p, id := child(t, "nested")
	kill(t, p, id)
	p.stdin.Close()
	if err := p.cmd.Wait(); p.cmd.ProcessState.ExitCode() != 42 {
		t.Fatalf("a process in a mount namespace of its own holding the detached mount lives on (%v)", err)
	}
}

// TestKillExe: a process whose only hold on the mount is its executable
// (mm's exe_file: a program run from the mount that unmapped itself, as
// any process may, or root's PR_SET_MM_MAP) keeps the mount alive: it is
// a holder like any other.
func TestKillExe(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the self-unmapping program is x86-64")
	}
	p, id := child(t, "exe")
	if !on("/proc/"+strconv.Itoa(p.cmd.Process.Pid)+"/exe", Target{MountID: id}) || mapsOn(t.Context(), "/proc/"+strconv.Itoa(p.cmd.Process.Pid), Target{MountID: id}) {
		t.Fatal("the program's executable is not on the mount, or it maps a file of it")
	}
	kill(t, p, id)
	if !killed(t, p) {
		t.Fatal("a process whose executable is on the detached mount lives on, and the mount with it")
	}
}

// TestKillLimits: a process's descriptors and mapped pieces of files are
// looked at one statx each, and a process may hold a million descriptors
// per table and some 65,000 mappings: one with maxFDs descriptors, or
// maxMaps mappings, is looked at (and holds nothing); one with more
// counts as a holder without being looked at to the end.
func TestKillLimits(t *testing.T) {
	for _, tc := range []struct {
		what string
		n    int
		kill bool
	}{{"fds", maxFDs, false}, {"fds", maxFDs + 1, true}, {"maps", maxMaps, false}, {"maps", maxMaps + 1, true}} {
		t.Run(tc.what+" "+strconv.Itoa(tc.n), func(t *testing.T) {
			p, id := child(t, tc.what+" "+strconv.Itoa(tc.n))
			kill(t, p, id)
			if got := killed(t, p); got != tc.kill {
				t.Fatalf("a process of %d %s, none on the mount: killed %v, want %v", tc.n, tc.what, got, tc.kill)
			}
		})
	}
}

// TestKillEpollList: the kernel writes an epoll descriptor's whole
// interest list into its fdinfo; a process that made it 200,000 entries
// long and dup'd it 1,000 times made the scan format some 15 GB (the old
// scan read each descriptor's fdinfo for its mount). Descriptors are
// looked at through their magic links: the scan ends well within its
// bound (a bound on the test only) and the process, holding nothing, lives.
func TestKillEpollList(t *testing.T) {
	p, id := child(t, "epoll 200000 1000")
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := Kill(ctx, p.cmd.Process.Pid, Target{MountID: id}); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if killed(t, p) {
		t.Fatal("a process holding nothing on the mount was killed")
	}
}

// TestKillBounded: a scan the sandbox makes longer than scanBound fails
// (its caller then ends the sandbox) and kills nothing it did not find.
func TestKillBounded(t *testing.T) {
	p, id := child(t, "fds 8192")
	defer func(old time.Duration) { scanBound = old }(scanBound)
	scanBound = time.Millisecond
	if err := Kill(t.Context(), p.cmd.Process.Pid, Target{MountID: id}); err == nil {
		t.Fatal("a scan past its bound succeeded")
	}
	if killed(t, p) {
		t.Fatal("a process holding nothing on the mount was killed")
	}
}

// TestKillSharedTable: threads that share their process's descriptor
// table have it looked at once, not once each (64 threads of a table of
// maxFDs/2 would be 32 times the bound).
func TestKillSharedTable(t *testing.T) {
	p, id := child(t, fmt.Sprintf("threads 64 %d", maxFDs/2))
	kill(t, p, id)
	if killed(t, p) {
		t.Fatal("a process whose threads share a table under the bound was killed")
	}
}

// TestKillCanceled: the scan stops when its context does.
func TestKillCanceled(t *testing.T) {
	p, id := child(t, "fds 16")
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := Kill(ctx, p.cmd.Process.Pid, Target{MountID: id}); err == nil {
		t.Fatal("Kill with a canceled context looked on to the end")
	}
	if killed(t, p) {
		t.Fatal("killed")
	}
}

// TestOtherMountNamespace: a process of the sandbox in a mount namespace
// of its own is reported; a sandbox of one namespace is not.
func TestOtherMountNamespace(t *testing.T) {
	p, _ := child(t, "nested")
	if err := OtherMountNamespace(t.Context(), p.cmd.Process.Pid); !errors.Is(err, ErrOtherMountNamespace) {
		t.Fatalf("a child in a mount namespace of its own: %v", err)
	}
	q, _ := child(t, "fds 16")
	if err := OtherMountNamespace(t.Context(), q.cmd.Process.Pid); err != nil {
		t.Fatalf("one namespace: %v", err)
	}
}
