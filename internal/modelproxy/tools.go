package modelproxy

import (
	"encoding/json"
	"regexp"
	"slices"
	"strconv"
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

// urlSource is what a refusal names for a content block whose source is
// a URL: the provider fetches it.
const urlSource = `a source of type "url"`

// maxToolNameInError bounds the tool type a refusal quotes back.
const maxToolNameInError = 64

// providerTool describes the first thing in a Messages request that the
// provider would fetch or run on its own side, past the sandbox's egress
// rights, or "" when there is none: a tool that is not the client's (web
// search or fetch, code execution), a top-level providerRequestKeys key
// (remote MCP servers), or anywhere in it an object typed "url" (an image
// or document the provider fetches from an address). As for max_tokens
// (outputCharge), a key counts in any case and every duplicate counts: an
// upstream's parser may read either. ok is false when the body is not
// one JSON object: the upstream would refuse it anyway, and what cannot
// be checked is not forwarded.
func providerTool(request []byte) (name string, ok bool) {
	if !json.Valid(request) {
		return "", false
	}
	s := scanner{data: request}
	// One frame per open object or array. In an object, key is the raw key
	// whose value comes next (nil while a key is expected).
	type frame struct {
		object   bool
		key      []byte
		expected bool // a key comes next
	}
	var stack []frame
	// The value of the current key is complete: the frame expects a key.
	done := func() {
		if n := len(stack); n > 0 && stack[n-1].object {
			stack[n-1].expected, stack[n-1].key = true, nil
		}
	}
	// inTool reports whether the current frame is an element of the
	// top-level tools list.
	inTool := func() bool {
		return len(stack) == 3 && stack[2].object && !stack[1].object && foldIs(stack[0].key, "tools")
	}
	for {
		kind, raw := s.next()
		if kind == tokEnd {
			return "", len(stack) == 0
		}
		if len(stack) == 0 && kind != tokObject {
			return "", false // not one object
		}
		n := len(stack)
		var top *frame
		if n > 0 {
			top = &stack[n-1]
		}
		if top != nil && top.object && top.expected {
			if kind == tokObjectEnd {
				stack = stack[:n-1]
				done()
				continue
			}
			top.key = raw // valid JSON: a key is a string
			top.expected = false
			continue
		}
		// A value (or the end of an array) of top.key, or the whole body.
		var key []byte
		if top != nil && top.object {
			key = top.key
		}
		if n == 1 && kind != tokNull && slices.ContainsFunc(providerRequestKeys, func(k string) bool { return foldIs(key, k) }) {
			return strconv.Quote(decodeString(key)), true
		}
		if inTool() && foldIs(key, "type") {
			typ := ""
			if kind == tokString {
				typ = decodeString(raw)
			}
			if kind != tokString || typ != "custom" && !clientToolType.MatchString(typ) {
				return "tool type " + strconv.Quote(shorten(typ)), true
			}
		}
		switch kind {
		case tokObject:
			stack = append(stack, frame{object: true, expected: true})
		case tokArray:
			stack = append(stack, frame{})
		case tokArrayEnd:
			stack = stack[:n-1]
			done()
		case tokString:
			if foldIs(key, "type") && foldIs(raw, "url") {
				return urlSource, true
			}
			done()
		default:
			done()
		}
	}
}

// shorten is a tool type fit to quote back: at most maxToolNameInError
// bytes, "?" for none.
func shorten(typ string) string {
	if typ == "" {
		return "?"
	}
	if len(typ) > maxToolNameInError {
		return strings.ToValidUTF8(typ[:maxToolNameInError], "") + "..."
	}
	return typ
}
