package gitx

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
)

// The destination side of a Transfer runs inside the destination's
// sandbox as `jailbee _git-fetch [--init] [--checkout BRANCH] COMMIT REF`
// (--init: `git init` first; --checkout: the branch checked out at the
// commit after): its stdin and stdout are the
// pipe to the source's upload-pack. It runs `git fetch` with an ext::
// remote whose command (`jailbee _git-ext`) relays git's protocol over a
// socket it inherits through git. No network and no path of the source is
// involved: the remote's URL names only the relay.
//
// Each side ends its direction with shutdown(SHUT_WR), which reaches the
// other end even though git itself holds a copy of the relay's socket:
// waiting for the last copy to close would wait for git, which waits for
// the relay.
const (
	fetchCommand = "_git-fetch"
	extCommand   = "_git-ext"
	// serveCommand is the source side, `jailbee _git-serve COMMIT`:
	// upload-pack on the repository in the working directory, serving
	// COMMIT alone (see serveRef); its stdin and stdout are the pipe to
	// the destination.
	serveCommand = "_git-serve"
	// extFD is the relay's socket, as the ext:: command inherits it.
	extFD = 3
)

// IsHelperCommand reports whether a program's first argument names one of
// the in-sandbox helpers HelperMain runs.
func IsHelperCommand(arg string) bool {
	return arg == fetchCommand || arg == extCommand || arg == serveCommand
}

// HelperMain runs the helper args[0] names with its arguments and returns
// its exit status.
func HelperMain(args []string) int {
	switch args[0] {
	case fetchCommand:
		return fetchMain(args[1:])
	case extCommand:
		return extMain()
	case serveCommand:
		return serveMain(args[1:])
	}
	return 2
}

// fetchMain is `jailbee _git-fetch [--init] [--checkout BRANCH] COMMIT REF`.
func fetchMain(args []string) int {
	init, branch, args := parseFetchFlags(args)
	if len(args) != 2 || !shaPattern.MatchString(args[0]) || !strings.HasPrefix(args[1], "refs/") ||
		strings.HasPrefix(branch, "-") {
		fmt.Fprintln(os.Stderr, "usage: jailbee _git-fetch [--init] [--checkout BRANCH] COMMIT REF")
		return 2
	}
	commit, ref := args[0], args[1]
	if init {
		if out, err := exec.Command("git", "init", "--quiet").CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "jailbee _git-fetch: git init: %v: %s\n", err, out)
			return 1
		}
	}
	self, err := os.Executable()
	if err != nil || strings.ContainsAny(self, " %") {
		fmt.Fprintln(os.Stderr, "jailbee _git-fetch: cannot name the relay")
		return 1
	}
	ours, theirs, err := socketPair()
	if err != nil {
		return fail(err)
	}
	defer ours.Close()
	cmd := exec.Command("git",
		"-c", "protocol.ext.allow=always", "-c", "protocol.version=0",
		"fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--no-recurse-submodules",
		"ext::"+self+" "+extCommand, "+"+commit+":"+ref)
	// stdout is the pipe to the source: git's own output goes to stderr.
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	// git does not close descriptors it inherits: the relay gets it as extFD.
	cmd.ExtraFiles = []*os.File{theirs}
	if err := cmd.Start(); err != nil {
		return fail(err)
	}
	theirs.Close()
	go func() {
		io.Copy(ours, os.Stdin) // the source's answers, to git
		ours.CloseWrite()
	}()
	relayed := make(chan struct{})
	go func() {
		io.Copy(os.Stdout, ours) // git's requests, to the source
		os.Stdout.Close()
		close(relayed)
	}()
	if err := cmd.Wait(); err != nil {
		fmt.Fprintf(os.Stderr, "jailbee _git-fetch: %v\n", err)
		return 1
	}
	<-relayed
	got, err := exec.Command("git", "rev-parse", "--verify", "--quiet", ref+"^{commit}").Output()
	if err != nil || strings.TrimSpace(string(got)) != commit {
		fmt.Fprintln(os.Stderr, "jailbee _git-fetch: the fetched ref does not name the commit")
		return 1
	}
	if branch != "" {
		if out, err := exec.Command("git", "checkout", "--quiet", "-B", branch, commit, "--").CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "jailbee _git-fetch: git checkout: %v: %s\n", err, out)
			return 1
		}
	}
	return 0
}

// serveMain is `jailbee _git-serve COMMIT`: COMMIT set at serveRef in a
// namespace of its own for the length of one upload-pack, which serves
// nothing else.
func serveMain(args []string) int {
	if len(args) != 1 || !shaPattern.MatchString(args[0]) {
		fmt.Fprintln(os.Stderr, "usage: jailbee _git-serve COMMIT")
		return 2
	}
	commit := args[0]
	ns, ref, err := serveNamespace()
	if err != nil {
		return fail(err)
	}
	if out, err := exec.Command("git", "update-ref", "--no-deref", ref, commit, "").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "jailbee _git-serve: git update-ref: %v: %s\n", err, out)
		return 1
	}
	defer exec.Command("git", "update-ref", "--no-deref", "-d", ref, commit).Run()
	cmd := exec.Command("git", append(append([]string{}, uploadArgs...), ".")...)
	// No GIT_PROTOCOL: version 0 (serveRef).
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GIT_PROTOCOL=") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, "GIT_NAMESPACE="+ns)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "jailbee _git-serve: %v\n", err)
		return 1
	}
	return 0
}

// parseFetchFlags takes _git-fetch's leading flags off args.
func parseFetchFlags(args []string) (init bool, branch string, rest []string) {
	for len(args) > 0 {
		switch {
		case args[0] == "--init":
			init, args = true, args[1:]
		case args[0] == "--checkout" && len(args) > 1 && branch == "":
			branch, args = args[1], args[2:]
		default:
			return init, branch, args
		}
	}
	return init, branch, args
}

// extMain is `jailbee _git-ext`, git's ext:: remote command: it relays
// git's requests to the socket extFD and the answers back to git.
func extMain() int {
	f := os.NewFile(extFD, "relay")
	if f == nil {
		return fail(fmt.Errorf("no relay socket"))
	}
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return fail(err)
	}
	relay, ok := c.(*net.UnixConn)
	if !ok {
		return fail(fmt.Errorf("the relay is not a Unix socket"))
	}
	go func() {
		io.Copy(relay, os.Stdin)
		relay.CloseWrite()
	}()
	io.Copy(os.Stdout, relay)
	return 0
}

// socketPair returns two connected Unix stream sockets.
func socketPair() (*net.UnixConn, *os.File, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	f := os.NewFile(uintptr(fds[0]), "relay")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		syscall.Close(fds[1])
		return nil, nil, err
	}
	return c.(*net.UnixConn), os.NewFile(uintptr(fds[1]), "relay"), nil
}

func fail(err error) int {
	fmt.Fprintf(os.Stderr, "jailbee: %v\n", err)
	return 1
}
