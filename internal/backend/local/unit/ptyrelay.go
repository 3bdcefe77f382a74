package unit

import (
	"errors"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"agentbox/internal/term"
)

// A terminal handed to a sandbox (the slave of a pseudo-terminal the host
// made) belongs to the host's devpts, which the sandbox's /dev does not
// show: ttyname() fails on it and tools that need their terminal's name
// break. So a TTY exec runs the command on a terminal from the sandbox's
// own /dev/ptmx, and the supervisor copies between the two.
//
// The supervisor relays itself, never a process it executes: a freshly
// executed process is dumpable until it can make itself not, and in that
// window a process of the sandbox (same uid) could open its descriptors
// through /proc or pidfd_getfd, or ptrace it, and so take the host
// terminal and keep it after the command ended. The supervisor is
// non-dumpable from its first instruction to its last.

// relayOutputGrace bounds the copy of the command's last output once it
// has ended (a process it left running may hold the terminal).
const relayOutputGrace = 2 * time.Second

// resizePoll is how often the relay passes the host terminal's size on:
// the supervisor cannot have it as its controlling terminal (SIGWINCH).
const resizePoll = 200 * time.Millisecond

// ttyRelay copies between the host terminal of one TTY exec and the
// sandbox terminal its command runs on.
type ttyRelay struct {
	outer, master *os.File
	restore       func()
	copied        chan struct{} // the command's output has ended
	stop          chan struct{}
	once          sync.Once
}

// openTTYRelay puts the host terminal host in raw mode (the command's own
// terminal does the line discipline) and makes the command's terminal,
// whose slave end it returns. host stays the caller's.
func openTTYRelay(host *os.File) (*ttyRelay, *os.File, error) {
	// A non-blocking copy of our own: closing it ends a read in progress.
	fd, err := unix.FcntlInt(host.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, nil, err
	}
	outer := os.NewFile(uintptr(fd), "terminal")
	if !term.IsTerminal(outer) {
		outer.Close()
		return nil, nil, errors.New("a terminal exec needs a terminal")
	}
	restore, err := term.MakeRaw(outer)
	if err != nil {
		outer.Close()
		return nil, nil, err
	}
	master, slave, err := term.OpenPTY()
	if err != nil {
		restore()
		outer.Close()
		return nil, nil, err
	}
	term.CopySize(slave, outer)
	r := &ttyRelay{outer: outer, master: master, restore: restore, copied: make(chan struct{}), stop: make(chan struct{})}
	return r, slave, nil
}

// run starts the copies, and the passing on of size changes.
func (r *ttyRelay) run() {
	go io.Copy(r.master, r.outer)
	go func() {
		// Reading the master ends with EIO once every holder of the
		// command's terminal has closed it.
		io.Copy(r.outer, r.master)
		close(r.copied)
	}()
	go func() {
		t := time.NewTicker(resizePoll)
		defer t.Stop()
		for {
			select {
			case <-r.stop:
				return
			case <-t.C:
				term.CopySize(r.master, r.outer) // the kernel signals only a change
			}
		}
	}()
}

// close ends the relay: with grace, once the command's output has ended
// or relayOutputGrace has passed (a process the command left running may
// hold its terminal). Nothing of the sandbox holds the host terminal then.
// A nil relay (no terminal) has nothing to close.
func (r *ttyRelay) close(grace bool) {
	if r == nil {
		return
	}
	if grace {
		select {
		case <-r.copied:
		case <-time.After(relayOutputGrace):
		}
	}
	r.once.Do(func() {
		close(r.stop)
		r.restore()
		r.outer.Close()
		r.master.Close()
	})
}
