package incus_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"agentbox/internal/backend"
	"agentbox/internal/backend/backendtest"
	"agentbox/internal/backend/incus"
	"agentbox/internal/backend/incus/incustest"
	"agentbox/internal/term"
	"agentbox/internal/testutil/wait"
)

// TestHostileReview: what an attacker's review of the backend found, on
// one sandbox shared by the subtests (in order: each leaves it as it
// found it, running and whole).
func TestHostileReview(t *testing.T) {
	b, project := newBackendIn(t)
	if incustest.Pool() == "" {
		t.Skipf("no %s pool: a disk limit needs a pool that holds it (docs/incus.md)", incustest.FastPool)
	}
	ctx := context.Background()
	const name = "hostile"
	secret := "jbsecret-" + strings.ToLower(rand.Text())
	sock := backendtest.SocketDir(t, "hello\n")
	model := backendtest.KindDir(t, backend.ModelSocket, "model\n")

	// Created and run while an unprivileged host user watches every
	// process's command line: a label holds a host path with the secret.
	t.Run("NoSecretOnAHostCommandLine", func(t *testing.T) {
		w := watchProcs(t, secret)
		labels := map[string]string{"role": "child", "repo": "/srv/" + secret + "/repo"}
		if _, err := b.Create(ctx, backend.CreateOptions{Name: name, Labels: labels, Limits: backend.Limits{DiskBytes: diskLimit}}); err != nil {
			t.Fatal(err)
		}
		if err := b.AttachSocket(ctx, name, backend.OrchestrationSocket, sock); err != nil {
			t.Fatal(err)
		}
		if err := b.AttachSocket(ctx, name, backend.ModelSocket, model); err != nil {
			t.Fatal(err)
		}
		if err := b.Start(ctx, name); err != nil {
			t.Fatal(err)
		}
		// The command's own argv is its own (every host user reads a
		// container process's argv as any other's): it gives the secret
		// up at once (exec), and the check allows exactly that argv.
		argv := []string{"sh", "-c", `test "$JB_SECRET" = "$0" && exec sleep 1`, secret}
		env := map[string]string{"JB_SECRET": secret}
		code, err := b.Exec(ctx, name, backend.ExecOptions{Argv: argv, Env: env})
		if err != nil || code != 0 {
			t.Fatalf("a command given the secret: %d, %v", code, err)
		}
		master, slave, err := term.OpenPTY()
		if err != nil {
			t.Fatal(err)
		}
		defer master.Close()
		go io.Copy(io.Discard, master)
		code, err = b.Exec(ctx, name, backend.ExecOptions{Argv: argv, Env: env, TTY: true, Stdin: slave, Stdout: slave, Stderr: slave})
		slave.Close()
		if err != nil || code != 0 {
			t.Fatalf("a terminal's command given the secret: %d, %v", code, err)
		}
		if leaks := w.stop(argv); len(leaks) > 0 {
			t.Fatalf("host processes showed the secret to an unprivileged user (command line or environment): %s", strings.Join(leaks, "; "))
		}
		// No stashed spec is left behind.
		if out := sh(t, b, name, "root", "ls -A /tmp"); strings.Contains(out, ".jailbee-exec-") {
			t.Fatalf("a terminal's spec was left in /tmp: %q", out)
		}
	})
	if t.Failed() {
		return
	}

	// Root inside covers the jailbee client (the framer of every Exec)
	// with a fake: Exec refuses until Restore puts the client back.
	for _, tc := range []struct{ how, script string }{
		{"a fake bound over it", "mount --bind /tmp/fake " + incus.ClientPath},
		{"unmounted and a fake copied in its place", "while umount -l " + incus.ClientPath + " 2>/dev/null; do :; done; cp /tmp/fake " + incus.ClientPath},
		{"a tmpfs over its directory", "mount -t tmpfs none /usr/local/bin && cp /tmp/fake " + incus.ClientPath},
	} {
		t.Run("ClientCovered/"+tc.how, func(t *testing.T) {
			sh(t, b, name, "root", "printf '#!/bin/sh\\necho fake\\n' > /tmp/fake && chmod 755 /tmp/fake && "+tc.script)
			probe := backend.ExecOptions{Argv: []string{"true"}}
			if _, err := b.Exec(ctx, name, probe); !errors.Is(err, incus.ErrCovered) {
				t.Fatalf("Exec with a fake client: %v, want ErrCovered", err)
			}
			if got := covered(t, b, name); !slices.Equal(got, []string{"client"}) {
				t.Fatalf("List: covered %q, want the client", got)
			}
			if err := b.Restore(ctx, name); err != nil {
				t.Fatal(err)
			}
			if got := covered(t, b, name); len(got) != 0 {
				t.Fatalf("List after Restore: covered %q", got)
			}
			if out := sh(t, b, name, "", "echo real"); out != "real" {
				t.Fatalf("Exec after Restore: %q", out)
			}
		})
	}

	// Root inside covers a socket directory (the orchestration one, then
	// the model one): a round sees it, Restore puts the socket back, the
	// agent reaches it again, and the other directory is left alone.
	for _, kind := range []backend.SocketKind{backend.OrchestrationSocket, backend.ModelSocket} {
		dir := kind.MountPath()
		probe := "test -S " + dir + "/" + kind.SocketFile() + " && echo there"
		cover := map[backend.SocketKind]string{backend.OrchestrationSocket: "socket", backend.ModelSocket: "model"}[kind]
		for _, tc := range []struct{ how, script string }{
			{"a tmpfs", "mount -t tmpfs none " + dir},
			{"a directory bound over it", "mkdir -p /tmp/other && mount --bind /tmp/other " + dir},
		} {
			t.Run("SocketCovered/"+kind.String()+"/"+tc.how, func(t *testing.T) {
				sh(t, b, name, "root", tc.script)
				if out := sh(t, b, name, "", probe+" || echo gone"); out != "gone" {
					t.Fatalf("the socket is still seen inside: %q", out)
				}
				if got := covered(t, b, name); !slices.Equal(got, []string{cover}) {
					t.Fatalf("List: covered %q, want %s", got, cover)
				}
				if err := b.Restore(ctx, name); err != nil {
					t.Fatal(err)
				}
				if got := covered(t, b, name); len(got) != 0 {
					t.Fatalf("List after Restore: covered %q", got)
				}
				both := "test -S " + backend.SocketMountPath + "/broker.sock && test -S " + backend.ModelMountPath + "/anthropic.sock && echo there"
				if out := sh(t, b, name, "", both); out != "there" {
					t.Fatalf("the sockets after Restore: %q", out)
				}
			})
		}
	}

	// Every host path attached, under any device name, is in List: a
	// copy may carry another sandbox's socket directory under another
	// name (the broker's rounds look at them all), and DetachMount takes
	// it off.
	t.Run("MountsUnderAnyName", func(t *testing.T) {
		incusIn(t, project, "config", "device", "add", name, "other", "disk", "source="+sock, "path=/mnt/other", "readonly=true", "shift=true")
		in := find(t, b, name)
		if !slices.Contains(in.Mounts, backend.Mount{Name: "other", Source: sock}) ||
			!slices.Contains(in.Mounts, backend.Mount{Name: backend.SocketDeviceName, Source: sock}) {
			t.Fatalf("List: mounts %+v, want the socket directory under both names", in.Mounts)
		}
		if err := b.DetachMount(ctx, name, "other"); err != nil {
			t.Fatal(err)
		}
		if in := find(t, b, name); slices.ContainsFunc(in.Mounts, func(m backend.Mount) bool { return m.Name == "other" }) || in.SocketDir != sock {
			t.Fatalf("after DetachMount: %+v", in)
		}
	})

	// The root disk is limited: writing stops near the limit (the
	// image's own blocks count on btrfs), with ENOSPC or EDQUOT.
	t.Run("RootDiskLimit", func(t *testing.T) {
		r := backendtest.Exec(t, b, name, backend.ExecOptions{User: "root", Argv: []string{"sh", "-c",
			"err=$(dd if=/dev/zero of=/fill bs=1M count=1024 conv=fsync 2>&1); s=$?; stat -c %s /fill; echo \"$err\"; rm -f /fill; exit $s"}})
		lines := strings.SplitN(r.Stdout, "\n", 2)
		written, err := strconv.ParseInt(lines[0], 10, 64)
		if err != nil || r.Code == 0 {
			t.Fatalf("dd of 1 GiB into a %d MiB root disk: exit %d, %q", diskLimit>>20, r.Code, r.Stdout)
		}
		if !strings.Contains(r.Stdout, "No space left on device") && !strings.Contains(r.Stdout, "Disk quota exceeded") {
			t.Fatalf("dd did not stop for space: %q", r.Stdout)
		}
		const slack = 16 << 20
		if written <= 0 || written > diskLimit+slack {
			t.Fatalf("wrote %d bytes into a root disk of %d", written, diskLimit)
		}
		t.Logf("wrote %d MiB into a %d MiB root disk", written>>20, diskLimit>>20)
	})
}

// diskLimit is the hostile sandbox's root disk.
const diskLimit = 512 << 20

// TestDiskLimitNeedsAPoolThatHoldsIt: a dir pool takes a root disk's size
// and ignores it; a disk limit there is refused, saying what to do.
func TestDiskLimitNeedsAPoolThatHoldsIt(t *testing.T) {
	project := incustest.Project(t)
	out, err := exec.Command("incus", "query", "/1.0/storage-pools/default").Output()
	var pool struct{ Driver string }
	if err != nil || json.Unmarshal(out, &pool) != nil || pool.Driver != "dir" {
		t.Skip("no dir pool named default here")
	}
	b, err := incus.New(context.Background(), incus.Options{Project: project, Pool: "default"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Create(context.Background(), backend.CreateOptions{Name: "x", Limits: backend.Limits{DiskBytes: diskLimit}})
	if err == nil || !strings.Contains(err.Error(), `storage pool "default" (dir) cannot hold a sandbox to its disk limit`) {
		t.Fatalf("a disk limit on a dir pool: %v", err)
	}
	if out, _ := exec.Command("incus", "list", "--project", project, "-f", "csv", "-c", "n").Output(); len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("a container was made: %s", out)
	}
}

// sh runs a script as user ("" the agent) and fails t unless it exits 0.
func sh(t *testing.T, b *incus.Backend, name, user, script string) string {
	t.Helper()
	r := backendtest.Exec(t, b, name, backend.ExecOptions{User: user, Argv: []string{"sh", "-c", script}})
	if r.Code != 0 {
		t.Fatalf("sh -c %q exited %d: %s", script, r.Code, r.Stderr)
	}
	return strings.TrimSpace(r.Stdout)
}

func find(t *testing.T, b *incus.Backend, name string) backend.Instance {
	t.Helper()
	list, err := b.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range list {
		if in.Name == name {
			return in
		}
	}
	t.Fatalf("List has no %s", name)
	return backend.Instance{}
}

func covered(t *testing.T, b *incus.Backend, name string) []string {
	t.Helper()
	return find(t, b, name).Covered
}

func incusIn(t *testing.T, project string, args ...string) {
	t.Helper()
	if out, err := exec.Command("incus", append([]string{"--project", project}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("incus %v: %v: %s", args, err, out)
	}
}

// procWatch is an unprivileged host user (nobody) reading every host
// process's command line and environment, over and over, for a value.
type procWatch struct {
	t       *testing.T
	cmd     *exec.Cmd
	mu      sync.Mutex
	hits    map[string]string // /proc/PID/FILE -> its content, when it held the value
	control bool              // the control value was seen
	done    chan struct{}
	once    sync.Once
}

// watchProcs starts the watch for secret once it has seen a control
// value in a host process of the test's own (so a watch that sees
// nothing is one that would have seen it).
func watchProcs(t *testing.T, secret string) *procWatch {
	t.Helper()
	control := "jbcontrol-" + strings.ToLower(rand.Text())
	script := `pat=$(mktemp); cat >"$pat"
while :; do
	grep -lF -f "$pat" /proc/[0-9]*/cmdline /proc/[0-9]*/environ 2>/dev/null | while read -r f; do
		printf '%s %s\n' "$f" "$(base64 -w0 <"$f" 2>/dev/null)"
	done
done`
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", "sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stdin = strings.NewReader(secret + "\n" + control + "\n")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("setpriv: %v", err)
	}
	w := &procWatch{t: t, cmd: cmd, hits: map[string]string{}, done: make(chan struct{})}
	t.Cleanup(w.kill)
	go func() {
		defer close(w.done)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 8<<20)
		for sc.Scan() {
			file, enc, _ := strings.Cut(sc.Text(), " ")
			data, _ := base64.StdEncoding.DecodeString(enc)
			w.mu.Lock()
			switch {
			case bytes.Contains(data, []byte(control)):
				w.control = true
			case bytes.Contains(data, []byte(secret)):
				if _, ok := w.hits[file]; !ok {
					w.hits[file] = string(data)
				}
			}
			w.mu.Unlock()
		}
	}()
	ctl := exec.Command("sh", "-c", "sleep 30", "sh", control)
	if err := ctl.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { ctl.Process.Kill(); ctl.Wait() }()
	wait.For(t, "the watch to see a command line", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.control
	})
	return w
}

// stop ends the watch and returns where the secret was seen, except in
// the command line of the command itself (own: its argv): which file and
// process, never the secret.
func (w *procWatch) stop(own []string) []string {
	time.Sleep(100 * time.Millisecond) // one more pass
	w.kill()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	self := strings.Join(own, "\x00") + "\x00"
	var out []string
	for _, file := range slices.Sorted(maps.Keys(w.hits)) {
		if strings.HasSuffix(file, "/cmdline") && w.hits[file] == self {
			continue
		}
		out = append(out, file+" ("+describe(w.hits[file], file)+")")
	}
	return out
}

// describe names a process by its program and the options it was given
// (words starting with -), nothing else of its command line.
func describe(content, file string) string {
	if strings.HasSuffix(file, "/environ") {
		return "environment"
	}
	words := strings.Split(strings.TrimSuffix(content, "\x00"), "\x00")
	shown := []string{filepath.Base(words[0])}
	for _, w := range words[1:] {
		if optionRE.MatchString(w) || w == "exec" || w == "create" || w == "query" || w == "forkexec" {
			shown = append(shown, w)
		}
	}
	return strings.Join(shown, " ")
}

var optionRE = regexp.MustCompile(`^--?[a-z-]+$`)

func (w *procWatch) kill() {
	w.once.Do(func() {
		syscall.Kill(-w.cmd.Process.Pid, syscall.SIGKILL)
		w.cmd.Wait()
	})
}
