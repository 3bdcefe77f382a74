package modelproxy

import (
	"bytes"
	"encoding/json"
)

// maxEventLine bounds one server-sent event line kept for usage: a longer
// line (a huge text delta) is passed on but not parsed. Usage rides on
// message_start and message_delta, which are short.
const maxEventLine = 1 << 20

// usageMeter reads a response's usage as it passes: the whole body of a
// plain response, or the data lines of a stream's message_start
// (input, cache and first output tokens) and message_delta (output so
// far, and input when the API restates it).
type usageMeter struct {
	u       Usage
	event   string // the current event's name, from its "event:" line
	line    []byte
	skip    bool // the current line went over maxEventLine
	body    bytes.Buffer
	bodyCut bool
	// final: the response's final output tokens were read (a plain
	// body's usage, or a stream's message_delta).
	final bool
}

func (m *usageMeter) usage() Usage { return m.u }

// UnknownMaxTokens is the output charged for a response cut short (see
// outputCharge) whose request names no usable max_tokens: the most any
// current model may write in one answer.
const UnknownMaxTokens = 128_000

// maxChargedTokens bounds the max_tokens charged and reserved: no model
// writes more in one answer (the upstream refuses a larger max_tokens),
// so a request naming 2⁴⁰ neither held its tree's whole budget while in
// flight nor, hung up once the upstream had it, charged the tree 2⁴⁰.
const maxChargedTokens = UnknownMaxTokens

// outputCharge is the output charged for a response that ended before
// its final usage (a stream before message_delta, a body whose usage was
// not read), and reserved for a request in flight: the request's
// max_tokens, the most the upstream may have written, since hanging up
// just before the usage must not make an answer cheap. Every top-level key
// that is max_tokens in any case, and every duplicate, counts, the largest
// winning: an upstream reads the exact key (the first or the last of
// duplicates, by its parser), while Go's decoder takes any case and the
// last, so a request saying both "max_tokens": 64000 and "Max_Tokens": 1
// was charged 1. One that is unusable counts as UnknownMaxTokens, and so
// does a body with none.
// BytesPerInputToken is how many bytes of a Messages request's body
// count as one input token when its answer never said what its input
// was (the client hung up before the answer, or before a stream's
// message_start): the upstream read, and bills, the whole prompt, so a
// request cut short must not make its input free. English text runs
// near four bytes a token.
const BytesPerInputToken = 4

// inputCharge is the input a request of body is charged when its answer
// reported none.
func inputCharge(body []byte) int64 {
	return (int64(len(body)) + BytesPerInputToken - 1) / BytesPerInputToken
}

func outputCharge(request []byte) int64 {
	if !json.Valid(request) {
		return UnknownMaxTokens
	}
	s := scanner{data: request}
	if k, _ := s.next(); k != tokObject {
		return UnknownMaxTokens
	}
	var charge int64
	for {
		k, key := s.next()
		if k != tokString {
			break // the object's end
		}
		vk, v := s.next()
		s.skip(vk)
		if !foldIs(key, "max_tokens") {
			continue
		}
		var n int64
		if vk != tokScalar || json.Unmarshal(v, &n) != nil || n <= 0 {
			n = UnknownMaxTokens
		}
		charge = max(charge, min(n, maxChargedTokens))
	}
	if charge == 0 {
		return UnknownMaxTokens
	}
	return charge
}

// apiUsage is the API's usage object.
type apiUsage struct {
	InputTokens              *int64 `json:"input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
	CacheReadInputTokens     *int64 `json:"cache_read_input_tokens"`
	CacheCreationInputTokens *int64 `json:"cache_creation_input_tokens"`
}

// apply takes the figures a usage object states; absent ones stay.
func (m *usageMeter) apply(a *apiUsage) {
	if a == nil {
		return
	}
	set := func(dst *int64, v *int64) {
		if v != nil && *v >= 0 {
			*dst = *v
		}
	}
	set(&m.u.InputTokens, a.InputTokens)
	set(&m.u.OutputTokens, a.OutputTokens)
	set(&m.u.CacheReadInputTokens, a.CacheReadInputTokens)
	set(&m.u.CacheCreationInputTokens, a.CacheCreationInputTokens)
}

// feedBody keeps a plain response's body, up to maxUsageBody.
func (m *usageMeter) feedBody(p []byte) {
	if m.bodyCut {
		return
	}
	if m.body.Len()+len(p) > maxUsageBody {
		m.bodyCut = true
		m.body.Reset()
		return
	}
	m.body.Write(p)
}

// endBody reads the usage of a plain response.
func (m *usageMeter) endBody() {
	if m.bodyCut {
		return
	}
	var msg struct {
		Usage *apiUsage `json:"usage"`
	}
	if json.Unmarshal(m.body.Bytes(), &msg) == nil {
		m.apply(msg.Usage)
		m.final = msg.Usage != nil && msg.Usage.OutputTokens != nil
	}
	m.body.Reset()
}

// feedStream splits a stream into lines and reads each data line.
func (m *usageMeter) feedStream(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			m.appendLine(p)
			return
		}
		m.appendLine(p[:i])
		if !m.skip {
			m.readLine(bytes.TrimSuffix(m.line, []byte("\r")))
		}
		m.line, m.skip = m.line[:0], false
		p = p[i+1:]
	}
}

func (m *usageMeter) appendLine(p []byte) {
	if m.skip {
		return
	}
	if len(m.line)+len(p) > maxEventLine {
		m.skip, m.line = true, m.line[:0]
		return
	}
	m.line = append(m.line, p...)
}

// readLine reads one line of a stream: only data lines of message_start and
// message_delta events carry usage. The event's name line, when the
// stream has one, saves parsing the others (text deltas are most of a
// stream); without one, only data naming a message event is parsed.
func (m *usageMeter) readLine(line []byte) {
	if len(line) == 0 {
		m.event = ""
		return
	}
	if name, ok := bytes.CutPrefix(line, []byte("event:")); ok {
		m.event = string(bytes.TrimSpace(name))
		return
	}
	data, ok := bytes.CutPrefix(line, []byte("data:"))
	switch {
	case !ok:
		return
	case m.event != "" && m.event != "message_start" && m.event != "message_delta":
		return
	case m.event == "" && !bytes.Contains(data, []byte(`"message_`)):
		return
	}
	var ev struct {
		Type    string `json:"type"`
		Message *struct {
			Usage *apiUsage `json:"usage"`
		} `json:"message"`
		Usage *apiUsage `json:"usage"`
	}
	if json.Unmarshal(bytes.TrimSpace(data), &ev) != nil {
		return
	}
	switch ev.Type {
	case "message_start":
		if ev.Message != nil {
			m.apply(ev.Message.Usage)
		}
	case "message_delta":
		m.apply(ev.Usage)
		if ev.Usage != nil && ev.Usage.OutputTokens != nil {
			m.final = true
		}
	}
}
