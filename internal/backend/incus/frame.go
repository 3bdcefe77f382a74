package incus

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The incus client keeps its stdout open until the command it runs has
// ended, and waits for the end of its own stdin after that: a command that
// closes its stdout to say "that was all" (the git relay does) is never
// heard. So a non-terminal Exec runs its command under FrameCommand, the
// jailbee client inside the container, which frames the command's stdout:
//
//	len (4 bytes, big endian, 1..frameMax) data   a piece of stdout
//	0                                            stdout has ended
//	frameExit (0xffffffff) status (4 bytes)      the command has ended
//
// The host side (deframe) passes the pieces on, closes its copy of the
// caller's stdout at the end of stdout, and closes the client's stdin at
// the command's end, so the client ends too. A command could write frames
// of its own only into its own Exec.
//
// What the command is (argv, environment, directory) is not on the
// client's command line, which every host user can read in /proc: it goes
// ahead of the command's stdin as a spec (spec.go).

// FrameCommand is the hidden jailbee command that frames a command's
// stdout: `jailbee _exec-frame`, the command's spec (spec.go) first on its
// stdin, then the command's own stdin.
const FrameCommand = "_exec-frame"

const (
	frameMax  = 32 << 10
	frameExit = 0xffffffff
)

// Once a command has ended, the framer passes on what its stdout still
// brings while it has waited for it at most outputGrace in all and
// passed at most maxOutputAfterEnd (a pipe holds at most 1 MiB): a
// process the command left may hold its stdout, and trickle or flood.
const (
	outputGrace       = 2 * time.Second
	maxOutputAfterEnd = 1 << 20
)

// Incus passes on what a command wrote only while its copy finds the
// bytes before it learns that the command has ended: it learns that
// before its copies see the pipes' far ends close, and a copy that then
// finds no close ends at once, dropping what the pipe still holds (the
// status frame with it; seen under load on Incus 6.0). So the framer
// ends only once what it and the command wrote to stdout and stderr has
// been taken out of those pipes, or after drainWait: a process the
// command left may write on into stderr for ever.
const drainWait = 5 * time.Second

// waitTaken returns once none of files (pipes) holds unread bytes, or
// after at most limit. A file that cannot tell (not a pipe) counts as
// taken.
func waitTaken(limit time.Duration, files ...*os.File) {
	deadline := time.Now().Add(limit)
	pause := time.Millisecond
	for _, f := range files {
		for {
			n, err := unix.IoctlGetInt(int(f.Fd()), unix.TIOCINQ) // FIONREAD
			if err != nil || n == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(pause)
			pause = min(2*pause, 20*time.Millisecond)
		}
	}
}

// frameMain is `jailbee _exec-frame` inside a container.
func frameMain(args []string) int {
	if len(args) != 0 {
		fmt.Fprintln(os.Stderr, "usage: jailbee _exec-frame < SPEC+STDIN")
		return 2
	}
	// The spec is read to its exact end: what follows is the command's.
	spec, err := readSpec(os.Stdin)
	r, w, perr := os.Pipe()
	if perr != nil {
		fmt.Fprintf(os.Stderr, "jailbee _exec-frame: %v\n", perr)
		return 1
	}
	var cmd *exec.Cmd
	status := 0
	if err == nil {
		err = noNewPrivs() // on this thread, which starts the command
	}
	if err == nil {
		cmd, err = spec.command()
	}
	if err == nil {
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, w, os.Stderr
		err = cmd.Start()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, startError(spec, err))
		status = 127
		cmd = nil
		w.Close()
	} else {
		w.Close()
		// The command holds stdin now; this process lets go of it, for
		// the read end of an empty pipe: never /dev/null, which root
		// inside may have made a FIFO that blocks the open for ever.
		if er, ew, err := os.Pipe(); err == nil {
			ew.Close()
			syscall.Dup3(int(er.Fd()), 0, 0)
			er.Close()
		}
	}
	out := os.Stdout
	// The pieces go out as they come, until the end of the command's
	// stdout or, once the command has ended, until none came for
	// outputGrace: a process it left in the background may hold its
	// stdout open for ever, and the command's end must still be told.
	var ended atomic.Bool
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		buf := make([]byte, 4+frameMax)
		// Once the command has ended: the time left waiting for more, and
		// the bytes left to pass on (what the pipe held as it ended fits).
		wait, left := outputGrace, maxOutputAfterEnd
		for {
			after := ended.Load()
			if after {
				if wait <= 0 || left <= 0 {
					return
				}
				r.SetReadDeadline(time.Now().Add(wait))
			}
			t0 := time.Now()
			n, err := r.Read(buf[4:min(4+frameMax, 4+max(left, 0))])
			if after {
				wait -= time.Since(t0)
				left -= n
			}
			if n > 0 {
				binary.BigEndian.PutUint32(buf, uint32(n))
				if _, werr := out.Write(buf[:4+n]); werr != nil {
					r.Close() // no one reads on: the command's writes fail
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	if cmd != nil {
		err := cmd.Wait()
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			status = ee.ExitCode()
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				status = 128 + int(ws.Signal())
			}
		case err != nil:
			status = 1
		}
	}
	ended.Store(true)
	r.SetReadDeadline(time.Now().Add(outputGrace)) // a read already waiting
	<-copied
	r.Close()
	out.Write([]byte{0, 0, 0, 0})
	var end [8]byte
	binary.BigEndian.PutUint32(end[:4], frameExit)
	binary.BigEndian.PutUint32(end[4:], uint32(status))
	if _, err := out.Write(end[:]); err != nil {
		return status
	}
	waitTaken(drainWait, os.Stdout, os.Stderr)
	// The status went in the stream: the client's own exit is not it (and
	// incus would print "Error: Command not found" for a 127).
	return 0
}

// deframe reads the framed stream from r: pieces go to out; at the end
// of stdout, stdoutDone runs; at the command's end, its status is
// returned. ok is false when the stream ended or broke first.
func deframe(r io.Reader, out io.Writer, stdoutDone func()) (status int, ok bool) {
	var hdr [4]byte
	buf := make([]byte, frameMax)
	ended := false
	defer func() {
		if !ended {
			stdoutDone()
		}
	}()
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return 0, false
		}
		n := binary.BigEndian.Uint32(hdr[:])
		switch {
		case n == frameExit:
			if _, err := io.ReadFull(r, hdr[:]); err != nil {
				return 0, false
			}
			return int(binary.BigEndian.Uint32(hdr[:]) & 0xff), true
		case n == 0:
			if !ended {
				ended = true
				stdoutDone()
			}
		case n > frameMax:
			return 0, false // not a stream frameMain wrote
		default:
			if _, err := io.ReadFull(r, buf[:n]); err != nil {
				return 0, false
			}
			if out != nil && !ended {
				out.Write(buf[:n])
			}
		}
	}
}
