// Package term holds the terminal handling of `jailbee exec -t`: a new
// pseudo-terminal for the sandboxed command, raw mode for the user's own
// terminal, and window sizes. The user's terminal itself is never handed to
// a sandbox: a process holding it could inject input (TIOCSTI) into the
// user's shell after it exits.
//
// Nothing here calls (*os.File).Fd, which turns a descriptor blocking for
// good: a pty master must stay pollable, so that closing it ends a copy
// blocked on it even while a sandbox process still holds the slave.
package term

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// onFD runs do on f's descriptor without changing its blocking mode.
func onFD(f *os.File, do func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var doErr error
	if err := rc.Control(func(fd uintptr) { doErr = do(int(fd)) }); err != nil {
		return err
	}
	return doErr
}

// getTermios returns f's terminal mode (an error: not a terminal).
func getTermios(f *os.File) (*unix.Termios, error) {
	var tm *unix.Termios
	err := onFD(f, func(fd int) (err error) {
		tm, err = unix.IoctlGetTermios(fd, unix.TCGETS)
		return err
	})
	return tm, err
}

func setTermios(f *os.File, tm *unix.Termios) error {
	return onFD(f, func(fd int) error { return unix.IoctlSetTermios(fd, unix.TCSETS, tm) })
}

// IsTerminal reports whether f is a terminal.
func IsTerminal(f *os.File) bool {
	_, err := getTermios(f)
	return err == nil
}

// OpenPTY returns a new pseudo-terminal: the master (kept by the caller,
// pollable: its Close ends a Read or Write blocked on it) and the slave
// (the command's terminal).
func OpenPTY() (master, slave *os.File, err error) {
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	var s *os.File
	err = onFD(m, func(fd int) (err error) {
		s, err = openSlave(fd)
		return err
	})
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	return m, s, nil
}

// openSlave unlocks the master fd and opens its slave.
func openSlave(fd int) (*os.File, error) {
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		return nil, fmt.Errorf("unlock pty: %w", err)
	}
	// TIOCGPTPEER opens the slave from the master itself, never by a
	// /dev/pts path that could name another terminal.
	s, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TIOCGPTPEER, uintptr(unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC))
	if errno == 0 {
		return os.NewFile(s, "pty"), nil
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		return nil, fmt.Errorf("pty number: %w", err)
	}
	f, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open pty: %w", err)
	}
	return f, nil
}

// MakeRaw puts the terminal f in raw mode and returns a function that
// restores its previous mode.
func MakeRaw(f *os.File) (restore func(), err error) {
	old, err := getTermios(f)
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
	if err := setTermios(f, &raw); err != nil {
		return nil, err
	}
	return func() { setTermios(f, old) }, nil
}

// CopySize gives the terminal to the size of the terminal from.
func CopySize(to, from *os.File) error {
	var ws *unix.Winsize
	err := onFD(from, func(fd int) (err error) {
		ws, err = unix.IoctlGetWinsize(fd, unix.TIOCGWINSZ)
		return err
	})
	if err != nil {
		return err
	}
	return onFD(to, func(fd int) error { return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, ws) })
}
