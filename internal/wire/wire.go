// Package wire holds the orchestration protocol's framing and envelopes:
// one JSON object per line, bounded, with a version and a stable error code.
package wire

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// Version is the only envelope version this broker and client speak.
const Version = 1

// MaxLineBytes bounds one request or reply line, newline included
// (spec: "at most 1 MiB including the newline").
const MaxLineBytes = 1 << 20

// Code is a protocol error code, stable on the wire.
type Code string

// The protocol's error codes.
const (
	CodeBadRequest Code = "bad_request" // unparsable or oversized request
	CodeVersion    Code = "version"     // envelope version mismatch
	CodeBusy       Code = "busy"        // a cap was reached; retry later
	CodeNotFound   Code = "not_found"   // no such item
	CodeDuplicate  Code = "duplicate"   // manifest id journaled without a status
	CodeUnknownOp  Code = "unknown_op"  // op not served
	CodeDenied     Code = "denied"      // op not allowed for this caller
	CodeInternal   Code = "internal"    // broker fault; detail is generic
)

// Error is a protocol error: a code and a detail that is safe to show the
// caller (never a host path, secret or capability).
type Error struct {
	Code   Code   `json:"code"`
	Detail string `json:"detail"`
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Detail }

// Errorf builds a protocol error.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Detail: fmt.Sprintf(format, args...)}
}

// AsError turns any error into a wire error. Errors that are not already
// wire errors become internal with a generic detail, so internals never leak.
func AsError(err error) *Error {
	var we *Error
	if errors.As(err, &we) {
		return we
	}
	return &Error{Code: CodeInternal, Detail: "internal broker error (see the broker log)"}
}

// Request is one client request line.
type Request struct {
	V    int             `json:"v"`
	Op   string          `json:"op"`
	Args json.RawMessage `json:"args,omitempty"`
}

// Response is one reply line.
type Response struct {
	V      int             `json:"v"`
	OK     bool            `json:"ok"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  *Error          `json:"error,omitempty"`
}

// ErrLineTooLong is returned by ReadLine for a line over MaxLineBytes.
var ErrLineTooLong = errors.New("line exceeds 1 MiB")

// ReadLine reads one newline-terminated line of at most max bytes
// (newline included) without buffering more than the line itself.
// It returns the line without its newline. A final line without a newline
// is returned with io.ErrUnexpectedEOF.
func ReadLine(r *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		if len(line)+len(chunk) > max {
			return nil, ErrLineTooLong
		}
		line = append(line, chunk...)
		switch {
		case err == nil:
			return bytes.TrimSuffix(line, []byte{'\n'}), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(line) > 0:
			return line, io.ErrUnexpectedEOF
		default:
			return nil, err
		}
	}
}

// Marshal encodes v as one line (with the newline).
func Marshal(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// AppendResponse appends resp as one line. A success's result is copied as
// it is: results are JSON this program produced (compact, without raw
// newlines), so re-validating them on every reply is wasted work.
func AppendResponse(dst []byte, resp *Response) ([]byte, error) {
	if !resp.OK || len(resp.Result) == 0 {
		line, err := Marshal(resp)
		return append(dst, line...), err
	}
	dst = append(dst, `{"v":`...)
	dst = strconv.AppendInt(dst, int64(resp.V), 10)
	dst = append(dst, `,"ok":true,"result":`...)
	dst = append(dst, resp.Result...)
	return append(dst, "}\n"...), nil
}

// OK builds a success response around result.
func OK(result any) (*Response, error) {
	raw, err := json.Marshal(result)
	if err != nil {
		return nil, err
	}
	return &Response{V: Version, OK: true, Result: raw}, nil
}

// Fail builds a failure response.
func Fail(e *Error) *Response { return &Response{V: Version, OK: false, Error: e} }

// DecodeStrict decodes one JSON value into v, refusing unknown fields and
// trailing data.
func DecodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the JSON value")
	}
	return nil
}
