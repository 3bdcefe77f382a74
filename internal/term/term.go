// Package term holds the terminal handling of `jailbee exec -t`: a new
// pseudo-terminal for the sandboxed command, raw mode for the user's own
// terminal, and window sizes. The user's terminal itself is never handed to
// a sandbox: a process holding it could inject input (TIOCSTI) into the
// user's shell after it exits.
package term

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// IsTerminal reports whether f is a terminal.
func IsTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// OpenPTY returns a new pseudo-terminal: the master (kept by the caller)
// and the slave (the command's terminal).
func OpenPTY() (master, slave *os.File, err error) {
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	fail := func(err error) (*os.File, *os.File, error) {
		m.Close()
		return nil, nil, err
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		return fail(fmt.Errorf("unlock pty: %w", err))
	}
	// TIOCGPTPEER opens the slave from the master itself, never by a
	// /dev/pts path that could name another terminal.
	fd, _, errno := unix.Syscall(unix.SYS_IOCTL, m.Fd(), unix.TIOCGPTPEER, uintptr(unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC))
	if errno == 0 {
		return m, os.NewFile(fd, "pty"), nil
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		return fail(fmt.Errorf("pty number: %w", err))
	}
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fail(fmt.Errorf("open pty: %w", err))
	}
	return m, s, nil
}

// MakeRaw puts the terminal f in raw mode and returns a function that
// restores its previous mode.
func MakeRaw(f *os.File) (restore func(), err error) {
	fd := int(f.Fd())
	old, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return nil, errors.New("not a terminal")
	}
	raw := *old
	raw.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	raw.Oflag &^= unix.OPOST
	raw.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	raw.Cflag &^= unix.CSIZE | unix.PARENB
	raw.Cflag |= unix.CS8
	raw.Cc[unix.VMIN] = 1
	raw.Cc[unix.VTIME] = 0
	if err := unix.IoctlSetTermios(fd, unix.TCSETS, &raw); err != nil {
		return nil, err
	}
	return func() { unix.IoctlSetTermios(fd, unix.TCSETS, old) }, nil
}

// CopySize gives the terminal to the size of the terminal from.
func CopySize(to, from *os.File) error {
	ws, err := unix.IoctlGetWinsize(int(from.Fd()), unix.TIOCGWINSZ)
	if err != nil {
		return err
	}
	return unix.IoctlSetWinsize(int(to.Fd()), unix.TIOCSWINSZ, ws)
}
