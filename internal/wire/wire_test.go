package wire_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"agentbox/internal/wire"
)

func TestReadLineLimit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		lineLen int // bytes including the newline
		wantErr error
	}{
		{"short", 10, nil},
		{"exactly the buffer", 4096, nil},
		{"at the limit", wire.MaxLineBytes, nil},
		{"one past the limit", wire.MaxLineBytes + 1, wire.ErrLineTooLong},
	} {
		t.Run(tc.name, func(t *testing.T) {
			input := strings.Repeat("x", tc.lineLen-1) + "\nnext\n"
			// A one-byte reader makes the line arrive in many pieces.
			r := bufio.NewReaderSize(iotest.HalfReader(strings.NewReader(input)), 4096)
			line, err := wire.ReadLine(r, wire.MaxLineBytes)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			if len(line) != tc.lineLen-1 {
				t.Fatalf("line of %d bytes, want %d", len(line), tc.lineLen-1)
			}
			next, err := wire.ReadLine(r, wire.MaxLineBytes)
			if err != nil || string(next) != "next" {
				t.Fatalf("the following line: %q, %v", next, err)
			}
		})
	}
}

func TestReadLineEnds(t *testing.T) {
	r := bufio.NewReader(strings.NewReader("partial"))
	if _, err := wire.ReadLine(r, wire.MaxLineBytes); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("unterminated last line: %v", err)
	}
	r = bufio.NewReader(strings.NewReader(""))
	if _, err := wire.ReadLine(r, wire.MaxLineBytes); !errors.Is(err, io.EOF) {
		t.Fatalf("empty input: %v", err)
	}
}

func TestAppendResponse(t *testing.T) {
	ok, _ := wire.OK(map[string]int{"a": 1})
	for _, tc := range []struct {
		resp *wire.Response
		want string
	}{
		{ok, `{"v":1,"ok":true,"result":{"a":1}}` + "\n"},
		{wire.Fail(wire.Errorf(wire.CodeBusy, "x")), `{"v":1,"ok":false,"error":{"code":"busy","detail":"x"}}` + "\n"},
	} {
		got, err := wire.AppendResponse(nil, tc.resp)
		if err != nil || string(got) != tc.want {
			t.Errorf("AppendResponse = %q, %v; want %q", got, err, tc.want)
		}
	}
}

func TestAsErrorHidesInternals(t *testing.T) {
	e := wire.AsError(errors.New("open /var/secret/path: permission denied"))
	if e.Code != wire.CodeInternal || strings.Contains(e.Detail, "/var") {
		t.Fatalf("internal error leaked: %+v", e)
	}
	werr := wire.Errorf(wire.CodeNotFound, "no unread item 'x'")
	if got := wire.AsError(werr); got != werr {
		t.Fatalf("wire error not kept: %+v", got)
	}
}

func TestDecodeStrict(t *testing.T) {
	var v struct {
		A int `json:"a"`
	}
	for in, ok := range map[string]bool{`{"a":1}`: true, `{"a":1,"b":2}`: false, `{"a":1} {}`: false, `{"a":"x"}`: false, ``: false} {
		if err := wire.DecodeStrict([]byte(in), &v); (err == nil) != ok {
			t.Errorf("DecodeStrict(%q) = %v", in, err)
		}
	}
}

// FuzzReadLine: any byte stream yields lines that are within the limit,
// hold no newline, and reassemble the input.
func FuzzReadLine(f *testing.F) {
	f.Add([]byte("a\nb\n"), 8)
	f.Add([]byte("\n\n\n"), 1)
	f.Add([]byte("no newline"), 64)
	f.Add(bytes.Repeat([]byte("x"), 100), 16)
	f.Fuzz(func(t *testing.T, data []byte, max int) {
		if max < 1 || max > 1<<16 {
			return
		}
		r := bufio.NewReaderSize(bytes.NewReader(data), 16)
		var got []byte
		for {
			line, err := wire.ReadLine(r, max)
			if errors.Is(err, wire.ErrLineTooLong) {
				return
			}
			if newline := err == nil; len(line)+btoi(newline) > max {
				t.Fatalf("line of %d bytes passed a limit of %d", len(line), max)
			}
			if bytes.IndexByte(line, '\n') >= 0 {
				t.Fatalf("line holds a newline: %q", line)
			}
			if err != nil {
				got = append(got, line...)
				break
			}
			got = append(append(got, line...), '\n')
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("lines reassemble to %q, input %q", got, data)
		}
	})
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
