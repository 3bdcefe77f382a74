// Package grant holds the orchestration grant document, the repository's
// cap on it, the rights rule and timed-grant TTLs. It is pure: no I/O and
// no clock.
//
// API:
//
//	Parse(data []byte) (Grant, error)         strict grant document decoding
//	Default() Grant                           the grant of a fresh orchestrator
//	(Grant) Capped(Cap) Grant                 the effective grant under a repo cap
//	(Grant) Has(op string) bool               is a manifest type's operation granted
//	CheckRights(effective Grant, repo Cap, r Rights) error   the rights rule
//	ParseTTL(s string) (time.Duration, bool, error)          a rights grant's "for"
//	(Runner) Check(prefix string) error       runner syntax (agent/profile/model)
//
// Errors from Parse name the failing field; errors from CheckRights,
// ParseTTL and Runner.Check are refusal details meant for the requester.
package grant

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
)

// Version is the only grant document version.
const Version = 1

// Operation names. An operation is named after the manifest type it allows;
// update is allowed by OpImport (spec: "The import grant operation permits
// update").
const (
	OpSpawn   = "spawn"
	OpMessage = "message"
	OpImport  = "import"
	OpRestart = "restart"
	OpRefresh = "refresh"
	OpStop    = "stop"
	OpDestroy = "destroy"
	OpRights  = "rights"
	OpPublish = "publish"
)

// Operations lists every operation a grant may hold, sorted.
var Operations = []string{OpDestroy, OpImport, OpMessage, OpPublish, OpRefresh, OpRestart, OpRights, OpSpawn, OpStop}

// alwaysGranted are present in every grant (spec: "spawn and message are
// always present").
var alwaysGranted = []string{OpMessage, OpSpawn}

// ValidOperation reports whether op is a known operation name.
func ValidOperation(op string) bool { return slices.Contains(Operations, op) }

// Default runner sources (spec: container, local, repo, or global).
var RunnerSources = []string{"container", "local", "repo", "global"}

// Grant is the orchestration grant document, exactly the spec's schema.
// DefaultRunner and DefaultRunnerSource are null when no runner default is
// configured; they are a preference, not a right.
type Grant struct {
	Version             int      `json:"version"`
	MaxRunningChildren  int      `json:"max_running_children"`
	Operations          []string `json:"operations"`
	Grantable           Rights   `json:"grantable"`
	DefaultRunner       *Runner  `json:"default_runner"`
	DefaultRunnerSource *string  `json:"default_runner_source"`
	// Publish is absent from grants stored before publish rights existed,
	// and from any grant that gives none: omitted, it grants nothing.
	Publish *Publish `json:"publish,omitempty"`
}

// DefaultMaxRunningChildren is the running-children slot count of Default.
const DefaultMaxRunningChildren = 2

// Default returns the grant a new orchestrator gets: two running children,
// every operation but refresh and publish, nothing grantable, no default
// runner. (Refresh is never added to a grant by itself: "re-grant to allow
// refresh"; publish rights are granted explicitly.)
func Default() Grant {
	return Grant{
		Version:            Version,
		MaxRunningChildren: DefaultMaxRunningChildren,
		Operations:         []string{OpDestroy, OpImport, OpMessage, OpRestart, OpRights, OpSpawn, OpStop},
		Grantable:          Rights{Mounts: []string{}, Egress: []string{}},
	}
}

// Has reports whether the grant holds operation op.
func (g Grant) Has(op string) bool { return slices.Contains(g.Operations, op) }

// Cap is the repository's cap on every grant in it
// (.jailbee/config.yaml orchestration.cap). A nil field caps nothing.
type Cap struct {
	MaxRunningChildren *int     `yaml:"max_running_children" json:"max_running_children,omitempty"`
	Operations         []string `yaml:"operations" json:"operations,omitempty"`
	Mounts             []string `yaml:"mounts" json:"mounts,omitempty"`
	Loose              *bool    `yaml:"loose" json:"loose,omitempty"`
	Egress             []string `yaml:"egress" json:"egress,omitempty"`
	Publish            *Publish `yaml:"publish" json:"publish,omitempty"`
}

// Capped returns the effective grant: g with everything the cap does not
// allow removed. spawn and message stay; an egress entry stays only when a
// cap entry covers it. Capping twice changes nothing.
func (g Grant) Capped(c Cap) Grant {
	out := g
	if c.MaxRunningChildren != nil && *c.MaxRunningChildren < out.MaxRunningChildren {
		out.MaxRunningChildren = max(*c.MaxRunningChildren, 0)
	}
	out.Operations = slices.Clone(g.Operations)
	if c.Operations != nil {
		out.Operations = slices.DeleteFunc(out.Operations, func(op string) bool {
			return !slices.Contains(c.Operations, op) && !slices.Contains(alwaysGranted, op)
		})
	}
	out.Grantable = Rights{Mounts: slices.Clone(g.Grantable.Mounts), Loose: g.Grantable.Loose, Egress: slices.Clone(g.Grantable.Egress)}
	if c.Mounts != nil {
		out.Grantable.Mounts = slices.DeleteFunc(out.Grantable.Mounts, func(m string) bool { return !slices.Contains(c.Mounts, m) })
	}
	if c.Loose != nil && !*c.Loose {
		out.Grantable.Loose = false
	}
	if c.Egress != nil {
		out.Grantable.Egress = slices.DeleteFunc(out.Grantable.Egress, func(h string) bool { return !coveredByAny(c.Egress, h) })
	}
	out.Publish = g.Publish.capped(c.Publish)
	if out.Grantable.Mounts == nil {
		out.Grantable.Mounts = []string{}
	}
	if out.Grantable.Egress == nil {
		out.Grantable.Egress = []string{}
	}
	return out
}

// rawGrant detects missing keys: every key but the default runner pair is
// required.
type rawGrant struct {
	Version             *int             `json:"version"`
	MaxRunningChildren  *int             `json:"max_running_children"`
	Operations          []string         `json:"operations"`
	Grantable           *json.RawMessage `json:"grantable"`
	DefaultRunner       *json.RawMessage `json:"default_runner"`
	DefaultRunnerSource *string          `json:"default_runner_source"`
	Publish             *json.RawMessage `json:"publish"`
}

// Parse decodes a grant document strictly: at most MaxDocBytes, one JSON
// object, no unknown or duplicate keys at any level, no trailing data.
// version, max_running_children, operations and grantable are required.
// Operations are returned sorted without duplicates, with spawn and message
// added when missing; grantable lists without duplicates.
func Parse(data []byte) (Grant, error) {
	if len(data) > MaxDocBytes {
		return Grant{}, fmt.Errorf("grant: document exceeds %d bytes", MaxDocBytes)
	}
	if err := checkDuplicateKeys(data); err != nil {
		return Grant{}, fmt.Errorf("grant: %w", err)
	}
	var raw rawGrant
	if err := strictUnmarshal(data, &raw); err != nil {
		return Grant{}, fmt.Errorf("grant: %w", err)
	}
	switch {
	case raw.Version == nil:
		return Grant{}, errors.New("grant: version is required")
	case *raw.Version != Version:
		return Grant{}, errors.New("grant: version must be 1")
	case raw.MaxRunningChildren == nil:
		return Grant{}, errors.New("grant: max_running_children is required")
	case *raw.MaxRunningChildren < 0 || *raw.MaxRunningChildren > MaxRunningChildrenLimit:
		return Grant{}, fmt.Errorf("grant: max_running_children must be 0 to %d", MaxRunningChildrenLimit)
	case raw.Operations == nil:
		return Grant{}, errors.New("grant: operations is required")
	case raw.Grantable == nil || string(*raw.Grantable) == "null":
		return Grant{}, errors.New("grant: grantable is required")
	}
	g := Grant{Version: Version, MaxRunningChildren: *raw.MaxRunningChildren}
	for _, op := range raw.Operations {
		if !ValidOperation(op) {
			return Grant{}, fmt.Errorf("grant: operations: unknown operation (want one of %v)", Operations)
		}
	}
	g.Operations = normalizeOps(raw.Operations)

	if err := strictUnmarshal(*raw.Grantable, &g.Grantable); err != nil {
		return Grant{}, fmt.Errorf("grant: grantable: %w", err)
	}
	g.Grantable.Mounts = nonNil(Dedupe(g.Grantable.Mounts))
	g.Grantable.Egress = nonNil(Dedupe(g.Grantable.Egress))
	if err := g.Grantable.CheckSyntax("grantable"); err != nil {
		return Grant{}, fmt.Errorf("grant: %w", err)
	}

	if raw.DefaultRunner != nil && string(*raw.DefaultRunner) != "null" {
		var r Runner
		if err := strictUnmarshal(*raw.DefaultRunner, &r); err != nil {
			return Grant{}, fmt.Errorf("grant: default_runner: %w", err)
		}
		if err := r.Check("default_runner"); err != nil {
			return Grant{}, fmt.Errorf("grant: %w", err)
		}
		g.DefaultRunner = &r
	}
	if s := raw.DefaultRunnerSource; s != nil {
		if !slices.Contains(RunnerSources, *s) {
			return Grant{}, errors.New("grant: default_runner_source must be container, local, repo, global or null")
		}
		src := *s
		g.DefaultRunnerSource = &src
	}
	if (g.DefaultRunner == nil) != (g.DefaultRunnerSource == nil) {
		return Grant{}, errors.New("grant: default_runner and default_runner_source must both be set or both be null")
	}
	if raw.Publish != nil && string(*raw.Publish) != "null" {
		var p Publish
		if err := strictUnmarshal(*raw.Publish, &p); err != nil {
			return Grant{}, fmt.Errorf("grant: publish: %w", err)
		}
		if err := p.Check("publish"); err != nil {
			return Grant{}, fmt.Errorf("grant: %w", err)
		}
		g.Publish = &p
	}
	return g, nil
}

func normalizeOps(ops []string) []string {
	out := slices.Clone(ops)
	out = append(out, alwaysGranted...)
	slices.Sort(out)
	return slices.Compact(out)
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// strictUnmarshal decodes one JSON value into v, refusing unknown fields
// and trailing data.
func strictUnmarshal(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return cleanJSONError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("trailing data after the document")
	}
	return nil
}

// cleanJSONError keeps encoding/json's field naming but drops its "json: "
// prefix.
func cleanJSONError(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		want := "an object"
		switch te.Type.Kind() {
		case reflect.Int:
			want = "an integer"
		case reflect.String:
			want = "a string"
		case reflect.Bool:
			want = "true or false"
		case reflect.Slice:
			want = "a list"
		}
		return fmt.Errorf("%s must be %s", te.Field, want)
	}
	msg := err.Error()
	if len(msg) > 6 && msg[:6] == "json: " {
		msg = msg[6:]
	}
	return errors.New(msg)
}

// checkDuplicateKeys walks the document's tokens and refuses an object that
// repeats a key (encoding/json would silently keep the last one).
func checkDuplicateKeys(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	type frame struct {
		object bool
		keys   map[string]bool
		expect bool // next string token in an object is a key
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return cleanJSONError(err)
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.object && top.expect {
			if k, ok := tok.(string); ok {
				if top.keys[k] {
					return fmt.Errorf("duplicate key %q", clip(k))
				}
				top.keys[k] = true
				top.expect = false
				continue
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{object: true, keys: map[string]bool{}, expect: true})
			continue
		case json.Delim('['):
			stack = append(stack, &frame{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		// A value just ended: the enclosing object expects a key next.
		if len(stack) > 0 && stack[len(stack)-1].object {
			stack[len(stack)-1].expect = true
		}
	}
}

func clip(s string) string {
	const max = 40
	if len(s) > max {
		return s[:max] + "…"
	}
	return s
}
