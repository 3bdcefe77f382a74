package main

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestVsockExitCodes(t *testing.T) {
	for _, tc := range []struct {
		err  error
		msg  string
		code int
	}{
		{unix.EPERM, "vsock: denied (EPERM)", exitDenied},
		{unix.EACCES, "vsock: denied (EACCES)", exitDenied},
		{fmt.Errorf("socket: %w", unix.EPERM), "vsock: denied (EPERM)", exitDenied},
		{unix.EAFNOSUPPORT, "vsock: error " + unix.EAFNOSUPPORT.Error(), exitError},
		{errors.New("other"), "vsock: error other", exitError},
		{nil, "vsock: allowed", exitAllowed},
	} {
		msg, code := vsock(func() (int, error) {
			if tc.err != nil {
				return -1, tc.err
			}
			// A real descriptor for vsock to close.
			return unix.Dup(0)
		})
		if msg != tc.msg || code != tc.code {
			t.Errorf("vsock with %v = %q, %d; want %q, %d", tc.err, msg, code, tc.msg, tc.code)
		}
	}
}

func TestSeccompMode(t *testing.T) {
	status := "Name:\tprobe\nNoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t1\n"
	if mode, err := seccompMode(strings.NewReader(status)); err != nil || mode != "2" {
		t.Errorf("seccompMode = %q, %v; want 2", mode, err)
	}
	if _, err := seccompMode(strings.NewReader("Name:\tprobe\n")); err == nil {
		t.Error("seccompMode without a Seccomp: line succeeded")
	}
}
