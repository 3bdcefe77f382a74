package modelproxy

import (
	"bytes"
	"encoding/json"
	"io"
	"strconv"
	"strings"
)

// The checks as they were written on encoding/json's Decoder, before the
// scanner (jsonscan.go): the fuzz targets hold the two to the same answer
// for every body.

// providerToolDecoder is providerTool on encoding/json's Decoder.
func providerToolDecoder(request []byte) (name string, ok bool) {
	if !json.Valid(request) {
		return "", false
	}
	dec := json.NewDecoder(bytes.NewReader(request))
	dec.UseNumber()
	// One frame per open object or array. In an object, key is the key
	// whose value comes next ("" while a key is expected).
	type frame struct {
		object   bool
		key      string
		expected bool // a key comes next
	}
	var stack []frame
	// The value of the current key is complete: the frame expects a key.
	done := func() {
		if n := len(stack); n > 0 && stack[n-1].object {
			stack[n-1].expected, stack[n-1].key = true, ""
		}
	}
	// inTool reports whether the current frame is an element of the
	// top-level tools list.
	inTool := func() bool {
		return len(stack) == 3 && stack[2].object && !stack[1].object && strings.EqualFold(stack[0].key, "tools")
	}
	for {
		t, err := dec.Token()
		if err == io.EOF {
			return "", len(stack) == 0
		}
		if err != nil {
			return "", false
		}
		if len(stack) == 0 && t != json.Delim('{') {
			return "", false // not one object
		}
		n := len(stack)
		var top *frame
		if n > 0 {
			top = &stack[n-1]
		}
		if top != nil && top.object && top.expected {
			if d, isDelim := t.(json.Delim); isDelim && d == '}' {
				stack = stack[:n-1]
				done()
				continue
			}
			top.key, _ = t.(string) // valid JSON: a key is a string
			top.expected = false
			continue
		}
		// A value (or the end of an array) of top.key, or the whole body.
		key := ""
		if top != nil && top.object {
			key = top.key
		}
		if n == 1 && containsFold(providerRequestKeys, key) && t != nil {
			return strconv.Quote(key), true
		}
		if inTool() && strings.EqualFold(key, "type") {
			typ, isString := t.(string)
			if !isString || typ != "custom" && !clientToolType.MatchString(typ) {
				return "tool type " + strconv.Quote(shorten(typ)), true
			}
		}
		switch v := t.(type) {
		case json.Delim:
			switch v {
			case '{':
				stack = append(stack, frame{object: true, expected: true})
			case '[':
				stack = append(stack, frame{})
			case ']':
				stack = stack[:n-1]
				done()
			}
		case string:
			if strings.EqualFold(key, "type") && strings.EqualFold(v, "url") {
				return urlSource, true
			}
			done()
		default:
			done()
		}
	}
}

// outputChargeDecoder is outputCharge on encoding/json's Decoder.
func outputChargeDecoder(request []byte) int64 {
	if !json.Valid(request) {
		return UnknownMaxTokens
	}
	dec := json.NewDecoder(bytes.NewReader(request))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return UnknownMaxTokens
	}
	var charge int64
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return UnknownMaxTokens
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return UnknownMaxTokens
		}
		if key, _ := t.(string); !strings.EqualFold(key, "max_tokens") {
			continue
		}
		var n int64
		if json.Unmarshal(v, &n) != nil || n <= 0 {
			n = UnknownMaxTokens
		}
		charge = max(charge, min(n, maxChargedTokens))
	}
	if charge == 0 {
		return UnknownMaxTokens
	}
	return charge
}
