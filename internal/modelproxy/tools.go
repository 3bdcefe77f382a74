package modelproxy

import (
	"bytes"
	"cmp"
	"encoding/json"
	"regexp"
	"strings"
)

// clientToolType matches the types of the Anthropic-defined tools whose
// calls the client runs itself, each with its version date (bash_20250124).
// With "custom" and no type at all (a tool of the client's own), they are
// the only tools passed: every other type is run by the provider.
var clientToolType = regexp.MustCompile(`^(bash|text_editor|computer|memory)_[0-9]{8}$`)

// providerRequestKeys are the top-level keys of a Messages request that
// have the provider reach out on its own: remote MCP servers, and the
// container code execution runs in (with its skills).
var providerRequestKeys = []string{"mcp_servers", "container"}

// maxToolNameInError bounds the tool type a refusal quotes back.
const maxToolNameInError = 64

// providerTool names the first thing in a Messages request that the
// provider would run on its own side, past the sandbox's egress rights
// (web search or fetch, code execution, remote MCP servers), or "" when
// there is none. As for max_tokens (outputCharge), a key counts in any
// case and every duplicate counts. ok is false when the body is not a
// JSON object this check can read: the upstream would refuse it anyway,
// and what cannot be checked is not forwarded.
func providerTool(request []byte) (name string, ok bool) {
	if !json.Valid(request) {
		return "", false
	}
	dec := json.NewDecoder(bytes.NewReader(request))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return "", false
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return "", false
		}
		key, _ := t.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return "", false
		}
		switch {
		case containsFold(providerRequestKeys, key) && string(v) != "null":
			return key, true
		case strings.EqualFold(key, "tools"):
			var tools []json.RawMessage
			if json.Unmarshal(v, &tools) != nil {
				continue // not a list: the upstream refuses it
			}
			for _, tool := range tools {
				if t := providerToolType(tool); t != "" {
					return t, true
				}
			}
		}
	}
	return "", true
}

// providerToolType is the type of a tool definition the provider runs,
// or "" for a client tool. Every key that is "type" in any case counts;
// a type that is not a string is the provider's to read, so it counts
// as one.
func providerToolType(tool []byte) string {
	dec := json.NewDecoder(bytes.NewReader(tool))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return "" // not an object: the upstream refuses it
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return "?"
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return "?"
		}
		if key, _ := t.(string); !strings.EqualFold(key, "type") {
			continue
		}
		var typ string
		if json.Unmarshal(v, &typ) != nil {
			return "?"
		}
		if typ != "custom" && !clientToolType.MatchString(typ) {
			if len(typ) > maxToolNameInError {
				typ = strings.ToValidUTF8(typ[:maxToolNameInError], "") + "..."
			}
			return cmp.Or(typ, "?")
		}
	}
	return ""
}
