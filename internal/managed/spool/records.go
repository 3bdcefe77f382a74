package spool

import (
	"bytes"
	"encoding/json"
)

// MaxRecordBytes bounds a claim or done record: a frame, a response and
// room for the record's own fields.
const MaxRecordBytes = MaxRequestBytes + MaxResponseBytes + 4096

// Claim is the durable record written before the relay.
type Claim struct {
	Version       string          `json:"version"`        // "1"
	RequestSHA256 string          `json:"request_sha256"` // Fingerprint(Request)
	Request       json.RawMessage `json:"request"`        // the Frame
}

// Done is the durable record written after a valid response.
type Done struct {
	Version       string          `json:"version"`
	RequestSHA256 string          `json:"request_sha256"`
	Request       json.RawMessage `json:"request"`
	Response      json.RawMessage `json:"response"` // Response.Bytes() without the final newline
}

var (
	claimFields = []string{fVersion, fSHA, fRequest}
	doneFields  = []string{fVersion, fSHA, fRequest, fResponse}
)

// NewClaim records frame (from Envelope.Frame) and its fingerprint.
func NewClaim(frame []byte) Claim {
	return Claim{Version: Version, RequestSHA256: Fingerprint(frame), Request: bytes.Clone(frame)}
}

// NewDone records frame and the response validated for it.
func NewDone(frame []byte, r *Response) Done {
	resp := r.Bytes()
	return Done{
		Version: Version, RequestSHA256: Fingerprint(frame),
		Request: bytes.Clone(frame), Response: resp[:len(resp)-1],
	}
}

// Marshal is compact JSON plus "\n". It is built by hand because
// json.Marshal would HTML-escape the embedded frame and so change the bytes
// the fingerprint covers.
func (c Claim) Marshal() []byte {
	b := appendRecordHead(nil, c.Version, c.RequestSHA256, c.Request)
	return append(b, "}\n"...)
}

// Marshal is compact JSON plus "\n" (see Claim.Marshal).
func (d Done) Marshal() []byte {
	b := appendRecordHead(nil, d.Version, d.RequestSHA256, d.Request)
	b = append(b, `,"response":`...)
	b = appendRaw(b, d.Response)
	return append(b, "}\n"...)
}

func appendRecordHead(b []byte, version, sha string, request json.RawMessage) []byte {
	b = append(b, `{"version":`...)
	b = appendString(b, version)
	b = append(b, `,"request_sha256":`...)
	b = appendString(b, sha)
	b = append(b, `,"request":`...)
	return appendRaw(b, request)
}

// DecodeClaim decodes a claim record strictly and refuses a damaged one: its
// request must be a canonical frame carrying want's ids and hash to
// request_sha256.
func DecodeClaim(data []byte, want IDs) (Claim, error) {
	raw, err := decodeRecord(data, claimFields)
	if err != nil {
		return Claim{}, err
	}
	sha, req, err := recordRequest(raw, want)
	if err != nil {
		return Claim{}, err
	}
	return Claim{Version: Version, RequestSHA256: sha, Request: req}, nil
}

// DecodeDone decodes a done record strictly: as DecodeClaim, plus a
// response that DecodeResponse(want) accepts, in canonical form.
func DecodeDone(data []byte, want IDs) (Done, error) {
	raw, err := decodeRecord(data, doneFields)
	if err != nil {
		return Done{}, err
	}
	sha, req, err := recordRequest(raw, want)
	if err != nil {
		return Done{}, err
	}
	resp, err := compact(raw[fResponse], fResponse)
	if err != nil {
		return Done{}, err
	}
	if len(resp) == 0 || resp[0] != '{' {
		return Done{}, &Error{Field: fResponse, Rule: "must be a JSON object"}
	}
	r, err := DecodeResponse(resp, want)
	if err != nil {
		return Done{}, within(fResponse, err)
	}
	if canon := r.Bytes(); !bytes.Equal(canon[:len(canon)-1], resp) {
		return Done{}, &Error{Field: fResponse, Rule: "not in canonical form"}
	}
	return Done{Version: Version, RequestSHA256: sha, Request: req, Response: resp}, nil
}

func decodeRecord(data []byte, fields []string) (map[string]json.RawMessage, error) {
	if len(data) > MaxRecordBytes {
		return nil, fieldErr("", "larger than %d bytes", MaxRecordBytes)
	}
	// One level deeper than a frame: the record's own object.
	raw, err := decodeObject(data, fields, MaxDepth+1)
	if err != nil {
		return nil, err
	}
	v, err := str(raw, fVersion)
	if err != nil {
		return nil, err
	}
	if v != Version {
		return nil, &Error{Field: fVersion, Rule: "unsupported"}
	}
	return raw, nil
}

// recordRequest checks the record's request and request_sha256 fields and
// returns them (the request compacted).
func recordRequest(raw map[string]json.RawMessage, want IDs) (string, json.RawMessage, error) {
	sha, err := str(raw, fSHA)
	if err != nil {
		return "", nil, err
	}
	if !lowerHex64(sha) {
		return "", nil, &Error{Field: fSHA, Rule: "must be 64 lowercase hex digits"}
	}
	req, err := compact(raw[fRequest], fRequest)
	if err != nil {
		return "", nil, err
	}
	if len(req) == 0 || req[0] != '{' {
		return "", nil, &Error{Field: fRequest, Rule: "must be a JSON object"}
	}
	if Fingerprint(req) != sha {
		return "", nil, &Error{Field: fSHA, Rule: "does not match request"}
	}
	m, err := parseMessage(req, frameFields)
	if err != nil {
		return "", nil, within(fRequest, err)
	}
	if m.version != Version {
		return "", nil, &Error{Field: fRequest + "." + fVersion, Rule: "unsupported"}
	}
	if err := want.match(m.runID, m.leaseID, m.consumer, m.requestID); err != nil {
		return "", nil, within(fRequest, err)
	}
	// The runtime only ever stores Frame output; anything else is damage.
	if !bytes.Equal(appendCanonical(nil, m.version, m.runID, m.leaseID, m.consumer, m.requestID, m.payload), req) {
		return "", nil, &Error{Field: fRequest, Rule: "not in canonical form"}
	}
	return sha, req, nil
}

func lowerHex64(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
