package spool

import "encoding/json"

// Response is the endpoint's correlated answer.
type Response struct {
	Version, RunID, LeaseID, Consumer, RequestID string
	Payload                                      json.RawMessage // compacted, opaque
}

// DecodeResponse decodes the endpoint's answer strictly (the frame's six
// fields, no capability) and checks it is version 1 and correlated with
// want. At most MaxResponseBytes, not counting one trailing newline (the
// relay is line-framed). A decline inside payload is a valid response.
func DecodeResponse(data []byte, want IDs) (*Response, error) {
	body := data
	if n := len(body); n > 0 && body[n-1] == '\n' {
		body = body[:n-1]
	}
	if len(body) > MaxResponseBytes {
		return nil, fieldErr("", "larger than %d bytes", MaxResponseBytes)
	}
	m, err := parseMessage(data, frameFields)
	if err != nil {
		return nil, err
	}
	if m.version != Version {
		return nil, &Error{Field: fVersion, Rule: "unsupported"}
	}
	if err := want.match(m.runID, m.leaseID, m.consumer, m.requestID); err != nil {
		return nil, err
	}
	return &Response{
		Version: m.version, RunID: m.runID, LeaseID: m.leaseID, Consumer: m.consumer,
		RequestID: m.requestID, Payload: m.payload,
	}, nil
}

// Bytes is the compact canonical JSON of the response plus "\n": the
// contents of the consumer's responses/<request_id>.json.
func (r *Response) Bytes() []byte {
	b := appendCanonical(nil, r.Version, r.RunID, r.LeaseID, r.Consumer, r.RequestID, r.Payload)
	return append(b, '\n')
}
