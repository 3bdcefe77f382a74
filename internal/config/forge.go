package config

import (
	"net/url"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Forge defaults: GitHub itself.
const (
	// DefaultForgeAPIURL is forge.api_url when broker.yaml does not set it.
	DefaultForgeAPIURL = "https://api.github.com/"
	// DefaultForgeGitURL is forge.git_url when broker.yaml does not set it.
	DefaultForgeGitURL = "https://github.com/{owner}/{name}.git"
)

// Bounds of publish.actions_per_hour.
const (
	MinPublishActionsPerHour = 1
	MaxPublishActionsPerHour = 10000
	// DefaultPublishActionsPerHour is publish.actions_per_hour when
	// broker.yaml does not set it: a busy orchestrator's issue traffic,
	// not a flood.
	DefaultPublishActionsPerHour = 30
)

// Bounds of publish.bytes_per_hour.
const (
	MinPublishBytesPerHour = 1 << 20
	MaxPublishBytesPerHour = 1 << 40
	// DefaultPublishBytesPerHour is publish.bytes_per_hour when
	// broker.yaml does not set it: one transfer of the largest size
	// (gitx.MaxTransferBytes), not a disk filled by the hour.
	DefaultPublishBytesPerHour = 4 << 30
)

// Forge is broker.yaml's `forge`: where the host publishes an
// orchestrator's outbox (GitHub's REST API and git remote), and with which
// token. The token itself is never in the file.
type Forge struct {
	// APIURL is the REST API's base URL, ending in "/".
	APIURL string
	// GitURL is the git remote of a repository, a template where {owner}
	// and {name} stand for the repository's owner and name.
	GitURL string
	// TokenFile is a file holding the token ("~/" is the broker user's
	// home); TokenEnv the name of a variable of the broker's environment
	// holding it. At most one is set; with neither, publishing is refused.
	TokenFile string
	TokenEnv  string
}

// HasToken reports whether the broker is told where the forge token is.
func (f Forge) HasToken() bool { return f.TokenFile != "" || f.TokenEnv != "" }

// Publish is broker.yaml's `publish`.
type Publish struct {
	// ActionsPerHour is how many outbox actions one orchestrator may
	// publish in any hour (a sliding window).
	ActionsPerHour int
	// BytesPerHour is how many bytes one orchestrator's publishes may
	// bring into the user's repository (the sources' transfers) in any
	// hour.
	BytesPerHour int64
}

func (p *Publish) fields() []field {
	return []field{
		{key: "actions_per_hour", min: MinPublishActionsPerHour, max: MaxPublishActionsPerHour,
			get: func() int64 { return int64(p.ActionsPerHour) }, set: func(v int64) { p.ActionsPerHour = int(v) }},
		{key: "bytes_per_hour", size: true, min: MinPublishBytesPerHour, max: MaxPublishBytesPerHour,
			get: func() int64 { return p.BytesPerHour }, set: func(v int64) { p.BytesPerHour = v }},
	}
}

// forgeKeys are the keys of `forge`.
var forgeKeys = []string{"api_url", "git_url", "token_file", "token_env"}

// decodeForge reads `forge: {api_url, git_url, token_file | token_env}`.
func decodeForge(n *yaml.Node, f *Forge) error {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	var keyNode *yaml.Node
	err := eachKey(n, "forge", func(key string, k, v *yaml.Node) error {
		p := join("forge", key)
		if v.Kind == yaml.AliasNode {
			return errAt(p, v, "YAML aliases are not supported")
		}
		if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
			return nil
		}
		if !slices.Contains(forgeKeys, key) {
			return errAt(p, k, "unknown key")
		}
		if v.Kind != yaml.ScalarNode || v.Tag != "!!str" {
			return errAt(p, v, "must be a string")
		}
		switch key {
		case "api_url":
			if msg := upstreamProblem(v.Value, DefaultForgeAPIURL, "the token goes in token_file or token_env"); msg != "" {
				return errAt(p, v, "%s", msg)
			}
			f.APIURL = strings.TrimSuffix(v.Value, "/") + "/"
		case "git_url":
			if msg := gitURLProblem(v.Value); msg != "" {
				return errAt(p, v, "%s", msg)
			}
			f.GitURL = v.Value
		case "token_file":
			if msg := keyFileProblem(v.Value); msg != "" {
				return errAt(p, v, "%s", msg)
			}
			f.TokenFile, keyNode = v.Value, k
		case "token_env":
			if msg := keyEnvProblem(v.Value); msg != "" {
				return errAt(p, v, "%s", msg)
			}
			f.TokenEnv, keyNode = v.Value, k
		}
		return nil
	})
	if err != nil {
		return err
	}
	if f.TokenFile != "" && f.TokenEnv != "" {
		return errAt("forge", keyNode, "set token_file or token_env, not both")
	}
	return nil
}

// gitURLProblem says what is wrong with a git_url template, or "": an
// https, http or file URL with no credentials, query or fragment, where
// {owner} and {name} each appear and no other braces do.
func gitURLProblem(tmpl string) string {
	const want = "must be an https, http or file URL naming {owner} and {name}, such as " + DefaultForgeGitURL
	if !strings.Contains(tmpl, "{owner}") || !strings.Contains(tmpl, "{name}") {
		return want
	}
	filled := strings.NewReplacer("{owner}", "o", "{name}", "n").Replace(tmpl)
	if strings.ContainsAny(filled, "{}") || strings.ContainsFunc(filled, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return want
	}
	u, err := url.Parse(filled)
	switch {
	case err != nil || u.Opaque != "":
		return want
	case u.Scheme == "file":
		if u.Host != "" || !strings.HasPrefix(u.Path, "/") {
			return want
		}
	case u.Scheme != "https" && u.Scheme != "http" || u.Host == "":
		return want
	}
	switch {
	case u.User != nil:
		return "must not hold credentials (the token goes in token_file or token_env)"
	case u.RawQuery != "" || u.Fragment != "" || strings.ContainsAny(filled, "?#"):
		return "must not have a query or fragment"
	}
	return ""
}

// Validate checks f (built in code, or one ParseBroker returned); the
// error names the key path.
func (f Forge) Validate() error {
	checks := []struct {
		key, value, msg string
	}{
		{"api_url", f.APIURL, upstreamProblem(f.APIURL, DefaultForgeAPIURL, "the token goes in token_file or token_env")},
		{"git_url", f.GitURL, gitURLProblem(f.GitURL)},
		{"token_file", f.TokenFile, keyFileProblem(f.TokenFile)},
		{"token_env", f.TokenEnv, keyEnvProblem(f.TokenEnv)},
	}
	for i, c := range checks {
		if c.msg != "" && (i < 2 || c.value != "") {
			return &Error{Path: "forge." + c.key, Msg: c.msg}
		}
	}
	if !strings.HasSuffix(f.APIURL, "/") {
		return &Error{Path: "forge.api_url", Msg: "must end in /"}
	}
	if f.TokenFile != "" && f.TokenEnv != "" {
		return &Error{Path: "forge", Msg: "set token_file or token_env, not both"}
	}
	return nil
}
