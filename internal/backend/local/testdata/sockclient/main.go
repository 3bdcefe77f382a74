// Command sockclient stands in for the jailbee client in the local
// backend's tests: it connects to a Unix socket (its argument, else
// $JAILBEE_ORCHESTRATION_SOCKET, else the mounted broker socket), and
// copies what it reads to stdout. It exits 1 if it cannot connect.
// A leading "@" names an abstract socket.
package main

import (
	"fmt"
	"io"
	"net"
	"os"
)

func main() {
	addr := "/run/jailbee/orchestration/broker.sock"
	if env := os.Getenv("JAILBEE_ORCHESTRATION_SOCKET"); env != "" {
		addr = env
	}
	if len(os.Args) > 1 {
		addr = os.Args[1]
	}
	conn, err := net.Dial("unix", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sockclient:", err)
		os.Exit(1)
	}
	defer conn.Close()
	if _, err := io.Copy(os.Stdout, conn); err != nil {
		fmt.Fprintln(os.Stderr, "sockclient:", err)
		os.Exit(1)
	}
}
