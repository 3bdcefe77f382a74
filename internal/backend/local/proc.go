package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// A sandbox's unit is identified by the host pid of its supervisor and
// that process's start time: a pid alone may have been reused since.

// maxStatBytes bounds /proc/<pid>/stat (the command name is at most 16
// bytes; the rest is numbers).
const maxStatBytes = 4 << 10

// startTime returns the start time of process pid (field 22 of
// /proc/<pid>/stat, clock ticks after boot), or an error if there is no
// such process.
func startTime(pid int) (uint64, error) {
	st, _, err := readStat(pid)
	return st, err
}

// readStat returns the start time of process pid and whether it has
// ended or is ending (see parseStat).
func readStat(pid int) (uint64, bool, error) {
	if pid <= 0 {
		return 0, false, os.ErrNotExist
	}
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false, err
	}
	defer f.Close()
	buf := make([]byte, maxStatBytes)
	n, err := f.Read(buf)
	if err != nil {
		return 0, false, err
	}
	return parseStat(buf[:n])
}

// pfExiting is the kernel's PF_EXITING task flag: set first thing in the
// task's exit, before its descriptors are closed.
const pfExiting = 0x4

// parseStat reads field 22 of a stat line, the start time, and reports
// whether the process is ending: a zombie (state Z, or X while reaped) or
// a task in its exit (PF_EXITING in field 9). A unit's supervisor is
// ending from the moment it is killed: its control connections break at
// once, but as its pid namespace's init it stays in its exit until every
// other process of the namespace is gone, then a zombie until reaped. The
// command name (field 2) is in parentheses and may hold spaces and ')':
// fields are counted after its last ')'.
func parseStat(stat []byte) (uint64, bool, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, false, errors.New("malformed /proc stat")
	}
	fields := bytes.Fields(stat[i+1:])
	// fields[0] is field 3 (state); field 9 is fields[6]; field 22 is fields[19].
	if len(fields) < 20 {
		return 0, false, errors.New("malformed /proc stat")
	}
	flags, err := strconv.ParseUint(string(fields[6]), 10, 64)
	if err != nil {
		return 0, false, errors.New("malformed /proc stat")
	}
	st, err := strconv.ParseUint(string(fields[19]), 10, 64)
	if err != nil {
		return 0, false, errors.New("malformed /proc stat")
	}
	state := fields[0][0]
	return st, state == 'Z' || state == 'X' || flags&pfExiting != 0, nil
}

// alive reports whether the process pid with start time st still runs
// (and is not ending).
func alive(pid int, st uint64) bool {
	got, ending, err := readStat(pid)
	return err == nil && got == st && !ending
}

// pollInterval is how often killProcess looks for the process's end when
// it cannot wait on a pidfd.
const pollInterval = 10 * time.Millisecond

// killProcess sends SIGKILL to the process pid if it still is the one
// that started at st, and waits until it has ended (or ctx is done). The
// pidfd pins the process, so a pid reused between the check and the
// signal is never hit.
func killProcess(ctx context.Context, pid int, st uint64) error {
	if pid <= 0 {
		return nil
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil // already gone
	}
	if err != nil {
		return fmt.Errorf("pidfd_open: %w", err)
	}
	defer unix.Close(fd)
	if got, _, err := readStat(pid); err != nil || got != st {
		return nil // gone, or another process now has that pid
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("kill: %w", err)
	}
	// A pidfd becomes readable when its process has exited; the pid
	// namespace's other processes are gone by then.
	for {
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(pollInterval/time.Millisecond))
		if err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("wait for the sandbox to end: %w", err)
		}
		if n > 0 {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}
