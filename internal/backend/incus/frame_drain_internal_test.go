package incus

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"testing"
	"time"

	"agentbox/internal/testutil/testbin"
)

// TestFramerEndsOnceItsOutputIsTaken: the framer does not end while its
// stdout or stderr pipe still holds bytes it or its command wrote (Incus
// drops what it has not read by the time the framer has ended, the
// status with it); once they are read, it ends, and the stream carries
// the command's output and status.
func TestFramerEndsOnceItsOutputIsTaken(t *testing.T) {
	jailbee := testbin.Jailbee(t)
	spec, err := execSpec{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}, Env: []string{"PATH=/usr/bin:/bin"}, Dir: "/"}.encode()
	if err != nil {
		t.Fatal(err)
	}
	for _, unread := range []string{"stdout", "stderr"} {
		t.Run(unread+" unread", func(t *testing.T) {
			cmd := exec.Command(jailbee, FrameCommand)
			cmd.Stdin = bytes.NewReader(spec)
			outR, outW := pipe(t)
			errR, errW := pipe(t)
			cmd.Stdout, cmd.Stderr = outW, errW
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			outW.Close()
			errW.Close()
			ended := make(chan error, 1)
			go func() { ended <- cmd.Wait() }()
			var stdout, stderr bytes.Buffer
			read := func(dst *bytes.Buffer, r *os.File) chan struct{} {
				done := make(chan struct{})
				go func() { io.Copy(dst, r); close(done) }()
				return done
			}
			var outDone, errDone chan struct{}
			if unread == "stdout" {
				errDone = read(&stderr, errR)
			} else {
				outDone = read(&stdout, outR)
			}
			// The bound is the test's: the framer waits drainWait.
			select {
			case err := <-ended:
				t.Fatalf("the framer ended (%v) with its %s unread", err, unread)
			case <-time.After(time.Second):
			}
			if unread == "stdout" {
				outDone = read(&stdout, outR)
			} else {
				errDone = read(&stderr, errR)
			}
			if err := <-ended; err != nil {
				t.Fatalf("framer: %v", err)
			}
			<-outDone
			<-errDone
			var cmdOut bytes.Buffer
			status, ok := deframe(&stdout, &cmdOut, func() {})
			if !ok || status != 3 || cmdOut.String() != "out\n" || stderr.String() != "err\n" {
				t.Fatalf("status %d (ok %v), stdout %q, stderr %q; want 3, out, err", status, ok, cmdOut.String(), stderr.String())
			}
		})
	}
}

func pipe(t *testing.T) (r, w *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	return r, w
}

// TestClientResult: a framed command's client that ended well without
// passing on the command's status (Incus dropped it) fails the Exec; a
// client's own failure status passes through; a terminal's command's
// status is its client's.
func TestClientResult(t *testing.T) {
	exit5 := exec.Command("sh", "-c", "exit 5").Run()
	for _, tc := range []struct {
		name     string
		framed   bool
		err      error
		wantCode int
		wantErr  error
	}{
		{"terminal, ended well", false, nil, 0, nil},
		{"terminal, status 5", false, exit5, 5, nil},
		{"framed, ended well, no status", true, nil, 0, errStatusLost},
		{"framed, client failed", true, exit5, 5, nil},
		{"framed, client not run", true, os.ErrNotExist, 0, os.ErrNotExist},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, err := clientResult("box", tc.framed, tc.err)
			if code != tc.wantCode || !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("clientResult = %d, %v; want %d, %v", code, err, tc.wantCode, tc.wantErr)
			}
		})
	}
}
