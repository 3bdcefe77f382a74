package incus

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
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

// FrameCommand is the hidden jailbee command that frames a command's
// stdout: jailbee _exec-frame -- ARGV...
const FrameCommand = "_exec-frame"

const (
	frameMax  = 32 << 10
	frameExit = 0xffffffff
)

// FrameMain is `jailbee _exec-frame -- ARGV...` inside a container.
func FrameMain(args []string) int {
	if len(args) < 2 || args[0] != "--" {
		fmt.Fprintln(os.Stderr, "usage: jailbee _exec-frame -- COMMAND [ARG...]")
		return 2
	}
	r, w, err := os.Pipe()
	if err != nil {
		fmt.Fprintf(os.Stderr, "jailbee _exec-frame: %v\n", err)
		return 1
	}
	cmd := exec.Command(args[1], args[2:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, w, os.Stderr
	status := 0
	if err := cmd.Start(); err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			fmt.Fprintf(os.Stderr, "jailbee: %s: command not found\n", args[1])
		} else {
			fmt.Fprintf(os.Stderr, "jailbee: %v\n", err)
		}
		status = 127
		w.Close()
	} else {
		w.Close()
		// The command holds stdin now; this process lets go of it.
		if null, err := os.Open(os.DevNull); err == nil {
			syscall.Dup3(int(null.Fd()), 0, 0)
			null.Close()
		}
	}
	out := os.Stdout
	buf := make([]byte, 4+frameMax)
	for {
		n, err := r.Read(buf[4:])
		if n > 0 {
			binary.BigEndian.PutUint32(buf, uint32(n))
			if _, werr := out.Write(buf[:4+n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	r.Close()
	out.Write([]byte{0, 0, 0, 0})
	if status == 0 && cmd.Process != nil {
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
	var end [8]byte
	binary.BigEndian.PutUint32(end[:4], frameExit)
	binary.BigEndian.PutUint32(end[4:], uint32(status))
	if _, err := out.Write(end[:]); err != nil {
		return status
	}
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
			return 0, false // not a stream FrameMain wrote
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
