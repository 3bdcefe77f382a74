package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strconv"
)

// object is one JSON object read strictly: duplicate keys refused, keys in
// document order, every value kept raw until a field accessor reads it.
type object struct {
	path   string // "" for the manifest, else e.g. "runner"
	keys   []string
	fields map[string]json.RawMessage
}

var errNotObject = errors.New("not an object")

// parseObject reads raw as one JSON object with nothing after it.
func parseObject(raw []byte, path string) (*object, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, refuse("manifest is not valid JSON")
	}
	if tok != json.Delim('{') {
		return nil, errNotObject
	}
	o := &object{path: path, fields: map[string]json.RawMessage{}}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, refuse("manifest is not valid JSON")
		}
		key := tok.(string) // inside an object the decoder only yields string keys
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, refuse("manifest is not valid JSON")
		}
		if _, dup := o.fields[key]; dup {
			return nil, refuse("duplicate key `%s`", o.name(key))
		}
		o.keys = append(o.keys, key)
		o.fields[key] = v
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return nil, refuse("manifest is not valid JSON")
	}
	if _, err := dec.Token(); err != io.EOF {
		if err == nil {
			return nil, refuse("trailing data after the manifest")
		}
		return nil, refuse("manifest is not valid JSON")
	}
	return o, nil
}

// child reads key as a nested object; absent or null gives nil.
func (o *object) child(key string) (*object, error) {
	raw, ok := o.fields[key]
	if !ok || isNull(raw) {
		return nil, nil
	}
	c, err := parseObject(raw, o.name(key))
	if errors.Is(err, errNotObject) {
		return nil, refuse("`%s` must be an object", o.name(key))
	}
	return c, err
}

// name is the dotted name of key for details ("runner.model").
func (o *object) name(key string) string {
	if o.path == "" {
		return shown(key)
	}
	return o.path + "." + shown(key)
}

// allow refuses the first key (in document order) not in allowed.
func (o *object) allow(allowed ...string) error {
	for _, k := range o.keys {
		if !slices.Contains(allowed, k) {
			return refuse("unknown key `%s`", o.name(k))
		}
	}
	return nil
}

func (o *object) has(key string) bool { _, ok := o.fields[key]; return ok }

func (o *object) null(key string) bool {
	raw, ok := o.fields[key]
	return ok && isNull(raw)
}

// present reports whether key is set to something other than null.
func (o *object) present(key string) bool { return o.has(key) && !o.null(key) }

func isNull(raw json.RawMessage) bool { return string(raw) == "null" }

// str reads an optional string; absent and null give ok=false.
func (o *object) str(key string) (s string, ok bool, err error) {
	if !o.present(key) {
		return "", false, nil
	}
	if err := json.Unmarshal(o.fields[key], &s); err != nil {
		return "", false, refuse("`%s` must be a string", o.name(key))
	}
	return s, true, nil
}

// reqStr reads a required string.
func (o *object) reqStr(key string) (string, error) {
	s, ok, err := o.str(key)
	if err != nil {
		return "", err
	}
	if !ok {
		return "", refuse("`%s` is required", o.name(key))
	}
	return s, nil
}

// boolean reads an optional true/false; absent and null are false.
func (o *object) boolean(key string) (bool, error) {
	if !o.present(key) {
		return false, nil
	}
	switch string(o.fields[key]) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, refuse("`%s` must be true or false", o.name(key))
}

// strList reads an optional list of strings; absent and null give nil,
// [] gives an empty, non-nil slice.
func (o *object) strList(key string) ([]string, error) {
	if !o.present(key) {
		return nil, nil
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(o.fields[key], &raw); err != nil {
		return nil, refuse("`%s` must be a list of strings", o.name(key))
	}
	out := make([]string, 0, len(raw))
	for _, r := range raw {
		var s string
		if err := json.Unmarshal(r, &s); err != nil {
			return nil, refuse("`%s` must be a list of strings", o.name(key))
		}
		out = append(out, s)
	}
	return out, nil
}

// list reads an optional JSON list, its items kept raw; absent and null
// give nil.
func (o *object) list(key string) ([]json.RawMessage, error) {
	if !o.present(key) {
		return nil, nil
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(o.fields[key], &raw); err != nil {
		return nil, refuse("`%s` must be a list", o.name(key))
	}
	return raw, nil
}

// integer reads an optional JSON integer literal (no fraction, no
// exponent) in [0, limit]; absent and null give ok=false. The error text
// is given by the caller.
func (o *object) integer(key string, limit int64) (n int64, ok bool, bad bool) {
	if !o.present(key) {
		return 0, false, false
	}
	n, err := strconv.ParseInt(string(o.fields[key]), 10, 64)
	if err != nil || n < 0 || n > limit {
		return 0, false, true
	}
	return n, true, false
}
