// Command tcp-proxy is the TCP forwarder of branchbox's port proxies and
// the only file of the agentbox-test/tcp-proxy:1 image that
// scripts/docker-setup.sh builds (its entrypoint, /tcp-proxy).
//
// The contract, which branchbox relies on when it runs the proxy image
// with exactly these two arguments:
//
//	/tcp-proxy LISTEN_PORT TARGET_HOST:TARGET_PORT
//
// With them:
//   - it listens on 0.0.0.0:LISTEN_PORT (TCP, IPv4) until it is killed;
//   - for each accepted connection it dials TARGET_HOST:TARGET_PORT anew
//     (the name is resolved at each connection, so a target that starts
//     later or changes address is found); when the dial fails the client's
//     connection is closed;
//   - bytes are copied both ways; when one side finishes sending (EOF) the
//     proxy half-closes the other side's write direction, and the pair is
//     closed once both directions are done;
//   - it logs to stderr one line once it listens ("tcp-proxy: listening
//     on 0.0.0.0:LISTEN_PORT, forwarding to TARGET") and one line per
//     connection, when the connection ends (client, target, bytes each
//     way, or the dial error); nothing goes to stdout;
//   - bad arguments exit 2, a listen failure exits 1.
//
// It is static (stdlib only, CGO_ENABLED=0) so the image needs nothing else.
package main

import (
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"strconv"
	"sync"
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("tcp-proxy: ")
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: /tcp-proxy LISTEN_PORT TARGET_HOST:TARGET_PORT")
		os.Exit(2)
	}
	port, err := strconv.Atoi(os.Args[1])
	if err != nil || port < 1 || port > 65535 {
		fmt.Fprintf(os.Stderr, "tcp-proxy: bad listen port %q\n", os.Args[1])
		os.Exit(2)
	}
	target := os.Args[2]
	if _, _, err := net.SplitHostPort(target); err != nil {
		fmt.Fprintf(os.Stderr, "tcp-proxy: bad target %q: %v\n", target, err)
		os.Exit(2)
	}
	ln, err := net.Listen("tcp4", net.JoinHostPort("0.0.0.0", strconv.Itoa(port)))
	if err != nil {
		log.Print(err)
		os.Exit(1)
	}
	log.Printf("listening on %s, forwarding to %s", ln.Addr(), target)
	for {
		c, err := ln.Accept()
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue
			}
			log.Print(err)
			os.Exit(1)
		}
		go serve(c.(*net.TCPConn), target)
	}
}

// serve forwards one client connection to target.
func serve(client *net.TCPConn, target string) {
	defer client.Close()
	up, err := net.Dial("tcp", target)
	if err != nil {
		log.Printf("%s -> %s: %v", client.RemoteAddr(), target, err)
		return
	}
	server := up.(*net.TCPConn)
	defer server.Close()
	var wg sync.WaitGroup
	var toTarget, toClient int64
	var errUp, errDown error
	wg.Add(2)
	go func() {
		defer wg.Done()
		toTarget, errUp = pipe(server, client)
	}()
	go func() {
		defer wg.Done()
		toClient, errDown = pipe(client, server)
	}()
	wg.Wait()
	msg := fmt.Sprintf("%s -> %s: %d bytes sent, %d received", client.RemoteAddr(), target, toTarget, toClient)
	for _, e := range []error{errUp, errDown} {
		if e != nil {
			msg += fmt.Sprintf(" (%v)", e)
		}
	}
	log.Print(msg)
}

// pipe copies src to dst until src's EOF, then half-closes dst for
// writing so its reader sees the EOF too. On an error both connections
// are closed: the other direction cannot usefully go on.
func pipe(dst, src *net.TCPConn) (int64, error) {
	n, err := io.Copy(dst, src)
	if err != nil {
		dst.Close()
		src.Close()
		return n, err
	}
	dst.CloseWrite()
	return n, nil
}
