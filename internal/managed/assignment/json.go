package assignment

// A strict JSON reader: the document becomes a small tree first, so that
// duplicate keys (which encoding/json silently resolves to the last one) are
// refused at every level, trailing data is refused, and every error names a
// location instead of echoing the offending text (encoding/json's messages
// quote characters and numbers from the input).

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"
)

type jsonKind uint8

const (
	kindNull jsonKind = iota + 1
	kindBool
	kindNumber
	kindString
	kindArray
	kindObject
)

func (k jsonKind) String() string {
	switch k {
	case kindNull:
		return "null"
	case kindBool:
		return "a boolean"
	case kindNumber:
		return "a number"
	case kindString:
		return "a string"
	case kindArray:
		return "an array"
	case kindObject:
		return "an object"
	}
	return "unknown"
}

type jsonNode struct {
	kind jsonKind
	str  string // string value, or the literal text of a number
	arr  []*jsonNode
	obj  []jsonMember
}

type jsonMember struct {
	key string
	val *jsonNode
}

// parseJSON reads exactly one JSON value from data.
func parseJSON(data []byte) (*jsonNode, error) {
	if len(data) > MaxAssignmentBytes {
		return nil, Errorf("", "document is larger than %d bytes", MaxAssignmentBytes)
	}
	if !utf8.Valid(data) {
		return nil, Errorf("", "document is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	tok, err := dec.Token()
	if errors.Is(err, io.EOF) {
		return nil, Errorf("", "document is empty")
	}
	if err != nil {
		return nil, malformed(dec)
	}
	n, err := parseValue(dec, tok, "", 1)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, Errorf("", "data after the JSON document (byte %d)", dec.InputOffset())
	}
	return n, nil
}

func malformed(dec *json.Decoder) error {
	return Errorf("", "malformed JSON near byte %d", dec.InputOffset())
}

func parseValue(dec *json.Decoder, tok json.Token, path string, depth int) (*jsonNode, error) {
	switch t := tok.(type) {
	case nil:
		return &jsonNode{kind: kindNull}, nil
	case bool:
		return &jsonNode{kind: kindBool}, nil
	case json.Number:
		return &jsonNode{kind: kindNumber, str: string(t)}, nil
	case string:
		return &jsonNode{kind: kindString, str: t}, nil
	case json.Delim:
		if depth > MaxJSONDepth {
			return nil, Errorf(path, "nesting deeper than %d levels", MaxJSONDepth)
		}
		switch t {
		case '{':
			return parseObject(dec, path, depth)
		case '[':
			return parseArray(dec, path, depth)
		}
	}
	return nil, malformed(dec)
}

func parseObject(dec *json.Decoder, path string, depth int) (*jsonNode, error) {
	n := &jsonNode{kind: kindObject}
	seen := map[string]bool{}
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil, malformed(dec)
		}
		if d, ok := tok.(json.Delim); ok && d == '}' {
			return n, nil
		}
		key, ok := tok.(string)
		if !ok {
			return nil, malformed(dec)
		}
		if seen[key] {
			// The key is not echoed: a misplaced secret may be a key.
			return nil, Errorf(path, "duplicate key (member %d)", len(n.obj)+1)
		}
		seen[key] = true
		vtok, err := dec.Token()
		if err != nil {
			return nil, malformed(dec)
		}
		val, err := parseValue(dec, vtok, memberPath(path, key, len(n.obj)+1), depth+1)
		if err != nil {
			return nil, err
		}
		n.obj = append(n.obj, jsonMember{key: key, val: val})
	}
}

func parseArray(dec *json.Decoder, path string, depth int) (*jsonNode, error) {
	n := &jsonNode{kind: kindArray}
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil, malformed(dec)
		}
		if d, ok := tok.(json.Delim); ok && d == ']' {
			return n, nil
		}
		val, err := parseValue(dec, tok, index(path, len(n.arr)), depth+1)
		if err != nil {
			return nil, err
		}
		n.arr = append(n.arr, val)
	}
}

// memberPath names a member in error locations: schema-looking keys by
// name, anything else by position, so a location never carries a value.
func memberPath(parent, key string, pos int) string {
	if isSchemaKey(key) {
		return field(parent, key)
	}
	return field(parent, "(member "+strconv.Itoa(pos)+")")
}

// isSchemaKey reports whether key has the shape of this schema's field
// names: lowercase letters and underscores, at most 32 bytes.
func isSchemaKey(key string) bool {
	if key == "" || len(key) > 32 {
		return false
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if (c < 'a' || c > 'z') && c != '_' {
			return false
		}
	}
	return true
}

// object is a reader over one JSON object that records which members the
// schema consumed, so that every other member is refused.
type object struct {
	path  string
	n     *jsonNode
	used  []bool
	asked []string // the member names the schema read, for messages
}

func asObject(n *jsonNode, path string) (*object, error) {
	if n.kind != kindObject {
		return nil, Errorf(path, "must be an object, not %s", n.kind)
	}
	return &object{path: path, n: n, used: make([]bool, len(n.obj))}, nil
}

// get returns the member named key, or nil when it is absent.
func (o *object) get(key string) *jsonNode {
	o.asked = append(o.asked, key)
	for i, m := range o.n.obj {
		if m.key == key {
			o.used[i] = true
			return m.val
		}
	}
	return nil
}

// unknown refuses the first member the schema did not consume.
func (o *object) unknown() error {
	for i, u := range o.used {
		if !u {
			return Errorf(o.path, "unknown field (member %d); the fields defined here are %s", i+1, strings.Join(o.asked, ", "))
		}
	}
	return nil
}

// Typed accessors. required=false treats an absent member and a JSON null
// alike as "not set" (the reference's optional fields accept null).

func (o *object) str(key string, required bool) (string, bool, error) {
	n := o.get(key)
	p := field(o.path, key)
	if n == nil || (n.kind == kindNull && !required) {
		if required {
			return "", false, Errorf(p, "is required")
		}
		return "", false, nil
	}
	if n.kind != kindString {
		return "", false, Errorf(p, "must be a string, not %s", n.kind)
	}
	if !required && n.str == "" {
		return "", false, Errorf(p, "must not be empty (omit the field instead)")
	}
	return n.str, true, nil
}

func (o *object) uint(key string, required bool, max uint64) (uint64, bool, error) {
	n := o.get(key)
	p := field(o.path, key)
	if n == nil || (n.kind == kindNull && !required) {
		if required {
			return 0, false, Errorf(p, "is required")
		}
		return 0, false, nil
	}
	v, err := uintValue(n, p, max)
	return v, err == nil, err
}

func uintValue(n *jsonNode, p string, max uint64) (uint64, error) {
	if n.kind != kindNumber {
		return 0, Errorf(p, "must be an integer, not %s", n.kind)
	}
	s := n.str
	if s == "" || (len(s) > 1 && s[0] == '0') {
		return 0, Errorf(p, "must be a non-negative integer without leading zeros")
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, Errorf(p, "must be a non-negative integer (no sign, fraction or exponent)")
		}
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil || v > max {
		return 0, Errorf(p, "must be at most %d", max)
	}
	return v, nil
}

func (o *object) array(key string) ([]*jsonNode, bool, error) {
	n := o.get(key)
	p := field(o.path, key)
	if n == nil {
		return nil, false, nil
	}
	if n.kind != kindArray {
		return nil, false, Errorf(p, "must be an array, not %s", n.kind)
	}
	return n.arr, true, nil
}

func (o *object) strArray(key string) ([]string, bool, error) {
	arr, ok, err := o.array(key)
	if err != nil || !ok {
		return nil, ok, err
	}
	out := make([]string, 0, len(arr))
	for i, n := range arr {
		if n.kind != kindString {
			return nil, false, Errorf(index(field(o.path, key), i), "must be a string, not %s", n.kind)
		}
		out = append(out, n.str)
	}
	return out, true, nil
}

func (o *object) child(key string, required bool) (*object, error) {
	n := o.get(key)
	p := field(o.path, key)
	if n == nil || (n.kind == kindNull && !required) {
		if required {
			return nil, Errorf(p, "is required")
		}
		return nil, nil
	}
	return asObject(n, p)
}
