package incus_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"

	"agentbox/internal/backend"
	"agentbox/internal/backend/backendtest"
	"agentbox/internal/backend/incus"
	"agentbox/internal/term"
)

// atBoot makes root inside run script at every boot of the container,
// before its init: the image's /sbin/init, on the container's own disk
// (root inside owns it), becomes a wrapper that runs script first.
func atBoot(t *testing.T, b *incus.Backend, name, script string) {
	t.Helper()
	r := backendtest.Exec(t, b, name, backend.ExecOptions{User: "root", Stdin: strings.NewReader(script + "\n"), Argv: []string{"sh", "-c",
		`init=$(readlink -f /sbin/init) && mv "$init" "$init.real" && { echo '#!/bin/sh'; cat; echo "exec $init.real"; } > "$init" && chmod 755 "$init"`}})
	if r.Code != 0 {
		t.Fatalf("wrap /sbin/init: %d %s", r.Code, r.Stderr)
	}
}

// TestAttackStartHangs: root inside makes /dev/null a FIFO as the
// container boots (its init is root's to change). The broker's own step
// of every Start, the egress relay it starts as root inside, opens
// /dev/null for the relay's stdin and blocks there for ever: a Start
// must still end (egressTimeout), failing that sandbox's start only.
func TestAttackStartHangs(t *testing.T) {
	b := newBackend(t)
	ctx := context.Background()
	for _, name := range []string{"hostile", "benign"} {
		if _, err := b.Create(ctx, backend.CreateOptions{Name: name}); err != nil {
			t.Fatal(err)
		}
		if err := b.Start(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	atBoot(t, b, "hostile", "umount -l /dev/null; rm -f /dev/null; mkfifo -m 666 /dev/null")
	for _, name := range []string{"hostile", "benign"} {
		if err := b.Stop(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	// Only the hostile Start runs with the short bound: the benign Starts
	// keep the default (egressTimeout, 30s), which a loaded machine needs.
	restore := incus.SetEgressTimeout(3 * time.Second)
	done := make(chan error, 1)
	go func() { done <- b.Start(ctx, "hostile") }()
	select {
	case err := <-done:
		restore()
		if err == nil || !strings.Contains(err.Error(), "egress relay") {
			t.Fatalf("Start of a container whose /dev/null is a FIFO: %v, want the egress relay's timeout", err)
		}
		t.Logf("Start: %v", err)
	case <-time.After(2 * time.Minute):
		// The hung Start may still read egressTimeout: it is not put
		// back here (that would race with it); the test fails anyway.
		t.Fatal("Start of a container whose /dev/null is a FIFO never returned: the egress relay's step hangs with it")
	}
	// The other sandbox starts and runs commands as ever.
	if err := b.Start(ctx, "benign"); err != nil {
		t.Fatal(err)
	}
	if out := sh(t, b, "benign", "", "echo ok"); out != "ok" {
		t.Fatalf("benign: %q", out)
	}
}

// TestAttackDevNullFIFO: root inside makes /dev/null a FIFO. The framer
// of every command without a terminal let go of its stdin by opening
// /dev/null in its place, which then blocks for ever: the command's
// output was never passed on and its Exec never ended. Commands must run
// as ever (a command's own use of /dev/null is its own).
func TestAttackDevNullFIFO(t *testing.T) {
	b := newBackend(t)
	ctx := context.Background()
	const name = "fifo"
	if _, err := b.Create(ctx, backend.CreateOptions{Name: name}); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx, name); err != nil {
		t.Fatal(err)
	}
	sh(t, b, name, "root", "umount -l /dev/null; rm -f /dev/null && mkfifo -m 666 /dev/null")
	for _, user := range []string{"", "root"} {
		done := make(chan string, 1)
		go func() {
			var out strings.Builder
			code, err := b.Exec(ctx, name, backend.ExecOptions{User: user, Argv: []string{"echo", "ran"}, Stdout: &out, Stdin: strings.NewReader("")})
			done <- fmt.Sprintf("%d %v %q", code, err, out.String())
		}()
		select {
		case got := <-done:
			if got != `0 <nil> "ran\n"` {
				t.Fatalf("a command as %q with /dev/null a FIFO: %s", user, got)
			}
		case <-time.After(time.Minute):
			t.Fatalf("a command as %q with /dev/null a FIFO never ended", user)
		}
	}
}

// TestAttackHelperOutputFlood: root inside puts a program of its own
// first on the PATH the backend's own commands inside run with (an sh in
// /usr/local/sbin, which comes before /bin): the kill of a cancelled
// command runs it, and what it prints went, all of it, into the broker's
// memory. What the backend reads of its own commands' output is bounded.
func TestAttackHelperOutputFlood(t *testing.T) {
	b := newBackend(t)
	ctx := context.Background()
	const name = "flood"
	if _, err := b.Create(ctx, backend.CreateOptions{Name: name}); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx, name); err != nil {
		t.Fatal(err)
	}
	const flood = 256 << 20
	sh(t, b, name, "root", fmt.Sprintf(`printf '#!/bin/sh\nhead -c %d /dev/zero\nhead -c %d /dev/zero >&2\nexec /bin/sh "$@"\n' > /usr/local/sbin/sh && chmod 755 /usr/local/sbin/sh`, flood/2, flood/2))
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	cctx, cancel := context.WithCancel(ctx)
	_, err := b.Exec(cctx, name, backend.ExecOptions{Argv: []string{"sleep", "1000"}, Started: cancel})
	cancel()
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled command: %v", err)
	}
	runtime.ReadMemStats(&after)
	grew := after.TotalAlloc - before.TotalAlloc
	t.Logf("the broker allocated %d MiB while the kill printed %d MiB", grew>>20, flood>>20)
	if grew > flood/8 {
		t.Fatalf("the broker allocated %d MiB while a command of root's printed %d MiB: it keeps what it reads of its own commands' output unbounded", grew>>20, flood>>20)
	}
}

// TestAttackClientCoveredAtBoot: root inside covers the jailbee client
// with a fake as the container boots, before the broker's first command
// there: Start's own command inside (the egress relay, run as root) is
// checked like every other, and the client put back first; the fake
// never runs and its words never reach the broker.
func TestAttackClientCoveredAtBoot(t *testing.T) {
	b := newBackend(t)
	ctx := context.Background()
	const name = "boot"
	if _, err := b.Create(ctx, backend.CreateOptions{Name: name}); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx, name); err != nil {
		t.Fatal(err)
	}
	sh(t, b, name, "root", `printf '#!/bin/sh\ntouch /fake-ran\nprintf "\\033]0;owned\\007" >&2\nexit 1\n' > /fake && chmod 755 /fake`)
	atBoot(t, b, name, "mount --bind /fake "+incus.ClientPath)
	if err := b.Stop(ctx, name); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx, name); err != nil {
		t.Fatalf("Start with the client covered at boot: %q", err)
	}
	if out := sh(t, b, name, "root", "test -e /fake-ran && echo ran || echo never"); out != "never" {
		t.Fatalf("the fake client ran as the broker's command: %s", out)
	}
	if got := covered(t, b, name); len(got) != 0 {
		t.Fatalf("covered after Start: %q", got)
	}
}

// TestAttackControlBytesInErrors: what one of the backend's own commands
// inside prints on stderr becomes its step's error (Start's, a
// terminal Exec's), which the broker logs and `jailbee start` or `jb
// exec` prints on the host's terminal. Root inside chooses it when it
// wins the race between the client's check and the command (or replaces
// a program the backend runs there): its escape sequences must not
// reach the host's terminal; the words may.
func TestAttackControlBytesInErrors(t *testing.T) {
	b := newBackend(t)
	ctx := context.Background()
	const name = "ctl"
	if _, err := b.Create(ctx, backend.CreateOptions{Name: name}); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx, name); err != nil {
		t.Fatal(err)
	}
	_, err := b.RunInside(ctx, name, "sh", "-c", `printf 'say \033]0;owned\007\033[2J\r\nmore \302\233 \342\200\256 end' >&2; exit 1`)
	if err == nil {
		t.Fatal("a failing command inside gave no error")
	}
	msg := err.Error()
	if strings.ContainsFunc(msg, func(r rune) bool { return !unicode.IsPrint(r) }) {
		t.Fatalf("the error carries control bytes from inside the sandbox: %q", msg)
	}
	if !strings.Contains(msg, "say") || !strings.Contains(msg, "end") {
		t.Fatalf("the error lost the command's words: %q", msg)
	}
}

// TestAttackOutputAfterTheEnd: a command leaves a process holding its
// stdout that floods it, or writes a line every half second, for ever.
// Its Exec still ends with the command's status: after the command's end
// the framer passes on at most maxOutputAfterEnd (1 MiB, what a pipe can
// hold) and waits for more at most 2 s in all. Stderr is not the
// framer's: a flood there holds it up at most drainWait (5 s).
func TestAttackOutputAfterTheEnd(t *testing.T) {
	b := newBackend(t)
	ctx := context.Background()
	const name = "after"
	if _, err := b.Create(ctx, backend.CreateOptions{Name: name}); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx, name); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ how, script string }{
		{"flood", "(sleep 0.2; exec yes) & exit 4"},
		{"trickle", "(while :; do echo x; sleep 0.5; done) & exit 4"},
		{"flood on stderr", "(sleep 0.2; exec yes >&2) & exit 4"},
	} {
		t.Run(tc.how, func(t *testing.T) {
			cctx, cancel := context.WithTimeout(ctx, time.Minute) // a bound on the test only
			defer cancel()
			var out, errOut countWriter
			code, err := b.Exec(cctx, name, backend.ExecOptions{Argv: []string{"sh", "-c", tc.script}, Stdout: &out, Stderr: &errOut})
			if err != nil || code != 4 {
				t.Fatalf("%d, %v after %d bytes (%d on stderr); want the command's status 4", code, err, out.n, errOut.n)
			}
			if out.n > 2<<20 {
				t.Fatalf("passed on %d bytes after the command ended", out.n)
			}
			t.Logf("passed on %d bytes", out.n)
		})
	}
}

type countWriter struct{ n int }

func (c *countWriter) Write(p []byte) (int, error) { c.n += len(p); return len(p), nil }

// TestAttackMountTableFlood: root inside makes mounts at will, and the
// kernel's cost of a line of a mount table grows with their number: 16
// binds of /usr on itself (each doubled by propagation) made 65,000,
// whose table took 2 min 16 s to read, before every Exec and in every
// round, for all sandboxes. A table past maxMountTable (64 KiB) is not
// read on: what it covers cannot be told, so it counts as covering
// everything (Exec refuses, List reports it, a named mount's detach says
// it may be bound elsewhere). A table of 48 KiB is read as ever.
func TestAttackMountTableFlood(t *testing.T) {
	b, project := newBackendIn(t)
	ctx := context.Background()
	const name = "mounts"
	if _, err := b.Create(ctx, backend.CreateOptions{Name: name}); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx, name); err != nil {
		t.Fatal(err)
	}
	hm := backend.HostMount{Name: "data", Source: t.TempDir(), ReadOnly: true}
	if err := b.AttachMount(ctx, name, hm); err != nil {
		t.Fatal(err)
	}
	// Binds of a directory of its own on itself, until the table (as
	// init sees it) holds at least size bytes.
	grow := func(size int) {
		t.Helper()
		out := sh(t, b, name, "root", fmt.Sprintf(`mkdir -p /mnt/x && perl -e '
			sub size { open(my $f, "<", "/proc/1/mountinfo") or die; local $/; my $d = <$f>; length $d }
			my ($s, $t) = ("/mnt/x", ""); my $n = 0;
			while (size() < %d) { syscall(165, $s, $s, $t, 4096, 0) == 0 or die "mount: $!\n"; $n++ }
			print size(), "\n"'`, size))
		t.Logf("the mount table holds %s bytes", out)
	}
	grow(48 << 10)
	if out := sh(t, b, name, "", "echo ran"); out != "ran" {
		t.Fatalf("with a table under the bound: %q", out)
	}
	if got := covered(t, b, name); len(got) != 0 {
		t.Fatalf("with a table under the bound: covered %q", got)
	}
	grow(96 << 10)
	if _, err := b.Exec(ctx, name, backend.ExecOptions{Argv: []string{"true"}}); !errors.Is(err, incus.ErrCovered) {
		t.Fatalf("Exec with a table past the bound: %v, want ErrCovered", err)
	}
	if got := covered(t, b, name); !slices.Contains(got, "client") {
		t.Fatalf("List with a table past the bound: covered %q, want the client", got)
	}
	if err := b.DetachMount(ctx, name, hm.Device()); !errors.Is(err, incus.ErrMountCopied) {
		t.Fatalf("DetachMount with a table past the bound: %v, want ErrMountCopied", err)
	}
	// Restore cannot help (the table stays past the bound whatever it
	// mounts): it must not remove and add the devices again, as it did
	// in every round.
	mon := exec.Command("incus", "monitor", "--project", project, "--type", "lifecycle", "--format", "json")
	var events strings.Builder
	mon.Stdout = &events
	if err := mon.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the monitor subscribes
	start := time.Now()
	err := b.Restore(ctx, name)
	took := time.Since(start)
	time.Sleep(time.Second) // the last events arrive
	mon.Process.Kill()
	mon.Wait()
	changes := strings.Count(events.String(), `"instance-updated"`) + strings.Count(events.String(), `"instance-device`)
	t.Logf("Restore: %v; it took %v and made %d changes to the container", err, took, changes)
	if err == nil {
		t.Fatal("Restore with a table past the bound reported nothing covered")
	}
	if changes > 0 {
		t.Fatalf("Restore with a table past the bound changed the container %d times (removed and added its devices), to no avail", changes)
	}
}

// TestAttackDetachNestedNamespace: root inside moves a process holding a
// named mount (a descriptor opened before, a working directory on the
// copy unshare makes) into a mount namespace of its own. A detach must
// not leave it reading the host directory.
func TestAttackDetachNestedNamespace(t *testing.T) {
	b := newBackend(t)
	ctx := context.Background()
	const name = "nested"
	if _, err := b.Create(ctx, backend.CreateOptions{Name: name}); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx, name); err != nil {
		t.Fatal(err)
	}
	dir := backendtest.HostDir(t)
	hm := backend.HostMount{Name: "data", Source: dir}
	if err := b.AttachMount(ctx, name, hm); err != nil {
		t.Fatal(err)
	}
	for _, prop := range []string{"private", "unchanged"} {
		sh(t, b, name, "root", fmt.Sprintf(`cd %s && exec 3<hello && setsid unshare -m --propagation %s sh -c 'echo $$ > /tmp/%s; exec sleep 1000' </dev/null >/dev/null 2>&1 &
			while ! test -s /tmp/%s; do sleep 0.05; done`, hm.Path(), prop, prop, prop))
	}
	err := b.DetachMount(ctx, name, hm.Device())
	t.Logf("DetachMount: %v", err)
	for _, prop := range []string{"private", "unchanged"} {
		r := backendtest.Exec(t, b, name, backend.ExecOptions{User: "root", Argv: []string{"sh", "-c",
			fmt.Sprintf(`p=$(cat /tmp/%s); cat /proc/$p/fd/3; cat /proc/$p/cwd/hello`, prop)}})
		if r.Code == 0 || strings.Contains(r.Stdout, "hi") {
			t.Errorf("after DetachMount (%v), a process in a mount namespace of its own (%s) still reads the host directory: %q", err, prop, r.Stdout)
		}
	}
}

// TestAttackDetachCopyInNestedNamespace: a process makes a mount
// namespace of its own (root with unshare -m; the agent too, in a user
// namespace of its own) whose copy of a named mount does not follow the
// container's (private). The device's removal leaves that
// copy, and the host directory, in reach: the detach must say so
// (ErrMountCopied), as for a copy bound in the container's own table.
func TestAttackDetachCopyInNestedNamespace(t *testing.T) {
	b := newBackend(t)
	ctx := context.Background()
	const name = "nestedcopy"
	if _, err := b.Create(ctx, backend.CreateOptions{Name: name}); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx, name); err != nil {
		t.Fatal(err)
	}
	hm := backend.HostMount{Name: "data", Source: backendtest.HostDir(t)}
	p := hm.Path()
	bg := " </dev/null >/dev/null 2>&1 & while ! test -s /tmp/v; do sleep 0.05; done"
	for _, tc := range []struct{ name, user, attack, reach string }{
		{"agent", "", `setsid unshare -Urm --propagation private sh -c 'cd ` + p + ` && echo $$ > /tmp/v && exec sleep 1000'` + bg,
			`cat /proc/$(cat /tmp/v)/cwd/hello`},
		{"root", "root", `setsid unshare -m --propagation private sh -c 'cd ` + p + ` && echo $$ > /tmp/v && exec sleep 1000'` + bg,
			`cat /proc/$(cat /tmp/v)/cwd/hello`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := b.AttachMount(ctx, name, hm); err != nil {
				t.Fatal(err)
			}
			sh(t, b, name, tc.user, tc.attack)
			err := b.DetachMount(ctx, name, hm.Device())
			r := backendtest.Exec(t, b, name, backend.ExecOptions{User: "root", Argv: []string{"sh", "-c", tc.reach}})
			t.Logf("DetachMount: %v; the copy reads %q (%d)", err, r.Stdout, r.Code)
			if r.Code == 0 && !errors.Is(err, incus.ErrMountCopied) {
				t.Errorf("DetachMount: %v, while a copy in a mount namespace of its own still reads the host directory", err)
			}
			sh(t, b, name, "root", `p=$(cat /tmp/v); kill -9 $p; while test -e /proc/$p; do sleep 0.05; done; rm -f /tmp/v`)
		})
	}
	if err := b.AttachMount(ctx, name, hm); err != nil {
		t.Fatal(err)
	}
	if err := b.DetachMount(ctx, name, hm.Device()); err != nil {
		t.Fatalf("DetachMount with no namespace of its own left: %v", err)
	}
}

// TestAttackStateFlood: root inside gives the container's interfaces
// addresses at will (or makes interfaces), and Incus's answer to
// /1.0/instances/NAME/state lists every one: the backend asks it for the
// init's pid (after each broker start, each restart of the container)
// and read all of it, before every Exec and detach. What is read of it
// is bounded; past the bound, what the container covers cannot be told
// (fail closed: Exec refuses, a detach says the mount may be elsewhere).
func TestAttackStateFlood(t *testing.T) {
	b, project := newBackendIn(t)
	ctx := context.Background()
	const name = "state"
	if _, err := b.Create(ctx, backend.CreateOptions{Name: name}); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx, name); err != nil {
		t.Fatal(err)
	}
	hm := backend.HostMount{Name: "data", Source: backendtest.HostDir(t)}
	if err := b.AttachMount(ctx, name, hm); err != nil {
		t.Fatal(err)
	}
	// The image has no ip(8): netlink from perl. Each message is
	// RTM_NEWADDR of fd00::N/128 on lo (ifindex 1).
	sh(t, b, name, "root", `perl -e 'socket(my $s, 16, 3, 0) or die "socket: $!"; for my $i (1..30000) {
		my $a = pack("n8", 0xfd00, 0, 0, 0, 0, 0, $i >> 16, $i & 0xffff);
		send($s, pack("LSSLL CCCCL SS a16", 44, 20, 0x601, $i, 0, 10, 128, 0, 0, 1, 20, 2, $a), 0) or die "send: $!" }'`)
	out, err := exec.Command("incus", "query", "/1.0/instances/"+name+"/state?project="+project).Output()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the state is %d KiB", len(out)>>10)
	fresh := openIn(t, project, nil) // knows no init yet: asks for the state
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	_, err = fresh.Exec(ctx, name, backend.ExecOptions{Argv: []string{"true"}})
	took := time.Since(start)
	runtime.ReadMemStats(&after)
	grew := after.TotalAlloc - before.TotalAlloc
	t.Logf("Exec: %v; it took %v, the broker allocated %d KiB", err, took, grew>>10)
	if grew > uint64(len(out))/2 {
		t.Fatalf("the broker allocated %d KiB for an Exec while the state is %d KiB: it reads the state unbounded", grew>>10, len(out)>>10)
	}
	if !errors.Is(err, incus.ErrCovered) {
		t.Fatalf("Exec with a state past the bound: %v, want ErrCovered", err)
	}
	if err := fresh.DetachMount(ctx, name, hm.Device()); !errors.Is(err, incus.ErrMountCopied) {
		t.Fatalf("DetachMount with a state past the bound: %v, want ErrMountCopied", err)
	}
}

// TestAttackTaskLimitEgressRelay: the agent fills the container's task
// limit, then churns connections through the egress relay
// (backendtest.EgressChurnAtTaskLimit), a Go program
// in that limit. Go aborts when it cannot make a thread it needs, so the
// relay must make none: it keeps serving (a new connection is accepted,
// then closed, as no proxy is attached here) with the threads it made at
// start.
func TestAttackTaskLimitEgressRelay(t *testing.T) {
	b, project := newBackendIn(t)
	ctx := context.Background()
	const name = "relay"
	if _, err := b.Create(ctx, backend.CreateOptions{Name: name, Limits: backend.Limits{Pids: 64, MemoryBytes: 512 << 20, CPUWeight: 100}}); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx, name); err != nil {
		t.Fatal(err)
	}
	relay := egressRelayPID(t, project, name)
	// The count it settles at as it starts, before any connection.
	threads := 0
	for range 5 {
		threads = max(threads, threadsOf(t, relay))
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("the relay has %d threads", threads)

	backendtest.EgressChurnAtTaskLimit(t, b, name)
	if got := threadsOf(t, relay); got > threads {
		t.Errorf("the relay went from %d threads to %d at the task limit", threads, got)
	}
	if hits := pidsMaxEvents(t, relay); hits <= 0 {
		t.Errorf("pids.events max %d in the relay's cgroup: the limit was never reached", hits)
	}
}

// pidsMaxEvents is how often a fork failed at pids.max in pid's pids
// cgroup (cgroup v1, as on the test machines; v2's unified path else).
func pidsMaxEvents(t *testing.T, pid int) int {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	dir := ""
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		if slices.Contains(strings.Split(f[1], ","), "pids") {
			dir = filepath.Join("/sys/fs/cgroup/pids", f[2])
		} else if f[1] == "" && dir == "" {
			dir = filepath.Join("/sys/fs/cgroup", f[2])
		}
	}
	ev, err := os.ReadFile(filepath.Join(dir, "pids.events"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(ev), "\n") {
		if v, ok := strings.CutPrefix(line, "max "); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

// egressRelayPID finds the host pid of the container's egress relay: the
// `_egress-listen -serve` process in the pid namespace of its init.
func egressRelayPID(t *testing.T, project, name string) int {
	t.Helper()
	out, err := exec.Command("incus", "query", "/1.0/instances/"+name+"/state?project="+project).Output()
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		PID int `json:"pid"`
	}
	if err := json.Unmarshal(out, &st); err != nil || st.PID <= 0 {
		t.Fatalf("the container's init: %v %s", err, out)
	}
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", st.PID))
	if err != nil {
		t.Fatal(err)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		cmd, _ := os.ReadFile(p + "/cmdline")
		if !bytes.Contains(cmd, []byte(incus.EgressCommand+"\x00-serve")) {
			continue
		}
		if got, _ := os.Readlink(p + "/ns/pid"); got == ns {
			pid, _ := strconv.Atoi(filepath.Base(p))
			return pid
		}
	}
	t.Fatal("no egress relay in the container")
	return 0
}

// threadsOf counts a host process's threads.
func threadsOf(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatalf("the relay (%d) is gone: %v", pid, err)
	}
	return len(ents)
}

// TestAttackSetuidGainsNothing: a setuid-root program in a sandbox runs
// with the agent's uid under every command the broker runs there, framed
// or on a terminal (no_new_privs). Two ways one gets there: another
// sandbox's root writes it to a named host directory both sandboxes
// mount (their containers share one idmap, so its owner is root in
// either, and Incus's read-only remount drops nosuid), or root inside
// the sandbox plants it itself, for the agent to find.
func TestAttackSetuidGainsNothing(t *testing.T) {
	b := newBackend(t)
	ctx := t.Context()
	for _, name := range []string{"planter", "victim"} {
		if _, err := b.Create(ctx, backend.CreateOptions{Name: name}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Destroy(context.Background(), name) })
		if err := b.Start(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	dir := backendtest.HostDir(t)
	rw := backend.HostMount{Name: "d", Source: dir}
	ro := backend.HostMount{Name: "d", Source: dir, ReadOnly: true}
	if err := b.AttachMount(ctx, "planter", rw); err != nil {
		t.Fatal(err)
	}
	if err := b.AttachMount(ctx, "victim", ro); err != nil {
		t.Fatal(err)
	}
	sh(t, b, "planter", "root", "cp /usr/bin/id "+rw.Path()+"/suid-id && chmod 4755 "+rw.Path()+"/suid-id")
	sh(t, b, "victim", "root", "cp /usr/bin/id /usr/local/bin/suid-id && chmod 4755 /usr/local/bin/suid-id")
	if got := sh(t, b, "victim", "", "stat -c %u:%a "+ro.Path()+"/suid-id"); got != "0:4755" {
		t.Fatalf("the planted program in the victim's mount is %s, want 0:4755 (setuid root): the test proves nothing", got)
	}
	agent := strconv.Itoa(incus.AgentUID)
	// Without the flag the bit takes effect there: root drops to the
	// agent's uid with setpriv (no no_new_privs) and runs it.
	if got := sh(t, b, "victim", "root", "setpriv --reuid="+agent+" --regid="+agent+" --clear-groups "+ro.Path()+"/suid-id -u"); got != "0" {
		t.Fatalf("the planted program run without no_new_privs: effective uid %s, want 0: the test proves nothing", got)
	}
	for _, prog := range []string{ro.Path() + "/suid-id", "/usr/local/bin/suid-id"} {
		if got := sh(t, b, "victim", "", prog+" -u"); got != agent {
			t.Errorf("%s run by the agent: effective uid %s, want %s", prog, got, agent)
		}
		// On a terminal, the command execs itself (no framer): it writes
		// what it saw to a file read afterwards.
		master, slave, err := term.OpenPTY()
		if err != nil {
			t.Fatal(err)
		}
		go io.Copy(io.Discard, master)
		code, err := b.Exec(ctx, "victim", backend.ExecOptions{TTY: true, Stdin: slave, Stdout: slave, Stderr: slave,
			Argv: []string{"sh", "-c", prog + " -u > /tmp/tty-uid"}})
		slave.Close()
		master.Close()
		if err != nil || code != 0 {
			t.Fatalf("terminal exec: %d, %v", code, err)
		}
		if got := sh(t, b, "victim", "", "cat /tmp/tty-uid"); got != agent {
			t.Errorf("%s run by the agent on a terminal: effective uid %s, want %s", prog, got, agent)
		}
	}
}
