package secfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestWithoutPath(t *testing.T) {
	const host = "/host/secret/dir"
	pathErr := &os.PathError{Op: "open", Path: host + "/key", Err: syscall.EACCES}
	linkErr := &os.LinkError{Op: "rename", Old: host + "/a", New: host + "/b", Err: syscall.EEXIST}
	sysErr := os.NewSyscallError("fstat", syscall.EBADF)
	plain := errors.New("plain")
	for _, tc := range []struct {
		name      string
		err       error
		bare, op  string // the texts of WithoutPath and OpWithoutPath ("" for nil)
		is        error  // what both results still are (errors.Is)
		unchanged bool   // both return err itself
	}{
		{name: "nil", unchanged: true},
		{name: "PathError", err: pathErr, bare: "permission denied", op: "open: permission denied", is: syscall.EACCES},
		{name: "LinkError", err: linkErr, bare: "file exists", op: "rename: file exists", is: syscall.EEXIST},
		{name: "SyscallError", err: sysErr, bare: "fstat: bad file descriptor", op: "fstat: bad file descriptor", is: syscall.EBADF, unchanged: true},
		{name: "plain", err: plain, bare: "plain", op: "plain", is: plain, unchanged: true},
		{name: "wrapped PathError", err: fmt.Errorf("read the key: %w", pathErr), bare: "permission denied", op: "open: permission denied", is: syscall.EACCES},
		{name: "wrapped LinkError", err: fmt.Errorf("install: %w", linkErr), bare: "file exists", op: "rename: file exists", is: syscall.EEXIST},
		{name: "joined PathError", err: errors.Join(plain, pathErr), bare: "permission denied", op: "open: permission denied", is: syscall.EACCES},
		{name: "PathError before LinkError", err: fmt.Errorf("%w; %w", linkErr, pathErr), bare: "permission denied", op: "open: permission denied", is: syscall.EACCES},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, f := range []struct {
				name string
				fn   func(error) error
				want string
			}{{"WithoutPath", WithoutPath, tc.bare}, {"OpWithoutPath", OpWithoutPath, tc.op}} {
				got := f.fn(tc.err)
				if tc.unchanged && got != tc.err {
					t.Errorf("%s(%v) = %#v, want err itself", f.name, tc.err, got)
				}
				if tc.err == nil {
					continue
				}
				if got == nil || got.Error() != f.want {
					t.Errorf("%s(%v) = %v, want %q", f.name, tc.err, got, f.want)
					continue
				}
				if strings.Contains(got.Error(), host) {
					t.Errorf("%s(%v) = %q names the host path", f.name, tc.err, got)
				}
				if !errors.Is(got, tc.is) {
					t.Errorf("%s(%v) = %v, not %v", f.name, tc.err, got, tc.is)
				}
			}
		})
	}
}

// TestWithoutPathRealErrors drops the paths the os package itself puts in
// its errors.
func TestWithoutPathRealErrors(t *testing.T) {
	dir := t.TempDir()
	_, openErr := os.Open(filepath.Join(dir, "missing"))
	linkErr := os.Link(filepath.Join(dir, "missing"), filepath.Join(dir, "new"))
	for _, tc := range []struct {
		name string
		err  error
		bare string
		op   string
	}{
		{"open", openErr, "no such file or directory", "open: no such file or directory"},
		{"link", linkErr, "no such file or directory", "link: no such file or directory"},
	} {
		if !strings.Contains(tc.err.Error(), dir) {
			t.Fatalf("%s: %v does not name the path to drop", tc.name, tc.err)
		}
		if got := WithoutPath(tc.err); got.Error() != tc.bare || !errors.Is(got, os.ErrNotExist) {
			t.Errorf("%s: WithoutPath = %q, want %q (and still ErrNotExist)", tc.name, got, tc.bare)
		}
		if got := OpWithoutPath(tc.err); got.Error() != tc.op || !errors.Is(got, os.ErrNotExist) {
			t.Errorf("%s: OpWithoutPath = %q, want %q (and still ErrNotExist)", tc.name, got, tc.op)
		}
	}
}
