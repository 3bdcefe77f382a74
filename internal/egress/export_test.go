package egress

import (
	"time"

	"golang.org/x/sys/unix"
)

// SetRelaySyscalls sizes the relay's system-call gate and makes each of
// its system calls slow by a nanosleep, itself a system call, in the gate:
// what a loaded machine does to a thread preempted in its call.
func SetRelaySyscalls(slots int, slow time.Duration) {
	syscallGate = make(chan struct{}, slots)
	afterSyscall = func() {
		ts := unix.NsecToTimespec(slow.Nanoseconds())
		unix.Nanosleep(&ts, nil)
	}
}
