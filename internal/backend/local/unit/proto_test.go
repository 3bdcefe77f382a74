package unit

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
)

// socketPair returns two connected Unix stream sockets.
func socketPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "pair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

func TestRequestCarriesDescriptors(t *testing.T) {
	a, b := socketPair(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	req := Request{Op: "exec", Argv: []string{"echo", "hi"}, Env: []string{"A=b"}, Dir: "/workspace", TTY: true}
	if err := sendRequest(a, req, []*os.File{r, w, w}); err != nil {
		t.Fatal(err)
	}
	got, files, err := readRequest(b)
	defer closeAll(files)
	if err != nil {
		t.Fatal(err)
	}
	if got.Op != req.Op || strings.Join(got.Argv, " ") != "echo hi" || got.Dir != req.Dir || !got.TTY || got.Env[0] != "A=b" {
		t.Fatalf("request %+v", got)
	}
	if len(files) != 3 {
		t.Fatalf("%d descriptors, want 3", len(files))
	}
	// The passed write end reaches the same pipe.
	if _, err := files[1].Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1)
	if _, err := r.Read(buf); err != nil || buf[0] != 'x' {
		t.Fatalf("read through the passed descriptor: %q, %v", buf, err)
	}
}

func TestRequestLimit(t *testing.T) {
	// A request line of exactly MaxRequestBytes (newline excluded) is read;
	// one byte more is refused.
	for _, tc := range []struct {
		name    string
		argLen  int
		wantErr bool
	}{
		{"at the limit", MaxRequestBytes, false},
		{"one past", MaxRequestBytes + 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := socketPair(t)
			prefix := `{"op":"exec","argv":["`
			suffix := `"]}`
			line := prefix + strings.Repeat("a", tc.argLen-len(prefix)-len(suffix)) + suffix + "\n"
			go a.Write([]byte(line))
			_, files, err := readRequest(b)
			closeAll(files)
			if tc.wantErr != (err != nil) {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if err != nil && !errors.Is(err, ErrProtocol) {
				t.Fatalf("err = %v, want ErrProtocol", err)
			}
		})
	}
}

func TestRequestRefusesUnknownFieldsAndTrailingData(t *testing.T) {
	for _, line := range []string{
		`{"op":"exec","argv":["x"],"user":"root"}` + "\n",
		`{"op":"ping"}` + "\n" + `{"op":"ping"}` + "\n",
		`not json` + "\n",
	} {
		a, b := socketPair(t)
		go a.Write([]byte(line))
		_, files, err := readRequest(b)
		closeAll(files)
		if !errors.Is(err, ErrProtocol) {
			t.Errorf("%q: err = %v, want ErrProtocol", line, err)
		}
	}
}

func TestReplyBounds(t *testing.T) {
	for _, tc := range []struct {
		line    string
		wantErr bool
	}{
		{`{"exit":0}`, false},
		{`{"exit":255}`, false},
		{`{"exit":256}`, true},
		{`{"exit":-1}`, true},
		{`{"pid":7}`, false},
		{`{"ok":true}`, false},
		{"{\"exit\":1," + strings.Repeat(" ", MaxReplyBytes) + "}", true},
		{`garbage`, true},
	} {
		_, err := readReply(bufio.NewReaderSize(strings.NewReader(tc.line+"\n"), MaxReplyBytes))
		if tc.wantErr != (err != nil) {
			t.Errorf("%.40q: err = %v, want error %v", tc.line, err, tc.wantErr)
		}
	}
}

// FuzzReadReply: whatever a (hijacked) supervisor sends, the broker's
// reply parser neither panics nor accepts an exit status out of range.
func FuzzReadReply(f *testing.F) {
	for _, s := range []string{`{"exit":3}`, `{"pid":1}`, `{"ok":true}`, `{"exit":300}`, "", "\n\n", `{"exit":1e9}`} {
		f.Add([]byte(s + "\n"))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := readReply(bufio.NewReaderSize(bytes.NewReader(data), MaxReplyBytes))
		if err == nil && r.Exit != nil && (*r.Exit < 0 || *r.Exit > 255) {
			t.Fatalf("accepted exit %d", *r.Exit)
		}
	})
}
