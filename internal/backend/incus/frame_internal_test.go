package incus

import (
	"bytes"
	"encoding/binary"
	"testing"
)

func frame(n uint32, data []byte) []byte {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], n)
	return append(b[:], data...)
}

// TestDeframe: pieces pass on in order, the end of stdout is reported
// once, the status ends the stream; a broken or foreign stream is not ok.
func TestDeframe(t *testing.T) {
	exit := func(code uint32) []byte { return append(frame(frameExit, nil), frame(code, nil)...) }
	for _, tc := range []struct {
		name   string
		stream []byte
		out    string
		status int
		ok     bool
		ends   int
	}{
		{name: "pieces, end, status", stream: bytes.Join([][]byte{frame(2, []byte("ab")), frame(1, []byte("c")), frame(0, nil), exit(3)}, nil), out: "abc", status: 3, ok: true, ends: 1},
		{name: "status without an end of stdout", stream: exit(0), ok: true, ends: 1},
		{name: "a piece at the bound", stream: append(frame(frameMax, bytes.Repeat([]byte("x"), frameMax)), exit(0)...), out: string(bytes.Repeat([]byte("x"), frameMax)), ok: true, ends: 1},
		{name: "a piece past the bound", stream: frame(frameMax+1, bytes.Repeat([]byte("x"), frameMax+1)), ends: 1},
		{name: "cut short", stream: frame(5, []byte("ab")), ends: 1},
		{name: "no status", stream: frame(0, nil), ends: 1},
		{name: "nothing after stdout's end passes on", stream: bytes.Join([][]byte{frame(0, nil), frame(1, []byte("z")), exit(1)}, nil), status: 1, ok: true, ends: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			ends := 0
			status, ok := deframe(bytes.NewReader(tc.stream), &out, func() { ends++ })
			if out.String() != tc.out || status != tc.status || ok != tc.ok || ends != tc.ends {
				t.Fatalf("deframe = %q, %d, %v, ends %d; want %q, %d, %v, ends %d", out.String(), status, ok, ends, tc.out, tc.status, tc.ok, tc.ends)
			}
		})
	}
}

// FuzzDeframe: any stream ends deframe, with at most one end of stdout.
func FuzzDeframe(f *testing.F) {
	f.Add(append(frame(1, []byte("a")), frame(0, nil)...))
	f.Fuzz(func(t *testing.T, stream []byte) {
		ends := 0
		var out bytes.Buffer
		deframe(bytes.NewReader(stream), &out, func() { ends++ })
		if ends != 1 {
			t.Fatalf("end of stdout reported %d times", ends)
		}
		if out.Len() > len(stream) {
			t.Fatal("more output than input")
		}
	})
}
