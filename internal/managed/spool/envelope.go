package spool

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
)

// IDs are the identities a request and its response must carry.
type IDs struct{ RunID, LeaseID, Consumer, RequestID string }

// Envelope is a consumer's request.
type Envelope struct {
	Version, RunID, LeaseID, Consumer, RequestID, Capability string
	Payload                                                  json.RawMessage // compacted, opaque
}

var (
	envelopeFields = []string{fVersion, fRunID, fLeaseID, fConsumer, fRequestID, fCapability, fPayload}
	frameFields    = []string{fVersion, fRunID, fLeaseID, fConsumer, fRequestID, fPayload}
)

// message is the common shape of envelopes, frames and responses.
type message struct {
	version, runID, leaseID, consumer, requestID, capability string
	payload                                                  json.RawMessage
}

func (m *message) ids() IDs {
	return IDs{RunID: m.runID, LeaseID: m.leaseID, Consumer: m.consumer, RequestID: m.requestID}
}

// parseMessage decodes strictly; capability is read only when fields has it.
func parseMessage(data []byte, fields []string) (*message, error) {
	raw, err := decodeObject(data, fields, MaxDepth)
	if err != nil {
		return nil, err
	}
	m := &message{}
	for _, f := range []struct {
		name string
		dst  *string
	}{
		{fVersion, &m.version}, {fRunID, &m.runID}, {fLeaseID, &m.leaseID},
		{fConsumer, &m.consumer}, {fRequestID, &m.requestID}, {fCapability, &m.capability},
	} {
		if _, ok := raw[f.name]; !ok && f.name == fCapability {
			continue
		}
		if *f.dst, err = str(raw, f.name); err != nil {
			return nil, err
		}
	}
	if m.payload, err = compact(raw[fPayload], fPayload); err != nil {
		return nil, err
	}
	return m, nil
}

// DecodeEnvelope decodes a request file strictly (see the package's rules:
// UTF-8, size, exact fields once each, depth, nothing after the object).
// It also refuses a request_id that ValidRequestID refuses: such a request
// could never match its file name. It does not compare ids (see Check).
func DecodeEnvelope(data []byte) (*Envelope, error) {
	if len(data) > MaxRequestBytes {
		return nil, fieldErr("", "larger than %d bytes", MaxRequestBytes)
	}
	m, err := parseMessage(data, envelopeFields)
	if err != nil {
		return nil, err
	}
	if err := ValidRequestID(m.requestID); err != nil {
		return nil, err
	}
	return &Envelope{
		Version: m.version, RunID: m.runID, LeaseID: m.leaseID, Consumer: m.consumer,
		RequestID: m.requestID, Capability: m.capability, Payload: m.payload,
	}, nil
}

// Check compares the version and ids with want and the capability with
// capability in constant time. Digests are compared rather than the values
// so a length difference costs the same time as a content difference. An
// empty capability is refused: it would match an empty field.
func (e *Envelope) Check(want IDs, capability []byte) error {
	if e.Version != Version {
		return &Error{Field: fVersion, Rule: "unsupported"}
	}
	if err := want.match(e.RunID, e.LeaseID, e.Consumer, e.RequestID); err != nil {
		return err
	}
	if len(capability) == 0 {
		return &Error{Field: fCapability, Rule: "no capability to compare against"}
	}
	got, exp := sha256.Sum256([]byte(e.Capability)), sha256.Sum256(capability)
	if subtle.ConstantTimeCompare(got[:], exp[:]) != 1 {
		return &Error{Field: fCapability, Rule: "mismatch"}
	}
	return nil
}

// match names the first id that differs from want. Ids are not secret, so
// ordinary comparison is fine.
func (want IDs) match(runID, leaseID, consumer, requestID string) error {
	switch {
	case runID != want.RunID:
		return &Error{Field: fRunID, Rule: "mismatch"}
	case leaseID != want.LeaseID:
		return &Error{Field: fLeaseID, Rule: "mismatch"}
	case consumer != want.Consumer:
		return &Error{Field: fConsumer, Rule: "mismatch"}
	case requestID != want.RequestID:
		return &Error{Field: fRequestID, Rule: "mismatch"}
	}
	return nil
}

// Frame is the capability-free canonical request relayed to the endpoint
// and stored in records: compact JSON, fixed key order, no trailing newline.
// It is never longer than the request file it was decoded from.
func (e *Envelope) Frame() []byte {
	return appendCanonical(nil, e.Version, e.RunID, e.LeaseID, e.Consumer, e.RequestID, e.Payload)
}

// appendCanonical is the one encoding of frames and responses, so the same
// values always give the same bytes.
func appendCanonical(b []byte, version, runID, leaseID, consumer, requestID string, payload json.RawMessage) []byte {
	b = append(b, `{"version":`...)
	b = appendString(b, version)
	b = append(b, `,"run_id":`...)
	b = appendString(b, runID)
	b = append(b, `,"lease_id":`...)
	b = appendString(b, leaseID)
	b = append(b, `,"consumer":`...)
	b = appendString(b, consumer)
	b = append(b, `,"request_id":`...)
	b = appendString(b, requestID)
	b = append(b, `,"payload":`...)
	b = appendRaw(b, payload)
	return append(b, '}')
}

// Fingerprint is the lowercase hex SHA-256 of a frame.
func Fingerprint(frame []byte) string {
	sum := sha256.Sum256(frame)
	return hex.EncodeToString(sum[:])
}

// DecodeFrame decodes a relayed request frame, as an endpoint receives
// it, as strictly as a request file: at most MaxRequestBytes, exactly the
// fields version ("1"), run_id, lease_id, consumer, request_id and
// payload, the ids non-empty and the request id valid. It returns the ids
// and the compacted payload.
func DecodeFrame(data []byte) (IDs, json.RawMessage, error) {
	if len(data) > MaxRequestBytes {
		return IDs{}, nil, fieldErr("", "larger than %d bytes", MaxRequestBytes)
	}
	m, err := parseMessage(data, frameFields)
	if err != nil {
		return IDs{}, nil, err
	}
	if m.version != Version {
		return IDs{}, nil, &Error{Field: fVersion, Rule: "unsupported"}
	}
	for _, f := range []struct{ name, v string }{{fRunID, m.runID}, {fLeaseID, m.leaseID}, {fConsumer, m.consumer}} {
		if f.v == "" {
			return IDs{}, nil, &Error{Field: f.name, Rule: "empty"}
		}
	}
	if err := ValidRequestID(m.requestID); err != nil {
		return IDs{}, nil, err
	}
	return m.ids(), m.payload, nil
}
