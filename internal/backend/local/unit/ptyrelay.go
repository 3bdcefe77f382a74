package unit

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"agentbox/internal/term"
)

// A terminal handed to a sandbox (the slave of a pseudo-terminal the host
// made) belongs to the host's devpts, which the sandbox's /dev does not
// show: ttyname() fails on it and tools that need their terminal's name
// break. So a TTY exec runs `jailbee _pty-relay -- CMD...` inside the
// sandbox: with the host terminal as its controlling terminal (it gets
// SIGWINCH when the user's window changes), it makes a terminal from the
// sandbox's own /dev/ptmx for the command and copies between the two.

// PtyRelayCommand is the relay's hidden command name.
const PtyRelayCommand = "_pty-relay"

// relayOutputGrace bounds the copy of the command's last output once it
// has ended (a process it left running may hold the terminal).
const relayOutputGrace = 2 * time.Second

// PtyRelayMain is `jailbee _pty-relay -- CMD...`; it returns the command's
// exit status.
func PtyRelayMain(args []string) int {
	if len(args) < 2 || args[0] != "--" {
		fmt.Fprintln(os.Stderr, "usage: jailbee _pty-relay -- CMD...")
		return 2
	}
	// Not dumpable: no process of the sandbox (same uid) may take the
	// host terminal from the relay (pidfd_getfd, /proc/PID/fd) and hold it
	// after the command ended. The command itself is dumpable again (exec).
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "jailbee: prctl: %v\n", err)
		return cannotRunStatus
	}
	argv := args[1:]
	outer := os.Stdin
	if !term.IsTerminal(outer) {
		fmt.Fprintln(os.Stderr, "jailbee: _pty-relay needs a terminal")
		return cannotRunStatus
	}
	// The host terminal only carries bytes; the command's own terminal
	// does the line discipline.
	restore, err := term.MakeRaw(outer)
	if err != nil {
		fmt.Fprintf(os.Stderr, "jailbee: %v\n", err)
		return cannotRunStatus
	}
	defer restore()
	master, slave, err := term.OpenPTY()
	if err != nil {
		fmt.Fprintf(os.Stderr, "jailbee: %v\n", err)
		return cannotRunStatus
	}
	defer master.Close()
	term.CopySize(slave, outer)
	prog, err := exec.LookPath(argv[0])
	if err != nil {
		fmt.Fprintf(outer, "jailbee: %s: command not found\r\n", shown(argv[0]))
		slave.Close()
		return notFoundStatus
	}
	cmd := exec.Command(prog, argv[1:]...)
	cmd.Args[0] = argv[0]
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	err = cmd.Start()
	slave.Close()
	if err != nil {
		fmt.Fprintf(outer, "jailbee: %s: %v\r\n", shown(argv[0]), err)
		return cannotRunStatus
	}
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	go func() {
		for range winch {
			term.CopySize(master, outer)
		}
	}()
	go io.Copy(master, outer)
	copied := make(chan struct{})
	go func() {
		// Reading the master ends with EIO once every holder of the
		// command's terminal has closed it.
		io.Copy(outer, master)
		close(copied)
	}()
	err = cmd.Wait()
	select {
	case <-copied:
	case <-time.After(relayOutputGrace):
	}
	signal.Stop(winch)
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return cannotRunStatus
}
