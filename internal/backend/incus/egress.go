package incus

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path"
	"syscall"
	"time"

	"agentbox/internal/backend"
	"agentbox/internal/egress"
	"agentbox/internal/threads"

	"golang.org/x/sys/unix"
)

// EgressCommand is `jailbee _egress-listen`, run as root: the container's
// egress relay (egress.Relay) on 127.0.0.1:backend.EgressPort. It brings
// up lo (a container without a network device has it down), binds the
// port, then leaves a detached copy of itself serving it as the agent
// user and returns, so the incus exec that started it ends. A port
// already taken (a relay of an earlier start) is success.
const EgressCommand = "_egress-listen"

// egressServeArg makes the detached copy serve the listener it inherits.
const egressServeArg = "-serve"

// startEgressRelay starts the container's egress relay (Start, each time):
// a container has no network device, so this is its only way out.
func (b *Backend) startEgressRelay(ctx context.Context, name string) error {
	if b.opts.Client == "" {
		return nil // no client in the container (tests of the backend alone)
	}
	// Checked like every command's client; here, before anything else
	// runs, root inside may have covered it as the container booted (an
	// init of its own): put back first.
	if err := b.checkClient(ctx, name); errors.Is(err, ErrCovered) {
		if err := b.Restore(ctx, name); err != nil {
			return fmt.Errorf("start %s: %w", name, err)
		}
		if err := b.checkClient(ctx, name); err != nil {
			return fmt.Errorf("start %s: %w", name, err)
		}
	} else if err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	// Root inside can make it hang (a FIFO at /dev/null, which the relay
	// opens for its stdin): a Start must end all the same, failing only
	// this sandbox's start. The relay itself takes milliseconds.
	ectx, cancel := context.WithTimeout(ctx, egressTimeout)
	defer cancel()
	_, err := b.runInside(ectx, nil, "exec", name, "--user", "0", "--group", "0", "--cwd", "/",
		"--force-noninteractive", "--", ClientPath, EgressCommand)
	if err != nil && ctx.Err() == nil && ectx.Err() != nil {
		return fmt.Errorf("start %s: egress relay: not started within %v (something inside the sandbox holds it up)", name, egressTimeout)
	}
	if err != nil {
		return fmt.Errorf("start %s: egress relay: %w", name, err)
	}
	return nil
}

// egressMain is `jailbee _egress-listen [-serve]`.
func egressMain(args []string) int {
	sock := path.Join(backend.ModelMountPath, backend.EgressSocketName)
	if len(args) == 1 && args[0] == egressServeArg {
		ln, err := net.FileListener(os.NewFile(3, "egress"))
		if err != nil {
			return 1
		}
		// The relay lives in the container's task limit, which the
		// agent's processes may fill: it makes its threads now, as the
		// container starts. It needs no more: its sockets are polled,
		// and at most two of its goroutines are in a system call at
		// once, besides the one accepting (egress.Relay).
		threads.Reserve(egress.RelayProcs, egress.RelayThreads)
		egress.Relay(ln, sock)
		return 1
	}
	if len(args) != 0 {
		fmt.Fprintln(os.Stderr, "usage: jailbee _egress-listen")
		return 2
	}
	if err := loopbackUp(); err != nil {
		fmt.Fprintf(os.Stderr, "jailbee _egress-listen: bring up lo: %v\n", err)
		return 1
	}
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", backend.EgressPort))
	if errors.Is(err, syscall.EADDRINUSE) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "jailbee _egress-listen: %v\n", err)
		return 1
	}
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		fmt.Fprintf(os.Stderr, "jailbee _egress-listen: %v\n", err)
		return 1
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "jailbee _egress-listen: %v\n", err)
		return 1
	}
	// The relay runs as the agent's uid for the container's life: one
	// the agent could ptrace (where the host lets a uid trace its own)
	// must not be able to gain privileges either (noNewPrivs).
	if err := setNoNewPrivs(); err != nil {
		fmt.Fprintf(os.Stderr, "jailbee _egress-listen: %v\n", err)
		return 1
	}
	cmd := exec.Command(self, EgressCommand, egressServeArg)
	cmd.ExtraFiles = []*os.File{f}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true,
		Credential: &syscall.Credential{Uid: AgentUID, Gid: AgentUID, Groups: []uint32{}}}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "jailbee _egress-listen: %v\n", err)
		return 1
	}
	return 0
}

// loopbackUp sets lo up.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// egressTimeout bounds Start's step that starts the egress relay inside
// the container (a var: tests shorten it).
var egressTimeout = 30 * time.Second
