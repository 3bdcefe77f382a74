package gitx_test

import (
	"context"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"agentbox/internal/gitx"
	"agentbox/internal/serial"
	"agentbox/internal/testutil/wait"
)

// scriptSandbox stands for a hostile sandbox: each command it is asked to
// run is script, run by sh on the host with the command's own streams
// (as the local backend passes them) and outside the caller's turn (as
// orchestrate's Runner runs it). A process the script leaves behind
// writes its pid to the file $LEFT, and is killed when the test ends.
func scriptSandbox(t *testing.T, script string, env ...string) gitx.Runner {
	left := filepath.Join(t.TempDir(), "left.pid")
	t.Cleanup(func() {
		if b, err := os.ReadFile(left); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 1 {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	return gitx.RunnerFunc(func(ctx context.Context, c gitx.Cmd) (code int, err error) {
		serial.Outside(ctx, func() {
			cmd := exec.CommandContext(ctx, "sh", "-c", script)
			cmd.Env = append(append(os.Environ(), "LEFT="+left), env...)
			cmd.Stdin, cmd.Stdout, cmd.Stderr = c.Stdin, c.Stdout, c.Stderr
			if err = cmd.Start(); err != nil {
				return
			}
			if c.Started != nil {
				c.Started()
			}
			err = cmd.Wait()
			if ee, ok := err.(*exec.ExitError); ok {
				code, err = ee.ExitCode(), nil
			}
		})
		return code, err
	})
}

// turnFree reports whether a caller of e gets a turn within wait.Guard.
func turnFree(e *serial.Executor) bool {
	ctx, cancel := context.WithTimeout(context.Background(), wait.Guard)
	defer cancel()
	if e.Wait(ctx) != nil {
		return false
	}
	e.Release()
	return true
}

// holding is a context that holds a turn of a new executor, as the
// broker's request that runs a Transfer does.
func holding(t *testing.T) (context.Context, *serial.Executor) {
	e := &serial.Executor{}
	if err := e.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, end := serial.Holding(context.Background(), e)
	t.Cleanup(end)
	return ctx, e
}

// transferFails runs a Transfer under a held turn, its context ending
// after 2 s (standing for the import's bound), and requires it to fail
// rather than run on.
func transferFails(t *testing.T, src gitx.Repo, commit string, dst gitx.Repo, ref string, opts gitx.TransferOptions) {
	t.Helper()
	ctx, e := holding(t)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- gitx.Transfer(ctx, src, commit, dst, ref, opts) }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the transfer succeeded")
		}
	case <-time.After(wait.Guard):
		t.Fatalf("the transfer still runs %s after its context ended (the turn free: %v)", wait.Guard, turnFree(e))
	}
}

// TestTransferEndsDespiteLeftovers: a sandbox that leaves a process
// holding one of its command's pipes, reading nothing (it can open
// /proc/PID/fd/N of its own command), does not hold the Transfer once its
// command has ended: on the old code a copy blocked for ever writing to
// that pipe, and with it the broker's turn, so no other sandbox's send and
// no host stop or destroy ran again until the broker restarted.
func TestTransferEndsDespiteLeftovers(t *testing.T) {
	t.Run("destination", func(t *testing.T) {
		// A sandbox fetching from the host: its fetch asks for the commit
		// and exits; a process of its own keeps its stdin, unread, while
		// the pack (larger than a pipe holds) is written to it.
		repo := t.TempDir()
		git(t, repo, "init", "-q")
		big := make([]byte, 2<<20) // incompressible: its pack is far more than a pipe holds
		rand.Read(big)
		if err := os.WriteFile(filepath.Join(repo, "big"), big, 0o644); err != nil {
			t.Fatal(err)
		}
		git(t, repo, "add", "big")
		git(t, repo, "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-qm", "big")
		commit := git(t, repo, "rev-parse", "HEAD")
		dst := gitx.SandboxRepo("child", scriptSandbox(t, `
exec 3<&0 # sh gives a background process /dev/null for stdin unless told
sleep 100000 <&3 >/dev/null 2>&1 3<&- & echo $! > "$LEFT"
printf '0032want %s\n0000' "$C"; printf '0009done\n'
sleep 1; exit 1`, "C="+commit), "/")
		transferFails(t, gitx.HostRepo(repo), commit, dst, "refs/x", gitx.TransferOptions{})
	})
	t.Run("source", func(t *testing.T) {
		// A child reporting done: its upload-pack advertises a commit and
		// answers NAK to everything, never reading; a process of its own
		// keeps its stdin. The host's fetch sends a have for each commit
		// of the 3000 in common, more than a pipe holds.
		repo := t.TempDir()
		git(t, repo, "init", "-q")
		var history strings.Builder
		for i := 1; i <= 3000; i++ {
			history.WriteString("commit refs/heads/main\ncommitter a <a@b> " + strconv.Itoa(i) + " +0000\ndata 2\nc\n\n")
		}
		imp := exec.Command("git", "-C", repo, "fast-import", "--quiet")
		imp.Stdin = strings.NewReader(history.String())
		if out, err := imp.CombinedOutput(); err != nil {
			t.Fatalf("fast-import: %v %s", err, out)
		}
		tip := git(t, repo, "rev-parse", "main")
		commit := strings.Repeat("cd", 20)
		src := gitx.SandboxRepo("child", scriptSandbox(t, `
exec 3<&0
sleep 100000 <&3 >/dev/null 2>&1 3<&- & echo $! > "$LEFT"
line="$C refs/jailbee/transfer"; caps="multi_ack_detailed side-band-64k ofs-delta"
printf '%04x%s\0%s\n0000' $((4 + ${#line} + 1 + ${#caps} + 1)) "$line" "$caps"
i=0; while [ $i -lt 400 ]; do printf '0008NAK\n'; i=$((i+1)); done
sleep 1; exit 0`, "C="+commit), "/")
		transferFails(t, src, commit, gitx.HostRepo(repo), "refs/jailbee/sandboxes/c/main", gitx.TransferOptions{Common: []string{tip}})
		if out := git(t, repo, "for-each-ref", "refs/jailbee/"); out != "" {
			t.Fatalf("the repository got refs: %q", out)
		}
	})
}

// TestTransferToHostGivesTheTurnAway: while host git fetches from a
// sandbox, paced by it (its upload-pack exited; a process of its own
// trickles the protocol on its stdout, a byte at a time within the idle
// bound), the caller's turn is free for others: on the old code the host
// side ran under the turn, and every other sandbox's mutation waited up
// to the import's 10 minute bound.
func TestTransferToHostGivesTheTurnAway(t *testing.T) {
	repo, _, _ := newRepo(t)
	src := gitx.SandboxRepo("child", scriptSandbox(t, `
( printf fff0; while :; do sleep 0.2; printf a || exit; done ) >&1 2>/dev/null &
echo $! > "$LEFT"
exit 0`), "/")
	ctx, e := holding(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- gitx.Transfer(ctx, src, strings.Repeat("ab", 20), gitx.HostRepo(repo), "refs/jailbee/sandboxes/c/b", gitx.TransferOptions{IdleTimeout: 5 * time.Second})
	}()
	time.Sleep(time.Second) // the source has exited; host git reads the trickle
	select {
	case err := <-done:
		t.Fatalf("the transfer ended before the check: %v", err)
	default:
	}
	if !turnFree(e) {
		t.Fatal("the turn stayed with the transfer while host git ran")
	}
	cancel()
	select {
	case <-done:
	case <-time.After(wait.Guard):
		t.Fatal("the transfer did not end with its context")
	}
}
