// Package fdpass passes open files over Unix sockets (SCM_RIGHTS): the
// streams of a command from `jailbee exec` to the broker, and from the
// broker to a sandbox's supervisor.
package fdpass

import (
	"net"
	"os"
	"syscall"
)

// Rights encodes files as one SCM_RIGHTS control message (nil for none).
func Rights(files []*os.File) []byte {
	if len(files) == 0 {
		return nil
	}
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	return syscall.UnixRights(fds...)
}

// Space is the control buffer size that holds n descriptors.
func Space(n int) int { return syscall.CmsgSpace(n * 4) }

// Files decodes the SCM_RIGHTS messages of oob into files, close-on-exec.
// The caller owns them, also when an error is returned with them.
func Files(oob []byte) ([]*os.File, error) {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var files []*os.File
	for _, m := range msgs {
		fds, err := syscall.ParseUnixRights(&m)
		if err != nil {
			continue // not SCM_RIGHTS
		}
		for _, fd := range fds {
			syscall.CloseOnExec(fd)
			files = append(files, os.NewFile(uintptr(fd), "passed"))
		}
	}
	return files, nil
}

// Read is one ReadMsgUnix with room for most descriptors: the bytes read
// (never a negative count, as io.Reader requires), the files that came
// with them, and whether more were sent than there was room for (the
// kernel closed those).
func Read(c *net.UnixConn, p []byte, most int) (n int, files []*os.File, truncated bool, err error) {
	oob := make([]byte, Space(most))
	n, oobn, flags, _, err := c.ReadMsgUnix(p, oob)
	if oobn > 0 {
		files, _ = Files(oob[:oobn])
	}
	return max(n, 0), files, flags&syscall.MSG_CTRUNC != 0, err
}

// Write writes p with files attached to its first byte.
func Write(c *net.UnixConn, p []byte, files []*os.File) error {
	n, _, err := c.WriteMsgUnix(p, Rights(files), nil)
	if err == nil && n < len(p) {
		_, err = c.Write(p[n:])
	}
	return err
}
