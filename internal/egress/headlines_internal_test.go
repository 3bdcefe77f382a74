package egress

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"
)

// readAllHead reads h to its end, each read given a buffer of size.
func readAllHead(h *headLines, size int) ([]byte, error) {
	var out []byte
	buf := make([]byte, size)
	for {
		n, err := h.Read(buf)
		out = append(out, buf[:n]...)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
	}
}

func TestHeadLinesOnce(t *testing.T) {
	tests := []struct {
		name, in string
		over     bool
	}{
		{"at the limit", "GET / HTTP/1.1\r\na: 1\r\nb: 2\r\n\r\n", false},
		{"past the limit", "GET / HTTP/1.1\r\na: 1\r\nb: 2\r\nc: 3\r\n\r\n", true},
		{"bare newlines at the limit", "GET / HTTP/1.1\na:\nb:\n\n", false},
		{"bare newlines past the limit", "GET / HTTP/1.1\na:\nb:\nc:\n\n", true},
		{"a continuation is a line", "GET / HTTP/1.1\r\na: 1\r\n 2\r\n 3\r\n\r\n", true},
		{"a lone CR starts no empty line", "GET / HTTP/1.1\r\n\ra:\r\n\rb:\r\n\rc:\r\n\r\n", true},
		{"the body is not counted", "POST / HTTP/1.1\r\na: 1\r\nb: 2\r\n\r\n\n\n\n\r\n\r\nx\ny\nz\n", false},
		{"a head cut short", "GET / HTTP/1.1\r\na: 1\r\nb: 2\r\n", false},
	}
	for _, tt := range tests {
		for _, size := range []int{1, 7, 4096} {
			t.Run(fmt.Sprintf("%s/%d", tt.name, size), func(t *testing.T) {
				h := newHeadLines(strings.NewReader(tt.in), 2, true)
				got, err := readAllHead(h, size)
				if tt.over {
					if !errors.Is(err, errHeaderLines) || !h.over {
						t.Fatalf("read %q, %v; want errHeaderLines", got, err)
					}
					if _, err := h.Read(make([]byte, 10)); !errors.Is(err, errHeaderLines) {
						t.Fatalf("a read after the refusal: %v", err)
					}
					return
				}
				if err != nil || string(got) != tt.in || h.over {
					t.Fatalf("read %q, %v; want all of it", got, err)
				}
			})
		}
	}
}

// TestHeadLinesEachHead: counting each head, a read returns no byte past
// a head's end; the next head is counted afresh, and once off the body
// passes uncounted, whatever the source's reads carried.
func TestHeadLinesEachHead(t *testing.T) {
	interim := "HTTP/1.1 100 Continue\r\na: 1\r\nb: 2\r\n\r\n"
	final := "HTTP/1.1 200 OK\na: 1\nb: 2\n\n"
	body := "\n\n\n\r\n\r\nx: 1\ny: 2\nz: 3\n"
	for name, src := range map[string]func(string) io.Reader{
		"whole":    func(s string) io.Reader { return strings.NewReader(s) },
		"one byte": func(s string) io.Reader { return iotest.OneByteReader(strings.NewReader(s)) },
		"data+EOF": func(s string) io.Reader { return iotest.DataErrReader(strings.NewReader(s)) },
	} {
		t.Run(name, func(t *testing.T) {
			h := newHeadLines(src(interim+final+body), 2, false)
			br := bufio.NewReader(h)
			for _, want := range []string{interim, final} {
				var got []byte
				for !bytes.HasSuffix(got, []byte("\n\n")) && !bytes.HasSuffix(got, []byte("\r\n\r\n")) {
					line, err := br.ReadSlice('\n')
					if err != nil {
						t.Fatalf("after %q: %v", got, err)
					}
					got = append(got, line...)
				}
				if string(got) != want || br.Buffered() != 0 {
					t.Fatalf("head %q, %d bytes buffered past it; want %q and none", got, br.Buffered(), want)
				}
			}
			h.off = true
			rest, err := io.ReadAll(br)
			if err != nil || string(rest) != body {
				t.Fatalf("body %q, %v", rest, err)
			}
		})
	}
	t.Run("second head past the limit", func(t *testing.T) {
		h := newHeadLines(strings.NewReader(interim+"HTTP/1.1 200 OK\r\na:\r\nb:\r\nc:\r\n\r\n"), 2, false)
		got, err := readAllHead(h, 4096)
		if !errors.Is(err, errHeaderLines) || string(got) != interim {
			t.Fatalf("read %q, %v; want the first head, then errHeaderLines", got, err)
		}
	})
}

// hostileHead is a head of size bytes: first, then lines header lines
// (the last one padded to size) or, with lines 0, as many 4-byte header
// lines of distinct names as fit, the cheapest line that costs a map
// entry.
func hostileHead(first string, size, lines int) string {
	var b strings.Builder
	b.WriteString(first)
	for i := 0; lines == 0 && b.Len() < size-8 || i < lines-1; i++ {
		fmt.Fprintf(&b, "%x:\n", i%4096+4096) // 4 digits: the same names over again past 4096
	}
	if lines > 0 {
		b.WriteString("x-pad: " + strings.Repeat("a", size-b.Len()-len("x-pad: \n\n")) + "\n")
	}
	for b.Len() < size-1 {
		b.WriteString("\n") // still part of the last line's end: at most 3 of them
	}
	b.WriteString("\n")
	return b.String()
}

// allocated is how many bytes f allocates on the heap.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// What parsing one head may allocate at most, generous bounds: a head of
// short lines, refused before it is parsed, some 10 KB now (before header
// lines were counted, 1.2 MB for a request head of 64 KiB, 10 MB for a
// response head of 1 MiB); the largest head that passes (its lines
// allowed, its bytes allowed, one line of nearly all of them) some 400 KB,
// mostly the line's buffer as it grows.
const (
	refusedHeadBound = 64 << 10
	largestHeadBound = 1 << 20
)

// TestRequestHeadMemory: a request head of MaxHeadBytes in short header
// lines is refused before it costs more than refusedHeadBound, and the
// largest head that passes (MaxRequestHeaderLines lines, MaxHeadBytes)
// costs at most largestHeadBound.
func TestRequestHeadMemory(t *testing.T) {
	for _, tc := range []struct {
		name   string
		lines  int
		status int
		bound  uint64
	}{
		{"short lines", 0, http.StatusRequestHeaderFieldsTooLarge, refusedHeadBound},
		{"the largest head", MaxRequestHeaderLines, http.StatusBadRequest, largestHeadBound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			head := hostileHead("GET http://pypi.org:0/ HTTP/1.1\n", MaxHeadBytes, tc.lines)
			var err error
			n := allocated(func() {
				lr := &io.LimitedReader{R: strings.NewReader(head), N: MaxHeadBytes}
				hl := newHeadLines(lr, MaxRequestHeaderLines, true)
				_, err = readHead(bufio.NewReader(hl), hl, lr)
			})
			t.Logf("a request head of %d bytes in %d lines: %d bytes allocated, %v", len(head), strings.Count(head, "\n"), n, err)
			var he *httpError
			if !errors.As(err, &he) || he.status != tc.status {
				t.Fatalf("answered %v; want %d", err, tc.status)
			}
			if n > tc.bound {
				t.Fatalf("parsing it allocated %d bytes; want at most %d", n, tc.bound)
			}
		})
	}
}

// TestResponseHeadMemory: so is a destination's answer head of
// MaxResponseHeadBytes, read from a real socket.
func TestResponseHeadMemory(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lines int
		ok    bool
		bound uint64
	}{
		{"short lines", 0, false, refusedHeadBound},
		{"the largest head", MaxResponseHeaderLines, true, largestHeadBound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			head := hostileHead("HTTP/1.1 204 No Content\n", MaxResponseHeadBytes, tc.lines)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				io.WriteString(c, head)
				io.Copy(io.Discard, c) // until the reader closes
			}()
			up, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer up.Close()
			n := allocated(func() {
				_, err = readResponse(&upReader{c: up}, &http.Request{Method: http.MethodGet})
			})
			t.Logf("a response head of %d bytes in %d lines: %d bytes allocated, %v", len(head), strings.Count(head, "\n"), n, err)
			var he *httpError
			if tc.ok && err != nil || !tc.ok && (!errors.As(err, &he) || he.status != http.StatusBadGateway) {
				t.Fatalf("answered %v", err)
			}
			if n > tc.bound {
				t.Fatalf("parsing it allocated %d bytes; want at most %d", n, tc.bound)
			}
		})
	}
}
