// Command agentbox-probe runs inside branchbox's test containers (it is
// /usr/local/bin/agentbox-probe in the agentbox-test/service:1 image that
// scripts/docker-setup.sh builds) and reports what the container may do:
//
//	agentbox-probe vsock    exit 0: creating an AF_VSOCK socket is denied
//	                        (EPERM or EACCES, the seccomp profile's answer);
//	                        exit 3: it is allowed; exit 4: any other error
//	                        (EAFNOSUPPORT: the kernel has no vsock, which
//	                        says nothing about seccomp)
//	agentbox-probe seccomp  prints the Seccomp: value of /proc/self/status;
//	                        exit 0 iff it is 2 (filter mode)
//	agentbox-probe env      prints the environment, sorted, one per line
//	agentbox-probe serve P  listens on TCP port P (all addresses) and
//	                        writes "agentbox-probe\n" to each connection
//
// Exit 2 is a usage error. It is static (CGO_ENABLED=0) and uses only the
// standard library and golang.org/x/sys/unix, so the image needs no libc
// of its own for it.
package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// Exit codes of the vsock subcommand.
const (
	exitDenied  = 0
	exitUsage   = 2
	exitAllowed = 3
	exitError   = 4
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == "serve" {
		serve(os.Args[2])
	}
	if len(os.Args) != 2 {
		usage()
	}
	switch os.Args[1] {
	case "vsock":
		msg, code := vsock(func() (int, error) {
			return unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM, 0)
		})
		fmt.Println(msg)
		os.Exit(code)
	case "seccomp":
		f, err := os.Open("/proc/self/status")
		if err != nil {
			fmt.Fprintln(os.Stderr, "seccomp:", err)
			os.Exit(1)
		}
		mode, err := seccompMode(f)
		f.Close()
		if err != nil {
			fmt.Fprintln(os.Stderr, "seccomp:", err)
			os.Exit(1)
		}
		fmt.Println(mode)
		if mode != "2" {
			os.Exit(1)
		}
	case "env":
		env := os.Environ()
		sort.Strings(env)
		for _, kv := range env {
			fmt.Println(kv)
		}
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: agentbox-probe vsock|seccomp|env|serve PORT")
	os.Exit(exitUsage)
}

// vsock interprets the result of creating an AF_VSOCK socket with open
// (closing it when it succeeds): the line to print and the exit code.
func vsock(open func() (int, error)) (string, int) {
	fd, err := open()
	if err == nil {
		unix.Close(fd)
		return "vsock: allowed", exitAllowed
	}
	var errno unix.Errno
	if errors.As(err, &errno) && (errno == unix.EPERM || errno == unix.EACCES) {
		return fmt.Sprintf("vsock: denied (%s)", unix.ErrnoName(errno)), exitDenied
	}
	return fmt.Sprintf("vsock: error %v", err), exitError
}

// seccompMode returns the value of the "Seccomp:" line of a
// /proc/<pid>/status file.
func seccompMode(status io.Reader) (string, error) {
	sc := bufio.NewScanner(status)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Seccomp:"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", errors.New("no Seccomp: line in /proc/self/status")
}

// serve answers every connection to port with one line, forever: the
// port proxy tests reach it from the host.
func serve(port string) {
	l, err := net.Listen("tcp", ":"+port)
	if err != nil {
		fmt.Fprintln(os.Stderr, "serve:", err)
		os.Exit(1)
	}
	for {
		c, err := l.Accept()
		if err != nil {
			fmt.Fprintln(os.Stderr, "serve:", err)
			os.Exit(1)
		}
		io.WriteString(c, "agentbox-probe\n")
		c.Close()
	}
}
