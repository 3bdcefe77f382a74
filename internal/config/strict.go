package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"agentbox/internal/untrusted"
)

// Error is a config error that names the key path ("agents.claude.comand")
// and the line it was found on (0 when the error is not about one line).
type Error struct {
	Path string
	Line int
	Msg  string
}

// Error is the message, printable: a path names the repository's keys
// (join bounds each one), and the message goes to the host's terminal.
func (e *Error) Error() string {
	s := untrusted.Printable(e.Msg)
	if e.Path != "" {
		s = bounded(e.Path, maxShownPathLen) + ": " + s
	}
	if e.Line > 0 {
		s += " (line " + strconv.Itoa(e.Line) + ")"
	}
	return s
}

func errAt(path string, n *yaml.Node, format string, args ...any) *Error {
	line := 0
	if n != nil {
		line = n.Line
	}
	return &Error{Path: path, Line: line, Msg: fmt.Sprintf(format, args...)}
}

// join is the path of key under path, for a message: the key is a
// mapping key of the file, so it is shown bounded and printable (a key
// may hold any character, "\e" included, and be any length).
func join(path, key string) string {
	key = shown(key)
	if path == "" {
		return key
	}
	return path + "." + key
}

// decodeDocument decodes data as exactly one YAML document into a node
// tree; empty input (or only comments) is nil.
func decodeDocument(data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, &Error{Msg: "invalid YAML: " + err.Error()}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, &Error{Msg: "more than one YAML document"}
	}
	return &doc, nil
}

// yamlChecker is a type whose YAML form is not its Go form (sizes with
// units): checkNode hands its node to checkYAML instead of walking it.
type yamlChecker interface {
	checkYAML(n *yaml.Node, path string) error
}

var yamlCheckerType = reflect.TypeFor[yamlChecker]()

// checkNode walks n against the Go type t before yaml decodes it, so every
// unknown key, duplicate key and wrong kind is reported with its path.
func checkNode(n *yaml.Node, t reflect.Type, path string) error {
	for n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = n.Content[0]
	}
	if n.Kind == yaml.AliasNode {
		return errAt(path, n, "YAML aliases are not supported")
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if reflect.PointerTo(t).Implements(yamlCheckerType) {
		return reflect.New(t).Interface().(yamlChecker).checkYAML(n, path)
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return errAt(path, n, "must be a mapping")
		}
		fields := yamlFields(t)
		return eachPair(n, path, func(key string, k, v *yaml.Node) error {
			ft, ok := fields[key]
			if !ok {
				return errAt(join(path, key), k, "unknown key")
			}
			return checkNode(v, ft, join(path, key))
		})
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return errAt(path, n, "must be a mapping")
		}
		return eachPair(n, path, func(key string, _, v *yaml.Node) error {
			return checkNode(v, t.Elem(), join(path, key))
		})
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return errAt(path, n, "must be a list")
		}
		for i, item := range n.Content {
			if err := checkNode(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case reflect.Bool:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
			return errAt(path, n, "must be true or false")
		}
	case reflect.Int:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
			return errAt(path, n, "must be an integer")
		}
	case reflect.String:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
			return errAt(path, n, "must be a string (quote it)")
		}
	}
	return nil
}

// eachPair calls fn for each key of a mapping, refusing duplicate and
// non-string keys.
func eachPair(n *yaml.Node, path string, fn func(key string, k, v *yaml.Node) error) error {
	seen := make(map[string]bool, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return errAt(path, k, "keys must be plain strings")
		}
		if seen[k.Value] {
			return errAt(join(path, k.Value), k, "duplicate key")
		}
		seen[k.Value] = true
		if err := fn(k.Value, k, v); err != nil {
			return err
		}
	}
	return nil
}

// yamlFields maps a struct's YAML key names to field types; fields tagged
// "-" are not keys.
func yamlFields(t reflect.Type) map[string]reflect.Type {
	out := make(map[string]reflect.Type, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = f.Type
	}
	return out
}
