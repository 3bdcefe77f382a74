package local_test

// Attacks on a running local sandbox, each repeated as a test with real
// bubblewrap, cgroups and git, asserting what the attacker would see. The
// tests run contained (TestMain): a regression fails them with EROFS
// instead of damaging the host.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"agentbox/internal/backend"
	"agentbox/internal/backend/backendtest"
	"agentbox/internal/backend/local"
	"agentbox/internal/term"
	"agentbox/internal/testutil/testbin"
	"agentbox/internal/testutil/wait"
)

// helperEnv selects a helper test when this binary is re-executed.
const helperEnv = "AGENTBOX_LOCAL_TEST_HELPER"

// nobody is the uid (and gid) a non-root broker test runs as.
const nobody = 65534

// TestAttackHostIdentity: no process of a sandbox is root on the host, its
// user namespace maps no id to host root, and two sandboxes run as
// different host uids that see nothing of each other.
func TestAttackHostIdentity(t *testing.T) {
	f := newFixture(t)
	// A root broker never runs a sandbox as its own uid.
	root := backendtest.Name(t, "asroot")
	if _, err := f.b.Create(t.Context(), backend.CreateOptions{Name: root, Limits: testLimits}); err == nil {
		f.b.Destroy(context.Background(), root)
		t.Fatal("a root broker created a sandbox without an unprivileged host uid")
	}
	if list, err := f.b.List(t.Context()); err != nil || len(list) != 0 {
		t.Fatalf("a refused Create left %+v, %v", list, err)
	}
	a := f.start("ida", testLimits)
	b := f.start("idb", testLimits)
	if a.uid == b.uid {
		t.Fatalf("two sandboxes share host uid %d", a.uid)
	}
	// Background commands, so the check covers more than the supervisor.
	mustSh(t, f.b, a.name, "nohup sleep 3601 >/dev/null 2>&1 &")
	mustSh(t, f.b, b.name, "nohup sleep 3602 >/dev/null 2>&1 &")
	hostNS, err := os.Readlink("/proc/self/ns/user")
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range []box{a, b} {
		m := readMeta(t, x.dir)
		if m.UID != x.uid || m.GID != x.uid {
			t.Fatalf("%s: meta uid/gid %d/%d, want the host uid %d", x.name, m.UID, m.GID, x.uid)
		}
		st := procStatus(m.PID)
		if st == nil {
			t.Fatalf("%s: no supervisor at host pid %d", x.name, m.PID)
		}
		if !idsAre(st["Uid"], x.uid) || !idsAre(st["Gid"], x.uid) || st["Groups"] != "" {
			t.Errorf("%s: the supervisor runs on the host as Uid %q Gid %q Groups %q, want only %d", x.name, st["Uid"], st["Gid"], st["Groups"], x.uid)
		}
		pids := cgroupPids(t, x.uuid)
		if !slices.Contains(pids, m.PID) || len(pids) < 3 {
			t.Fatalf("%s: cgroup processes %v, want the supervisor %d, bubblewrap and the sleep", x.name, pids, m.PID)
		}
		inside := 0
		for _, pid := range pids {
			st := procStatus(pid)
			if st == nil {
				continue // ended meanwhile
			}
			if !idsAre(st["Uid"], x.uid) || !idsAre(st["Gid"], x.uid) {
				t.Errorf("%s: process %d (%s) runs on the host as Uid %q Gid %q, want %d", x.name, pid, st["Name"], st["Uid"], st["Gid"], x.uid)
			}
			ns, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/user")
			if err != nil || ns == hostNS {
				continue // bubblewrap's monitor stays in the host's namespace
			}
			inside++
			// Read from the host, a map shows host ids: only the sandbox's uid,
			// one id, and never 0.
			for _, file := range []string{"uid_map", "gid_map"} {
				data := readTrim(t, "/proc/"+strconv.Itoa(pid)+"/"+file)
				for _, line := range strings.Split(data, "\n") {
					fl := strings.Fields(line)
					if len(fl) != 3 || fl[1] != strconv.Itoa(x.uid) || fl[2] != "1" {
						t.Errorf("%s: process %d %s line %q, want one id mapped to host %d (host 0 never)", x.name, pid, file, line, x.uid)
					}
				}
			}
		}
		if inside == 0 {
			t.Fatalf("%s: no process of the cgroup is in a user namespace of its own", x.name)
		}
		// Inside, exactly one id exists: the agent's.
		for _, line := range strings.Split(mustSh(t, f.b, x.name, "cat /proc/self/uid_map /proc/self/gid_map"), "\n") {
			if fl := strings.Fields(line); len(fl) != 3 || fl[0] != strconv.Itoa(backend.AgentUID) || fl[2] != "1" {
				t.Errorf("%s: map inside %q, want only id %d, one id", x.name, line, backend.AgentUID)
			}
		}
	}
	for _, p := range []int{0, 1} {
		x, other, otherSleep := a, b, "sleep 3602"
		if p == 1 {
			x, other, otherSleep = b, a, "sleep 3601"
		}
		ps := mustSh(t, f.b, x.name, "ps -eo args=")
		if strings.Contains(ps, otherSleep) || len(strings.Split(ps, "\n")) > 4 {
			t.Errorf("%s sees processes that are not its own (%s's is %q):\n%s", x.name, other.name, otherSleep, ps)
		}
		for _, pid := range cgroupPids(t, x.uuid) {
			if slices.Contains(cgroupPids(t, other.uuid), pid) {
				t.Errorf("process %d is in the cgroups of both %s and %s", pid, x.name, other.name)
			}
		}
	}
}

// TestAttackKernelKnobs: the kernel's knobs stay read-only, no nested user
// namespace, no capability, and a setuid-root program runs unprivileged.
func TestAttackKernelKnobs(t *testing.T) {
	f := newFixture(t)
	x := f.start("knobs", testLimits)

	burst := readTrim(t, "/proc/sys/kernel/printk_ratelimit_burst")
	n, err := strconv.Atoi(burst)
	if err != nil {
		t.Fatal(err)
	}
	knobs := []struct{ path, evil string }{
		// A "|program" pattern would run a program as host root on a crash;
		// a plain name is enough to see whether the write lands.
		{"/proc/sys/kernel/core_pattern", "core.agentbox-probe"},
		{"/proc/sys/kernel/printk_ratelimit_burst", strconv.Itoa(n + 7)},
	}
	for _, k := range knobs {
		before := readTrim(t, k.path)
		t.Cleanup(func() {
			if readTrim(t, k.path) != before {
				os.WriteFile(k.path, []byte(before+"\n"), 0) // undo the escape
			}
		})
		if r := sh(t, f.b, x.name, "echo '"+k.evil+"' > "+k.path); r.Code == 0 {
			t.Errorf("wrote %s inside the sandbox", k.path)
		}
		if after := readTrim(t, k.path); after != before {
			t.Errorf("host %s changed from %q to %q", k.path, before, after)
		}
	}
	if got := sh(t, f.b, x.name, "find /proc/sys -type f -writable 2>/dev/null | head -n 5").Stdout; got != "" {
		t.Errorf("writable /proc/sys files inside:\n%s", got)
	}
	if r := sh(t, f.b, x.name, "echo h > /proc/sysrq-trigger"); r.Code == 0 {
		t.Error("wrote /proc/sysrq-trigger inside the sandbox")
	}
	if _, err := os.Stat("/proc/sysrq-trigger"); err != nil {
		t.Log("this kernel has no /proc/sysrq-trigger: its check only shows the write fails")
	}

	for _, argv := range [][]string{{"unshare", "-U", "true"}, {"unshare", "-U", "-r", "true"}, {"unshare", "-U", "-r", "-m", "-p", "-f", "true"}} {
		if r, err := run(t, f.b, x.name, backend.ExecOptions{Argv: argv}); err != nil || r.Code == 0 {
			t.Errorf("%q inside: exit %d, %v; want a refused user namespace", argv, r.Code, err)
		}
	}

	status := map[string]string{}
	for _, line := range strings.Split(mustSh(t, f.b, x.name, "cat /proc/self/status"), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			status[k] = strings.TrimSpace(v)
		}
	}
	if status["NoNewPrivs"] != "1" {
		t.Errorf("NoNewPrivs %q inside, want 1", status["NoNewPrivs"])
	}
	for _, c := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		if status[c] != "0000000000000000" {
			t.Errorf("%s %q inside, want no capability", c, status[c])
		}
	}

	// A setuid- and setgid-root copy of id, planted by the host.
	plant := func(path string) {
		copyFile(t, "/usr/bin/id", path, 0o755)
		if err := os.Chown(path, 0, 0); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, 0o755|os.ModeSetuid|os.ModeSetgid); err != nil {
			t.Fatal(err)
		}
	}
	// Control: on the host the copy makes the sandbox's uid root.
	control := filepath.Join(worldDir(t), "suid-id")
	plant(control)
	cmd := exec.Command(control, "-u")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(x.uid), Gid: uint32(x.uid)}}
	if out, err := cmd.Output(); err != nil || strings.TrimSpace(string(out)) != "0" {
		t.Fatalf("control: the setuid copy run as %d on the host printed %q, %v; want 0", x.uid, out, err)
	}
	plant(filepath.Join(x.checkout(), "suid-id"))
	if got := mustSh(t, f.b, x.name, "stat -c %a suid-id; ./suid-id -u; ./suid-id -g"); got != "6755\n1000\n1000" {
		t.Errorf("a setuid-root program inside: %q, want mode 6755 and ids 1000 1000", got)
	}
	// The system's own setuid programs give no root either.
	r := sh(t, f.b, x.name, "su -c 'id -u' root </dev/null 2>&1; echo 'id -u' | newgrp agent 2>&1; echo 'id -u' | newgrp root 2>&1")
	for _, line := range strings.Split(r.Stdout, "\n") {
		if strings.TrimSpace(line) == "0" {
			t.Errorf("su or newgrp ran a command as uid 0 inside:\n%s", r.Stdout)
		}
	}
}

// TestAttackForkLoop: a fork loop stops at the sandbox's pids limit while
// another sandbox and the broker carry on, and Destroy ends it all.
func TestAttackForkLoop(t *testing.T) {
	f := newFixture(t)
	const maxPids = 64
	x := f.start("forker", backend.Limits{Pids: maxPids, MemoryBytes: 512 << 20, CPUWeight: 100})
	other := f.start("bystander", testLimits)
	pidsDir := cgroupDirs(t, x.uuid)["pids"]
	supervisor := readMeta(t, x.dir).PID
	unitTasks := 1 + len(tasksOf(t, supervisor))

	r := sh(t, f.b, x.name, `i=0; while [ $i -lt 5000 ]; do sleep 3600 & i=$((i+1)); done; echo "all $i started"`)
	if r.Code == 0 || strings.Contains(r.Stdout, "all") || !strings.Contains(strings.ToLower(r.Stderr), "fork") {
		t.Fatalf("fork loop: exit %d, stdout %q, stderr %q; want it stopped by fork failures", r.Code, r.Stdout, r.Stderr)
	}
	// Its sleeps hold the sandbox at its limit, which counts the
	// sandbox's own tasks: the unit's (bubblewrap's monitor, the
	// supervisor's threads) come on top.
	if got, want := readTrim(t, filepath.Join(pidsDir, "pids.max")), strconv.Itoa(maxPids+unitTasks); got != want {
		t.Errorf("pids.max %s, want the limit %d and the unit's %d tasks", got, maxPids, unitTasks)
	}
	cur, err := strconv.Atoi(readTrim(t, filepath.Join(pidsDir, "pids.current")))
	if err != nil || cur > maxPids+unitTasks {
		t.Errorf("pids.current %d (%v), over pids.max", cur, err)
	}
	requireSupervisor(t, x, supervisor)
	// Every process but bubblewrap's monitor and the supervisor is a
	// sleep: the loop's shell and its sleeps reached the limit, then the
	// shell ended.
	if sleeps := len(cgroupPids(t, x.uuid)) - 2; sleeps != maxPids-1 {
		t.Errorf("%d sleeps hold the sandbox, want its limit %d less the loop's shell (pids.current %d)", sleeps, maxPids, cur)
	}
	if hits := keyed(t, filepath.Join(pidsDir, "pids.events"), "max"); hits <= 0 {
		t.Errorf("pids.events max %d: the limit was never hit", hits)
	}
	if r, err := run(t, f.b, x.name, backend.ExecOptions{Argv: []string{"sh", "-c", "sleep 3600 & sleep 3600 & sleep 3600 & echo three"}}); err == nil && strings.Contains(r.Stdout, "three") {
		t.Errorf("the full sandbox still forked three more: %+v", r)
	}

	// Meanwhile another sandbox, the broker and the host answer.
	if got := mustSh(t, f.b, other.name, "echo still here"); got != "still here" {
		t.Fatalf("the other sandbox: %q", got)
	}
	list, err := f.b.List(t.Context())
	if err != nil || len(list) != 2 {
		t.Fatalf("List while the loop holds its sandbox: %+v, %v", list, err)
	}
	if err := exec.Command("true").Run(); err != nil {
		t.Fatalf("the host cannot fork: %v", err)
	}

	ctx, cancel := context.WithTimeout(t.Context(), hangGuard)
	defer cancel()
	if err := f.b.Destroy(ctx, x.name); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	checkUnitGone(t, x)
	checkDirGone(t, x)
}

// TestAttackMemoryHog: a memory hog is killed inside its own sandbox only;
// the sandbox's supervisor and the other sandbox go on.
func TestAttackMemoryHog(t *testing.T) {
	f := newFixture(t)
	hog := f.start("hog", backend.Limits{Pids: 256, MemoryBytes: 64 << 20, CPUWeight: 100})
	other := f.start("bystander", testLimits)
	supervisor := readMeta(t, hog.dir).PID
	otherKills := oomKills(t, other.uuid)

	// tail keeps the whole newline-free stream: 200 MB against 64 MiB.
	r := sh(t, f.b, hog.name, `head -c 200000000 /dev/zero | tail >/dev/null; echo "tail ended $?"`)
	if got := strings.TrimSpace(r.Stdout); got != "tail ended 137" {
		t.Fatalf("memory hog: %q (stderr %q), want it killed (137)", got, r.Stderr)
	}
	if kills := oomKills(t, hog.uuid); kills <= 0 {
		t.Errorf("oom_kill %d in the hog's memory cgroup: the kill was not there", kills)
	}
	if m := readMeta(t, hog.dir); m.PID != supervisor || procStatus(supervisor) == nil {
		t.Fatalf("the hog's supervisor %d did not survive (meta pid now %d)", supervisor, m.PID)
	}
	if got := mustSh(t, f.b, hog.name, "echo alive"); got != "alive" {
		t.Fatalf("the hog's sandbox after the kill: %q", got)
	}
	if kills := oomKills(t, other.uuid); kills != otherKills {
		t.Errorf("oom_kill in the other sandbox went from %d to %d", otherKills, kills)
	}
	if got := mustSh(t, f.b, other.name, "echo fine"); got != "fine" {
		t.Fatalf("the other sandbox: %q", got)
	}
}

// TestAttackTmpFill: a sandbox filling its tmpfs /tmp gets "no space
// left" at half its memory limit; the OOM killer, which the tmpfs's
// pages would leave only the sandbox's processes to pick from (the
// supervisor first), is not called, and the sandbox goes on.
func TestAttackTmpFill(t *testing.T) {
	f := newFixture(t)
	x := f.start("filler", backend.Limits{Pids: 256, MemoryBytes: 64 << 20, CPUWeight: 100})
	supervisor := readMeta(t, x.dir).PID
	r, err := run(t, f.b, x.name, backend.ExecOptions{Argv: []string{"sh", "-c", "head -c 200000000 /dev/zero > /tmp/fill; echo $?"}})
	if err != nil {
		t.Fatalf("filling /tmp ended the sandbox: %v", err)
	}
	if strings.TrimSpace(r.Stdout) == "0" || !strings.Contains(r.Stderr, "No space left on device") {
		t.Fatalf("200 MB into /tmp under 64 MiB: %q %q, want no space left", r.Stdout, r.Stderr)
	}
	if m := readMeta(t, x.dir); m.PID != supervisor || procStatus(supervisor) == nil {
		t.Fatalf("the supervisor %d did not survive (meta pid now %d)", supervisor, m.PID)
	}
	if got := mustSh(t, f.b, x.name, "du -m /tmp/fill | cut -f1"); got != "32" {
		t.Fatalf("/tmp holds %s MiB, want half the memory limit (32)", got)
	}
	// /dev/shm, the agent's other tmpfs, is bounded too (an eighth).
	r, err = run(t, f.b, x.name, backend.ExecOptions{Argv: []string{"sh", "-c", "head -c 200000000 /dev/zero > /dev/shm/fill; echo $?"}})
	if err != nil {
		t.Fatalf("filling /dev/shm ended the sandbox: %v", err)
	}
	if strings.TrimSpace(r.Stdout) == "0" || !strings.Contains(r.Stderr, "No space left on device") {
		t.Fatalf("200 MB into /dev/shm under 64 MiB: %q %q, want no space left", r.Stdout, r.Stderr)
	}
	if got := mustSh(t, f.b, x.name, "du -m /dev/shm/fill | cut -f1"); got != "8" {
		t.Fatalf("/dev/shm holds %s MiB, want an eighth of the memory limit (8)", got)
	}
	if m := readMeta(t, x.dir); m.PID != supervisor || procStatus(supervisor) == nil {
		t.Fatalf("the supervisor %d did not survive /dev/shm (meta pid now %d)", supervisor, m.PID)
	}
	if kills := oomKills(t, x.uuid); kills != 0 {
		t.Errorf("oom_kill %d in the sandbox's memory cgroup", kills)
	}
}

// TestAttackStopAndDestroyEndEverything: whoever started a process (a
// loop put in the background by Exec, in a session of its own), Stop ends
// it and removes the cgroups, and Destroy also removes the directory.
func TestAttackStopAndDestroyEndEverything(t *testing.T) {
	f := newFixture(t)
	x := f.start("loop", testLimits)
	loop := func(beat string) {
		t.Helper()
		mustSh(t, f.b, x.name, "setsid -f sh -c 'while :; do date +%s%N > /home/agent/"+beat+"; sleep 0.05; done' >/dev/null 2>&1; nohup sleep 3600 >/dev/null 2>&1 &")
		wait.For(t, "heartbeat", func() bool {
			_, err := os.Stat(filepath.Join(x.home(), beat))
			return err == nil
		})
		if procs := hostProcsOf(t, x.uid); len(procs) < 4 {
			t.Fatalf("host processes of uid %d: %v, want bubblewrap, the supervisor, the loop and the sleep", x.uid, procs)
		}
	}

	loop("beat1")
	// A command still running when the sandbox stops.
	errc := make(chan error, 1)
	go func() {
		_, err := f.b.Exec(context.Background(), x.name, backend.ExecOptions{Argv: []string{"sh", "-c", "touch /tmp/running; exec sleep 3600"}})
		errc <- err
	}()
	wait.For(t, "running command", func() bool {
		r, err := run(t, f.b, x.name, backend.ExecOptions{Argv: []string{"test", "-e", "/tmp/running"}})
		return err == nil && r.Code == 0
	})
	ctx, cancel := context.WithTimeout(t.Context(), hangGuard)
	defer cancel()
	if err := f.b.Stop(ctx, x.name); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, backend.ErrNotRunning) {
			t.Errorf("an Exec ended by Stop: %v, want ErrNotRunning", err)
		}
	case <-time.After(hangGuard):
		t.Fatal("an Exec running during Stop never returned")
	}
	checkUnitGone(t, x)
	if _, err := os.Stat(filepath.Join(x.dir, "meta.json")); err != nil {
		t.Fatalf("Stop removed the sandbox: %v", err)
	}
	if list, err := f.b.List(t.Context()); err != nil || len(list) != 1 || list[0].Running {
		t.Fatalf("List after Stop: %+v, %v", list, err)
	}

	if err := f.b.Start(t.Context(), x.name); err != nil {
		t.Fatal(err)
	}
	loop("beat2")
	if err := f.b.Destroy(ctx, x.name); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	checkUnitGone(t, x)
	checkDirGone(t, x)
}

// TestAttackBtrfsSubvolumeDestroy: on a btrfs state dir the sandbox's
// uid may create a subvolume in its home, and a read-only snapshot of it,
// without privilege; a subvolume has a device number of its own but is no
// mount, so Destroy must still remove the sandbox instead of refusing it
// forever.
func TestAttackBtrfsSubvolumeDestroy(t *testing.T) {
	requireRoot(t)
	mkfs, err := exec.LookPath("mkfs.btrfs")
	if err != nil {
		t.Skip("no mkfs.btrfs")
	}
	if _, err := exec.LookPath("btrfs"); err != nil {
		t.Skip("no btrfs tool")
	}
	base := t.TempDir()
	img, mnt := filepath.Join(base, "img"), filepath.Join(base, "mnt")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 256<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(mkfs, "-q", img).CombinedOutput(); err != nil {
		t.Skipf("mkfs.btrfs: %v: %s", err, out)
	}
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a btrfs image here: %v: %s", err, out)
	}
	// Registered first, so it runs after the fixture's cleanups.
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })

	f := newFixtureAt(t, filepath.Join(mnt, "sandboxes"))
	x := f.start("subvol", testLimits)
	// A subvolume, and a read-only snapshot of it whose files not even
	// root can unlink while it stays read-only.
	mustSh(t, f.b, x.name, "btrfs subvolume create /home/agent/sv >/dev/null && mkdir /home/agent/sv/d && echo x > /home/agent/sv/d/f && "+
		"btrfs subvolume snapshot -r /home/agent/sv /home/agent/ro >/dev/null")
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(x.home(), "sv"), &st); err != nil {
		t.Fatal(err)
	}
	var home unix.Stat_t
	if err := unix.Lstat(x.home(), &home); err != nil {
		t.Fatal(err)
	}
	if st.Dev == home.Dev {
		t.Fatal("the subvolume shares its parent's device number: nothing to test")
	}
	ctx, cancel := context.WithTimeout(t.Context(), hangGuard)
	defer cancel()
	if err := f.b.Destroy(ctx, x.name); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	checkUnitGone(t, x)
	checkDirGone(t, x)
}

// checkUnitGone: no live host process runs as the sandbox's uid and its
// cgroups are removed.
func checkUnitGone(t *testing.T, x box) {
	t.Helper()
	if procs := hostProcsOf(t, x.uid); len(procs) > 0 {
		t.Errorf("host processes of %s's uid %d remain: %v", x.name, x.uid, procs)
	}
	for c, d := range cgroupDirs(t, x.uuid) {
		if _, err := os.Lstat(d); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s's %s cgroup remains (%v)", x.name, c, err)
		}
	}
}

func checkDirGone(t *testing.T, x box) {
	t.Helper()
	if _, err := os.Lstat(x.dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s's directory remains (%v)", x.name, err)
	}
}

// TestAttackUnitOutlivesBroker: a sandbox started by a broker process that
// then exits keeps running; a new backend on the same Root finds it
// running, runs commands in it, and its heartbeat loop never stopped.
func TestAttackUnitOutlivesBroker(t *testing.T) {
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "sandboxes")
	name := backendtest.Name(t, "outlive")
	t.Cleanup(func() {
		b, err := local.New(local.Options{Root: root, Binary: testbin.Jailbee(t)})
		if err == nil {
			if err := b.Destroy(context.Background(), name); err != nil && !errors.Is(err, backend.ErrNotFound) {
				t.Errorf("cleanup Destroy: %v", err)
			}
		}
	})
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*hangGuard)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "-test.run=^TestBrokerProcessHelper$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=broker", "HELPER_ROOT="+root, "HELPER_NAME="+name, "HELPER_UID="+strconv.Itoa(hostUID(t)))
	// Its containment seals a mount namespace of its own, not this one.
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("broker process: %v\n%s", err, out)
	}
	var supervisor int
	var loopPID string
	for _, line := range strings.Split(string(out), "\n") {
		if rest, ok := strings.CutPrefix(line, "HELPER-BROKER-DONE "); ok {
			fmt.Sscanf(rest, "supervisor=%d loop=%s", &supervisor, &loopPID)
		}
	}
	if supervisor == 0 || loopPID == "" {
		t.Fatalf("the broker process did not start the sandbox:\n%s", out)
	}

	// The broker restarts: a new backend on the same Root.
	b := openBackend(t, root)
	list, err := b.List(t.Context())
	if err != nil || len(list) != 1 || list[0].Name != name || !list[0].Running {
		t.Fatalf("List after the broker restarted: %+v, %v; want %s running", list, err, name)
	}
	if m := readMeta(t, filepath.Join(root, name)); m.PID != supervisor || procStatus(supervisor) == nil {
		t.Fatalf("supervisor %d gone (meta pid %d)", supervisor, m.PID)
	}
	// The same loop process, still beating.
	if got := mustSh(t, b, name, "cat /home/agent/beat.pid; kill -0 $(cat /home/agent/beat.pid) && echo alive"); got != loopPID+"\nalive" {
		t.Fatalf("heartbeat loop: %q, want pid %s alive", got, loopPID)
	}
	first, err := strconv.Atoi(mustSh(t, b, name, "cat /home/agent/beat.n"))
	if err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the heartbeat to go on", func() bool {
		n, err := strconv.Atoi(mustSh(t, b, name, "cat /home/agent/beat.n"))
		return err == nil && n > first
	})
}

// TestBrokerProcessHelper is TestAttackUnitOutlivesBroker's broker: it
// starts the sandbox and a heartbeat loop in it, then exits.
func TestBrokerProcessHelper(t *testing.T) {
	if os.Getenv(helperEnv) != "broker" {
		t.Skip("helper of TestAttackUnitOutlivesBroker")
	}
	root, name := os.Getenv("HELPER_ROOT"), os.Getenv("HELPER_NAME")
	uid, err := strconv.Atoi(os.Getenv("HELPER_UID"))
	if err != nil {
		t.Fatal(err)
	}
	b := openBackend(t, root)
	if _, err := b.Create(t.Context(), backend.CreateOptions{Name: name, HostUID: uid, Limits: testLimits}); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	mustSh(t, b, name, `setsid -f sh -c 'echo $$ > /home/agent/beat.pid; n=0; while :; do n=$((n+1)); echo $n > /home/agent/beat.tmp; mv /home/agent/beat.tmp /home/agent/beat.n; sleep 0.05; done' >/dev/null 2>&1`)
	wait.For(t, "heartbeat", func() bool {
		return sh(t, b, name, "test -s /home/agent/beat.pid && test -s /home/agent/beat.n").Code == 0
	})
	loop := mustSh(t, b, name, "cat /home/agent/beat.pid")
	// No Destroy: the sandbox must outlive this process.
	fmt.Printf("HELPER-BROKER-DONE supervisor=%d loop=%s\n", readMeta(t, filepath.Join(root, name)).PID, loop)
}

// TestAttackDestroyUnderSymlinkSwaps: while Destroy runs, the host swaps
// directories of the checkout for symlinks to a directory outside the
// sandbox and back; the sandbox also holds a symlink out, a read-only tree
// and a hard link to an outside file. Nothing outside changes.
func TestAttackDestroyUnderSymlinkSwaps(t *testing.T) {
	requireRoot(t)
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	outsideFile := filepath.Join(base, "outside-file.txt")
	for path, content := range map[string]string{
		"keep.txt": "keep\n", "sub/deep.txt": "deep\n", "locked/inner.txt": "inner\n", "a/b/f": "nested\n",
	} {
		p := filepath.Join(outside, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for path, mode := range map[string]os.FileMode{"locked": 0o500, "keep.txt": 0o400} {
		if err := os.Chmod(filepath.Join(outside, path), mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(outsideFile, []byte("outside file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, outside)
	fileBefore := snapshot(t, outsideFile)

	f := newFixtureAt(t, filepath.Join(base, "sandboxes"))
	iterations, refused := 50, 0
	if testing.Short() {
		iterations = 10
	}
	// A bound on the work, not a measure: a loaded machine does fewer.
	budget := time.Now().Add(15 * time.Second)
	var swaps atomic.Int64
	done := 0
	for i := range iterations {
		if i >= 10 && time.Now().After(budget) {
			break
		}
		done++
		x := f.start("swap"+strconv.Itoa(i), testLimits)
		co := x.checkout()
		mustSh(t, f.b, x.name, `mkdir -p swap/a/b deep/x/y ro/sub &&
			for i in $(seq 1 30); do touch swap/f$i swap/a/b/f$i deep/x/y/f$i; done &&
			touch ro/f ro/sub/f && chmod 0500 ro/sub ro`)
		for link, target := range map[string]string{
			filepath.Join(co, "swap.alt"):          outside,
			filepath.Join(co, "deep/x/y.alt"):      outside,
			filepath.Join(co, "link-dir"):          outside,
			filepath.Join(co, "link-file"):         outsideFile,
			filepath.Join(x.home(), "link-parent"): base,
		} {
			if err := os.Symlink(target, link); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Link(outsideFile, filepath.Join(co, "hardlink")); err != nil {
			t.Fatal(err)
		}
		// Swap the two pairs for as long as Destroy runs. Only entries whose
		// parents are never swapped move, so the swapper itself never acts
		// through a symlink.
		pairs := [][2]string{{filepath.Join(co, "swap"), filepath.Join(co, "swap.alt")}, {filepath.Join(co, "deep/x/y"), filepath.Join(co, "deep/x/y.alt")}}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				for _, p := range pairs {
					if unix.Renameat2(unix.AT_FDCWD, p[0], unix.AT_FDCWD, p[1], unix.RENAME_EXCHANGE) == nil {
						swaps.Add(1)
					}
				}
			}
		}()
		ctx, cancel := context.WithTimeout(t.Context(), hangGuard)
		err := f.b.Destroy(ctx, x.name)
		close(stop)
		wg.Wait()
		if err != nil {
			// Refusing a tree that changes under the walk is allowed; once it
			// holds still, Destroy must finish.
			refused++
			t.Logf("iteration %d: Destroy under the swaps: %v", i, err)
			if err := f.b.Destroy(ctx, x.name); err != nil {
				t.Fatalf("Destroy after the swaps stopped: %v", err)
			}
		}
		cancel()
		checkDirGone(t, x)
		if after := snapshot(t, outside); !sameSnapshot(before, after) {
			t.Fatalf("iteration %d changed the outside directory:\nbefore %v\nafter  %v", i, before, after)
		}
		if after := snapshot(t, outsideFile); !sameSnapshot(fileBefore, after) {
			t.Fatalf("iteration %d changed the outside file:\nbefore %v\nafter  %v", i, fileBefore, after)
		}
	}
	if swaps.Load() == 0 {
		t.Fatal("no swap happened")
	}
	t.Logf("%d destroys under %d swaps; %d refused the moving tree at first", done, swaps.Load(), refused)
}

// fileState is what must not change of an outside file or directory.
type fileState struct {
	Mode  fs.FileMode
	MTime time.Time
	Nlink uint64
	Data  string
}

// snapshot records every entry under root (root included).
func snapshot(t *testing.T, root string) map[string]fileState {
	t.Helper()
	out := map[string]fileState{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fileState{Mode: fi.Mode(), MTime: fi.ModTime(), Nlink: fi.Sys().(*syscall.Stat_t).Nlink}
		if fi.Mode().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			st.Data = string(data)
		}
		out[p] = st
		return nil
	})
	if err != nil {
		t.Fatalf("snapshot %s: %v", root, err)
	}
	return out
}

func sameSnapshot(a, b map[string]fileState) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || v.Mode != w.Mode || !v.MTime.Equal(w.MTime) || v.Nlink != w.Nlink || v.Data != w.Data {
			return false
		}
	}
	return true
}

// TestAttackSupervisorEscapes: the control socket is out of reach, the
// supervisor cannot be traced or read, no signal sent to it from inside
// ends the sandbox, and commands still get default signal handling.
func TestAttackSupervisorEscapes(t *testing.T) {
	f := newFixture(t)
	x := f.start("pid1", testLimits)

	// The walk skips the host's read-only system directories: they hold
	// no sandbox state (checked here), and walking a CI machine's /usr
	// with a cold cache outlasted the exec guard.
	skip := []string{"/proc", "/sys"}
	for _, d := range []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"} {
		if x.dir == d || strings.HasPrefix(x.dir, d+"/") {
			t.Fatalf("the sandbox directory %s is under the system directory %s", x.dir, d)
		}
		skip = append(skip, d)
	}
	find := "find /"
	for i, d := range skip {
		if i > 0 {
			find += " -o"
		} else {
			find += ` \(`
		}
		find += " -path " + d
	}
	find += ` \) -prune -o -name control.sock -print 2>/dev/null`
	if got := sh(t, f.b, x.name, find).Stdout; got != "" {
		t.Errorf("the control socket is reachable inside:\n%s", got)
	}
	if r := sh(t, f.b, x.name, "test -e "+filepath.Join(x.dir, "control.sock")); r.Code == 0 {
		t.Errorf("the control socket's host path exists inside")
	}
	if got := strings.TrimSpace(sh(t, f.b, x.name, "grep -c control.sock /proc/net/unix").Stdout); got != "0" {
		t.Errorf("control.sock in the sandbox's /proc/net/unix: %s", got)
	}
	if got := sh(t, f.b, x.name, "ls -l /proc/$$/fd/").Stdout; !strings.Contains(got, "pipe:") || strings.Contains(got, "socket:") {
		t.Errorf("a command's descriptors: want its stdio pipes and no socket:\n%s", got)
	}
	for _, probe := range []string{"ls /proc/1/fd", "cat /proc/1/environ", "readlink -v /proc/1/exe", "readlink -v /proc/1/cwd", "cat /proc/1/maps", "test -r /proc/1/fd/3"} {
		if r := sh(t, f.b, x.name, probe); r.Code == 0 {
			t.Errorf("%q inside succeeded: %q", probe, r.Stdout)
		}
	}
	// ptrace(PTRACE_ATTACH) through perl's syscall: refused on pid 1,
	// allowed (control) on a sibling of the same uid.
	if nr, ok := map[string]int{"amd64": 101, "arm64": 117}[runtime.GOARCH]; ok && sh(t, f.b, x.name, "command -v perl").Code == 0 {
		attach := fmt.Sprintf(`perl -e 'exit(syscall(%d, 16, $ARGV[0]+0, 0, 0) == -1 ? 1 : 0)'`, nr)
		if got := mustSh(t, f.b, x.name, "sleep 600 & p=$!; "+attach+" $p; echo control $?; kill -9 $p; "+attach+" 1; echo pid1 $?"); got != "control 0\npid1 1" {
			t.Errorf("ptrace attach: %q, want the sibling traced (control 0) and pid 1 refused (pid1 1)", got)
		}
	}

	// No signal sent to pid 1 from inside ends the sandbox.
	var ended []string
	for sig := 1; sig <= 64; sig++ {
		run(t, f.b, x.name, backend.ExecOptions{Argv: []string{"kill", "-s", strconv.Itoa(sig), "1"}})
		if r, err := run(t, f.b, x.name, backend.ExecOptions{Argv: []string{"true"}}); err != nil || r.Code != 0 {
			ended = append(ended, fmt.Sprintf("%d (%v)", sig, syscall.Signal(sig)))
			if err := f.b.Stop(t.Context(), x.name); err != nil {
				t.Fatal(err)
			}
			if err := f.b.Start(t.Context(), x.name); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(ended) > 0 {
		t.Errorf("signals to pid 1 from inside ended the sandbox: %s", strings.Join(ended, ", "))
	}
	// A command started afterwards has every signal at its default.
	for sig, want := range map[string]int{"TERM": 143, "INT": 130, "HUP": 129, "SEGV": 139, "USR1": 138} {
		if r := sh(t, f.b, x.name, "kill -"+sig+" $$"); r.Code != want {
			t.Errorf("sh killing itself with SIG%s: exit %d, want %d", sig, r.Code, want)
		}
	}
	if got := mustSh(t, f.b, x.name, "grep -E '^Sig(Ign|Blk):' /proc/self/status"); got != "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000" {
		t.Errorf("a command's signal state: %q, want nothing blocked or ignored", got)
	}
}

// TestAttackNoHostPathsInFiles: nothing in a sandbox's checkout, home or
// /etc names the host's state dir, Root, repository, socket dir or binary.
func TestAttackNoHostPathsInFiles(t *testing.T) {
	requireRoot(t)
	probe := "leakprobe-" + randomHex(t)
	state := filepath.Join(t.TempDir(), "state-"+probe)
	root := filepath.Join(state, "sandboxes")
	f := newFixtureAt(t, root)
	repo := backendtest.NewRepo(t)
	repoPath := filepath.Join(t.TempDir(), "repo-"+probe)
	if err := os.Rename(repo.Path, repoPath); err != nil {
		t.Fatal(err)
	}
	sockDir, _ := fakeBrokerDir(t)
	x := f.create("leak", testLimits)
	if err := f.b.AttachSocket(t.Context(), x.name, backend.OrchestrationSocket, sockDir); err != nil {
		t.Fatal(err)
	}
	if err := f.b.Start(t.Context(), x.name); err != nil {
		t.Fatal(err)
	}
	backendtest.FillCheckout(t, f.b, x.name, repoPath, "main", repo.Second)
	mustSh(t, f.b, x.name, "git status >/dev/null && git log --oneline >/dev/null && echo w > work.txt && git add work.txt && git -c user.name=A -c user.email=a@example.com commit -qm work && jailbee inbox ls >/dev/null")

	needles := []string{probe, state, root, repoPath, sockDir, testbin.Jailbee(t), os.TempDir()}
	var leaks []string
	for _, dir := range []string{x.checkout(), x.home(), filepath.Join(x.dir, "etc")} {
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			var text string
			switch {
			case d.Type()&fs.ModeSymlink != 0:
				text, err = os.Readlink(p)
			case d.Type().IsRegular():
				var data []byte
				data, err = os.ReadFile(p)
				text = string(data)
			}
			if err != nil {
				return err
			}
			for _, n := range needles {
				if strings.Contains(text, n) || strings.Contains(d.Name(), n) {
					leaks = append(leaks, fmt.Sprintf("%s holds %s", p, n))
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(leaks) > 0 {
		t.Fatalf("host paths in the sandbox's files:\n%s", strings.Join(leaks, "\n"))
	}
	if _, err := os.Stat(filepath.Join(x.checkout(), ".git", "HEAD")); err != nil {
		t.Fatalf("the checkout was not filled: %v", err)
	}
}

// TestAttackRefusalWithoutLimits: a broker that is not root (re-executed as
// nobody) cannot set limits, so New refuses and names --no-limits; with
// NoLimits it runs sandboxes, as its own uid, never root.
func TestAttackRefusalWithoutLimits(t *testing.T) {
	requireRoot(t)
	dir := worldDir(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "local.test")
	copyFile(t, exe, bin, 0o755)
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(tmp, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*hangGuard)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-test.run=^TestNobodyBrokerHelper$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=nobody", "TMPDIR="+tmp)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("NOBODY-BROKER-DONE")) || !bytes.Contains(out, []byte("--- PASS: TestNobodyBrokerHelper")) {
		t.Fatalf("as nobody: %v\n%s", err, out)
	}
}

// TestNobodyBrokerHelper is TestAttackRefusalWithoutLimits run as nobody.
func TestNobodyBrokerHelper(t *testing.T) {
	if os.Getenv(helperEnv) != "nobody" {
		t.Skip("helper of TestAttackRefusalWithoutLimits")
	}
	if os.Getuid() != nobody || os.Geteuid() != nobody {
		t.Fatalf("running as %d/%d, want %d", os.Getuid(), os.Geteuid(), nobody)
	}
	root := filepath.Join(t.TempDir(), "sandboxes")
	_, err := local.New(local.Options{Root: root, Binary: testbin.Jailbee(t)})
	if err == nil || !strings.Contains(err.Error(), "--no-limits") {
		t.Fatalf("New without limits as nobody: %v; want a refusal naming --no-limits", err)
	}
	b, err := local.New(local.Options{Root: root, Binary: testbin.Jailbee(t), NoLimits: true})
	if err != nil {
		t.Fatalf("New with NoLimits: %v", err)
	}
	name := backendtest.Name(t, "nobody")
	if _, err := b.Create(t.Context(), backend.CreateOptions{Name: name, HostUID: 12345}); !errors.Is(err, backend.ErrUnsupported) {
		t.Fatalf("Create with another host uid: %v, want ErrUnsupported", err)
	}
	if _, err := b.Create(t.Context(), backend.CreateOptions{Name: name, Limits: testLimits}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Destroy(context.Background(), name); err != nil {
			t.Errorf("Destroy: %v", err)
		}
	})
	if err := b.Start(t.Context(), name); err != nil {
		t.Fatalf("Start as nobody: %v", err)
	}
	if got := mustSh(t, b, name, "id -u; grep NoNewPrivs /proc/self/status; unshare -U true 2>/dev/null || echo no-userns"); got != "1000\nNoNewPrivs:\t1\nno-userns" {
		t.Fatalf("inside: %q", got)
	}
	m := readMeta(t, filepath.Join(root, name))
	if st := procStatus(m.PID); st == nil || !idsAre(st["Uid"], nobody) {
		t.Fatalf("the supervisor runs on the host as %q, want %d", st["Uid"], nobody)
	}
	fmt.Println("NOBODY-BROKER-DONE")
}

// TestExecQuickCommandsNeverHang: many commands that end at once, from a
// few goroutines; each must report its status (a command reaped before
// its connection looked for its status once hung Exec forever).
func TestExecQuickCommandsNeverHang(t *testing.T) {
	f := newFixture(t)
	x := f.start("quick", testLimits)
	const workers, each = 4, 500
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
				code, err := f.b.Exec(ctx, x.name, backend.ExecOptions{Argv: []string{"true"}})
				cancel()
				if err != nil || code != 0 {
					errs <- fmt.Errorf("Exec %d: %d, %v", i, code, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestAttackTTYHeldOnlyByPID1: the host terminal of a terminal exec is
// held inside the sandbox by its supervisor alone, which is non-dumpable
// from its first instruction. A process it executed to hold it (the
// former `jailbee _pty-relay`) is dumpable from its exec until it makes
// itself not, and in that window a process of the sandbox (same uid) can
// open its descriptors through /proc or pidfd_getfd, or ptrace it, and
// keep the host terminal after the command ended.
func TestAttackTTYHeldOnlyByPID1(t *testing.T) {
	f := newFixture(t)
	x := f.start("ptyhold", testLimits)
	master, slave, err := term.OpenPTY()
	if err != nil {
		t.Fatal(err)
	}
	defer master.Close()
	go io.Copy(io.Discard, master)
	var tty unix.Stat_t
	if err := unix.Fstat(int(slave.Fd()), &tty); err != nil {
		t.Fatal(err)
	}
	// Every host process of the sandbox's uid with the terminal open,
	// by its pid inside the sandbox (the last NSpid field).
	holders := func() []string {
		var out []string
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			st := procStatus(pid)
			if !idsAre(st["Uid"], x.uid) {
				continue
			}
			fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
			for _, fd := range fds {
				var s unix.Stat_t
				if unix.Stat(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()), &s) == nil && s.Rdev == tty.Rdev && s.Dev == tty.Dev {
					ns := strings.Fields(st["NSpid"])
					out = append(out, ns[len(ns)-1])
					break
				}
			}
		}
		return out
	}
	seen := map[string]bool{}
	ctx, cancel := context.WithTimeout(t.Context(), hangGuard)
	defer cancel()
	_, err = f.b.Exec(ctx, x.name, backend.ExecOptions{Argv: []string{"sleep", "1"}, TTY: true, Stdin: slave, Stdout: slave, Stderr: slave,
		Started: func() {
			for range 20 {
				for _, p := range holders() {
					seen[p] = true
				}
				time.Sleep(20 * time.Millisecond)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	delete(seen, "1")
	if len(seen) > 0 {
		t.Errorf("processes of the sandbox other than its supervisor held the host terminal (pids inside: %v)", slices.Sorted(maps.Keys(seen)))
	}
	slave.Close()

	// The supervisor lets go of every terminal it relayed, also when the
	// command left a process holding the sandbox's terminal.
	var sup struct {
		PID int `json:"pid"`
	}
	data, err := os.ReadFile(filepath.Join(x.dir, "meta.json"))
	if err != nil || json.Unmarshal(data, &sup) != nil || sup.PID <= 0 {
		t.Fatalf("the supervisor's pid: %v", err)
	}
	fds := func() int {
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", sup.PID))
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	before := fds()
	for range 3 {
		m, s, err := term.OpenPTY()
		if err != nil {
			t.Fatal(err)
		}
		go io.Copy(io.Discard, m)
		if _, err := f.b.Exec(ctx, x.name, backend.ExecOptions{Argv: []string{"sh", "-c", "trap '' HUP; sleep 600 & exit 0"}, TTY: true, Stdin: s, Stdout: s, Stderr: s}); err != nil {
			t.Fatal(err)
		}
		s.Close()
		m.Close()
	}
	// It closes a relayed terminal before it replies: none is left now.
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", sup.PID))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if target, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", sup.PID, e.Name())); strings.HasPrefix(target, "/dev/pts/") || target == "/dev/ptmx" {
			t.Errorf("the supervisor still holds a terminal after its exec ended: fd %s is %s", e.Name(), target)
		}
	}
	// It closes an exec's connection just after its reply, so the count
	// of all its descriptors settles a moment after Exec returns.
	after := fds()
	for deadline := time.Now().Add(wait.Guard); after > before && time.Now().Before(deadline); after = fds() {
		time.Sleep(10 * time.Millisecond)
	}
	if after > before {
		t.Errorf("the supervisor holds %d descriptors after three terminal execs, %d before", after, before)
	}
}

// TestSupervisorThreadsAtTheTaskLimit: a sandbox at its task limit cannot
// end its own unit. The supervisor is a Go program, and Go aborts when it
// cannot make a thread it needs (clone fails with EAGAIN at pids.max), so
// a fork loop or a parallel build at the limit would kill pid 1, and with
// it every process of the sandbox. Here the sandbox fills its limit, then
// execs whose stderr is a full pipe each hold a supervisor thread in a
// blocked write: the supervisor must make no new thread for them.
func TestSupervisorThreadsAtTheTaskLimit(t *testing.T) {
	f := newFixture(t)
	const maxPids = 64
	x := f.start("full", backend.Limits{Pids: maxPids, MemoryBytes: 512 << 20, CPUWeight: 100})
	supervisor := readMeta(t, x.dir).PID
	pidsDir := cgroupDirs(t, x.uuid)["pids"]

	sh(t, f.b, x.name, `i=0; while [ $i -lt 5000 ]; do sleep 3600 & i=$((i+1)); done`)
	threads := len(tasksOf(t, supervisor))
	t.Logf("the supervisor has %d threads", threads)
	full := readTrim(t, filepath.Join(pidsDir, "pids.current"))

	// A blocking pipe with its buffer full: a write to it waits for a
	// reader, holding the thread that makes it.
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	r, w := os.NewFile(uintptr(p[0]), "r"), os.NewFile(uintptr(p[1]), "w")
	defer r.Close()
	defer w.Close()
	if err := unix.SetNonblock(p[1], true); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := unix.Write(p[1], make([]byte, 4096)); err != nil {
			break
		}
	}
	if err := unix.SetNonblock(p[1], false); err != nil {
		t.Fatal(err)
	}

	const execs = 32
	codes := make(chan int, execs)
	for range execs {
		go func() {
			code, _ := f.b.Exec(t.Context(), x.name, backend.ExecOptions{Argv: []string{"no-such-command"}, Stderr: w})
			codes <- code
		}()
	}
	// Wait until the supervisor is blocked writing "command not found" to
	// the full pipe (or is gone).
	deadline := time.Now().Add(hangGuard)
	for !slices.ContainsFunc(waitChannels(supervisor), isPipeWrite) {
		requireSupervisor(t, x, supervisor)
		if time.Now().After(deadline) {
			t.Fatalf("no exec reached its stderr in %v; the supervisor's threads wait in %q", hangGuard, waitChannels(supervisor))
		}
		time.Sleep(10 * time.Millisecond)
	}
	go io.Copy(io.Discard, r)
	for range execs {
		select {
		case code := <-codes:
			if code != 127 {
				t.Errorf("exec of a missing command: %d, want 127", code)
			}
		case <-time.After(hangGuard):
			t.Fatalf("execs still running after %v", hangGuard)
		}
	}

	requireSupervisor(t, x, supervisor)
	if got := len(tasksOf(t, supervisor)); got > threads {
		t.Errorf("the supervisor went from %d threads to %d at the task limit", threads, got)
	}
	if got := readTrim(t, filepath.Join(pidsDir, "pids.current")); got != full {
		t.Errorf("pids.current %s after the execs, %s before: the sandbox's processes did not all survive", got, full)
	}
}

// TestAttackTaskLimitEgressChurn: the sandbox fills its task limit, then
// churns connections through the egress relay
// (backendtest.EgressChurnAtTaskLimit), which the supervisor
// serves: each is accepted and closed (no proxy is attached here), and
// the supervisor makes no thread for them.
func TestAttackTaskLimitEgressChurn(t *testing.T) {
	f := newFixture(t)
	x := f.start("churn", backend.Limits{Pids: 64, MemoryBytes: 512 << 20, CPUWeight: 100})
	supervisor := readMeta(t, x.dir).PID
	threads := len(tasksOf(t, supervisor))

	backendtest.EgressChurnAtTaskLimit(t, f.b, x.name)
	if hits := keyed(t, filepath.Join(cgroupDirs(t, x.uuid)["pids"], "pids.events"), "max"); hits <= 0 {
		t.Errorf("pids.events max %d: the limit was never reached", hits)
	}
	requireSupervisor(t, x, supervisor)
	if got := len(tasksOf(t, supervisor)); got > threads {
		t.Errorf("the supervisor went from %d threads to %d serving the relay at the task limit", threads, got)
	}
}

// tasksOf lists the thread ids of a host process.
func tasksOf(t *testing.T, pid int) []string {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatalf("threads of %d: %v", pid, err)
	}
	var ids []string
	for _, e := range ents {
		ids = append(ids, e.Name())
	}
	return ids
}

// waitChannels lists what each thread of a host process sleeps in (its
// wchan); none when the process is gone.
func waitChannels(pid int) []string {
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	var out []string
	for _, e := range ents {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/wchan", pid, e.Name())); err == nil {
			out = append(out, string(b))
		}
	}
	return out
}

// isPipeWrite: a thread asleep writing to a full pipe.
func isPipeWrite(wchan string) bool { return strings.HasSuffix(wchan, "pipe_write") }

// requireSupervisor fails t unless the sandbox's supervisor is still the
// process pid, and says why it ended (its log) when not.
func requireSupervisor(t *testing.T, x box, pid int) {
	t.Helper()
	if procStatus(pid) == nil || readMeta(t, x.dir).PID != pid {
		t.Fatalf("the supervisor died with its sandbox at its task limit: %s", logExcerpt(filepath.Join(x.dir, "supervisor.log")))
	}
}
