// Package threads has a Go program make its OS threads ahead of time.
//
// A Go program aborts ("failed to create new OS thread") when clone fails
// for a thread its scheduler needs, and inside a task (pids) limit clone
// fails with EAGAIN once the limit is reached. A program that must outlive
// whatever fills the limit it runs in (a sandbox's supervisor, its egress
// relay) makes its threads while the limit has room, and bounds what it
// needs: few Ps, and few goroutines blocked in system calls at once.
package threads

import (
	"runtime"
	"sync"
)

// Reserve limits the program to procs Ps (GOMAXPROCS) and has Go make n
// threads now: n goroutines each hold a thread of their own at once, then
// end, leaving the threads idle for the scheduler, which keeps idle
// threads for reuse and never ends them.
func Reserve(procs, n int) {
	runtime.GOMAXPROCS(procs)
	var held, release, unlocked sync.WaitGroup
	held.Add(n)
	release.Add(1)
	unlocked.Add(n)
	for range n {
		go func() {
			runtime.LockOSThread()
			held.Done()
			release.Wait()
			runtime.UnlockOSThread()
			unlocked.Done()
		}()
	}
	held.Wait()
	release.Done()
	// A thread still locked to its goroutine is not free for others.
	unlocked.Wait()
}
