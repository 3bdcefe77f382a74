package compose

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"syscall"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// SetIDBits are the set-user-ID and set-group-ID mode bits: a file with
// one of them, planted in a bind the host shares, runs as its owner (or
// group) when a host user executes it.
const SetIDBits = syscall.S_ISUID | syscall.S_ISGID

// modeArg is, for each system call that sets a file's mode bits, the
// index of its mode argument. The profile allows each only when the mode
// holds no SetIDBits.
var modeArg = map[string]uint{
	"chmod": 1, "fchmod": 1, "fchmodat": 2, "fchmodat2": 2,
	"creat": 1, "open": 2, "openat": 3,
	"mknod": 1, "mknodat": 2,
}

// enosys are system calls whose mode sits in a structure a filter cannot
// read (openat2's open_how): they fail with ENOSYS, so the C library
// falls back to openat, which the filter can read.
var enosys = []string{"openat2"}

// SeccompProfile is the profile every service of a managed launch runs
// under, as JSON for `security_opt: seccomp=FILE`: Docker's current
// default, plus no set-user-ID or set-group-ID bit on any file (chmod,
// open or mknod with one fails with EPERM; mkdir ignores them). Docker
// 20.10 (Debian 12's engine) does not know `seccomp=builtin` (its
// container is created, then fails to start), and its own default allows
// AF_VSOCK sockets, which the current default denies: so the launch
// passes this profile explicitly.
func SeccompProfile() ([]byte, error) {
	p := seccomp.DefaultProfile()
	for _, s := range p.Syscalls {
		if s.Action == specs.ActAllow && len(s.Args) == 0 {
			s.Names = slices.DeleteFunc(s.Names, func(n string) bool {
				_, filtered := modeArg[n]
				return filtered || slices.Contains(enosys, n)
			})
		}
	}
	for _, name := range slices.Sorted(maps.Keys(modeArg)) {
		p.Syscalls = append(p.Syscalls, &seccomp.Syscall{LinuxSyscall: specs.LinuxSyscall{
			Names:  []string{name},
			Action: specs.ActAllow,
			Args:   []specs.LinuxSeccompArg{{Index: modeArg[name], Value: SetIDBits, ValueTwo: 0, Op: specs.OpMaskedEqual}},
		}, Comment: "no set-user-ID or set-group-ID bit"})
	}
	errno := uint(syscall.ENOSYS)
	p.Syscalls = append(p.Syscalls, &seccomp.Syscall{LinuxSyscall: specs.LinuxSyscall{
		Names: enosys, Action: specs.ActErrno, ErrnoRet: &errno,
	}, Comment: "the mode is out of the filter's reach: fall back to openat"})
	data, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("compose: the seccomp profile: %w", err)
	}
	return data, nil
}
