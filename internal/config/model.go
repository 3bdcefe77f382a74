package config

import (
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// DefaultModelUpstream is where the model sockets forward the Messages
// API when broker.yaml names no upstream.
const DefaultModelUpstream = "https://api.anthropic.com"

// Bounds of model.max_output_tokens_per_hour and
// model.max_input_tokens_per_hour.
const (
	MinOutputTokensPerHour = 1
	MaxOutputTokensPerHour = 1 << 40
	MinInputTokensPerHour  = 1
	MaxInputTokensPerHour  = 1 << 40
)

// Model is broker.yaml's `model`: how the broker's model sockets reach the
// Messages API, and with which key. The key itself is never in the file.
type Model struct {
	// Upstream is the API's base URL (http or https, no credentials,
	// query or fragment).
	Upstream string
	// APIKeyFile is a file holding the key ("~/" is the broker user's
	// home); APIKeyEnv the name of a variable of the broker's environment
	// holding it. At most one is set; with neither, no model socket is
	// served.
	APIKeyFile string
	APIKeyEnv  string
	// MaxOutputTokensPerHour bounds the output tokens one orchestrator
	// tree (the orchestrator and its children) may use in any hour; 0 is
	// no bound.
	MaxOutputTokensPerHour int64
	// MaxInputTokensPerHour bounds the input tokens (uncached, cache
	// writes and cache reads alike) one orchestrator tree may use in any
	// hour; 0 is no bound. Without it a request of max_tokens 1 and a
	// 32 MB prompt costs the key's owner its whole input and the output
	// budget next to nothing.
	MaxInputTokensPerHour int64
	// ProviderTools lets Messages requests ask the provider to run tools
	// on its own side (web search and fetch, code execution, remote MCP
	// servers), which reach the network past every egress right; off,
	// the model sockets refuse them.
	ProviderTools bool
	// LiteLLM are the endpoints of LiteLLM profiles (model.litellm.NAME),
	// which claude-jb runners reach through a socket of their own.
	LiteLLM map[string]ModelEndpoint
}

// ModelEndpoint is one LiteLLM profile's endpoint: where it is and where
// its key is (exactly one of the two key fields is set).
type ModelEndpoint struct {
	Upstream   string
	APIKeyFile string
	APIKeyEnv  string
}

// HasKey reports whether the broker is told where its key is.
func (m Model) HasKey() bool { return m.APIKeyFile != "" || m.APIKeyEnv != "" }

// MaxLiteLLMProfileName bounds a model.litellm profile name: its socket's
// name (litellm-NAME.sock) must fit a Unix socket path.
const MaxLiteLLMProfileName = 32

// endpointKeys are the keys of an endpoint: model's own, and each of
// model.litellm's.
var endpointKeys = []string{"upstream", "api_key_file", "api_key_env"}

var litellmProfilePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)

var envNamePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// decodeModel reads `model: {upstream, api_key_file | api_key_env,
// max_output_tokens_per_hour, max_input_tokens_per_hour, provider_tools,
// litellm}` into m.
func decodeModel(n *yaml.Node, m *Model) error {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	limits := []field{
		{key: "max_output_tokens_per_hour", min: MinOutputTokensPerHour, max: MaxOutputTokensPerHour,
			get: func() int64 { return m.MaxOutputTokensPerHour }, set: func(v int64) { m.MaxOutputTokensPerHour = v }},
		{key: "max_input_tokens_per_hour", min: MinInputTokensPerHour, max: MaxInputTokensPerHour,
			get: func() int64 { return m.MaxInputTokensPerHour }, set: func(v int64) { m.MaxInputTokensPerHour = v }},
	}
	var keyNode *yaml.Node
	err := eachKey(n, "model", func(key string, k, v *yaml.Node) error {
		p := join("model", key)
		if v.Kind == yaml.AliasNode {
			return errAt(p, v, "YAML aliases are not supported")
		}
		if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
			return nil
		}
		for _, limit := range limits {
			if key == limit.key {
				val, err := limit.decode(v, p)
				if err == nil {
					limit.set(val)
				}
				return err
			}
		}
		if key == "litellm" {
			return decodeLiteLLMEndpoints(v, m)
		}
		if key == "provider_tools" {
			b, err := strconv.ParseBool(v.Value)
			if v.Kind != yaml.ScalarNode || v.Tag != "!!bool" || err != nil {
				return errAt(p, v, "must be true or false")
			}
			m.ProviderTools = b
			return nil
		}
		if key != "upstream" {
			keyNode = k
		}
		return decodeEndpointKey(p, key, k, v, &m.Upstream, &m.APIKeyFile, &m.APIKeyEnv)
	})
	if err != nil {
		return err
	}
	if m.APIKeyFile != "" && m.APIKeyEnv != "" {
		return errAt("model", keyNode, "set api_key_file or api_key_env, not both")
	}
	return nil
}

// upstreamProblem says what is wrong with an upstream URL, or "";
// example is a good one, and instead says where the key goes instead.
func upstreamProblem(s, example, instead string) string {
	u, err := url.Parse(s)
	switch {
	case err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.Opaque != "":
		return "must be an http or https URL such as " + example
	case u.User != nil:
		return "must not hold credentials (" + instead + ")"
	case u.RawQuery != "" || u.Fragment != "" || strings.HasSuffix(s, "?") || strings.HasSuffix(s, "#"):
		return "must not have a query or fragment"
	}
	return ""
}

// decodeLiteLLMEndpoints reads `model.litellm: {NAME: {upstream,
// api_key_file | api_key_env}}`.
func decodeLiteLLMEndpoints(n *yaml.Node, m *Model) error {
	m.LiteLLM = map[string]ModelEndpoint{}
	return eachKey(n, "model.litellm", func(name string, k, v *yaml.Node) error {
		p := join("model.litellm", name)
		if !litellmProfilePattern.MatchString(name) {
			return errAt(p, k, "a profile name is [a-z0-9][a-z0-9_-], at most %d characters", MaxLiteLLMProfileName)
		}
		var e ModelEndpoint
		err := eachKey(v, p, func(key string, k, v *yaml.Node) error {
			return decodeEndpointKey(join(p, key), key, k, v, &e.Upstream, &e.APIKeyFile, &e.APIKeyEnv)
		})
		if err != nil {
			return err
		}
		switch {
		case e.Upstream == "":
			return errAt(p, k, "needs an upstream")
		case (e.APIKeyFile == "") == (e.APIKeyEnv == ""):
			return errAt(p, k, "needs api_key_file or api_key_env (one of the two)")
		}
		m.LiteLLM[name] = e
		return nil
	})
}

// decodeEndpointKey reads one key of an endpoint (path p) into upstream,
// keyFile or keyEnv.
func decodeEndpointKey(p, key string, k, v *yaml.Node, upstream, keyFile, keyEnv *string) error {
	if !slices.Contains(endpointKeys, key) {
		return errAt(p, k, "unknown key")
	}
	if v.Kind != yaml.ScalarNode || v.Tag != "!!str" {
		return errAt(p, v, "must be a string")
	}
	switch key {
	case "upstream":
		if msg := upstreamProblem(v.Value, DefaultModelUpstream, "the key goes in api_key_file or api_key_env"); msg != "" {
			return errAt(p, v, "%s", msg)
		}
		*upstream = strings.TrimSuffix(v.Value, "/")
	case "api_key_file":
		if msg := keyFileProblem(v.Value); msg != "" {
			return errAt(p, v, "%s", msg)
		}
		*keyFile = v.Value
	case "api_key_env":
		if msg := keyEnvProblem(v.Value); msg != "" {
			return errAt(p, v, "%s", msg)
		}
		*keyEnv = v.Value
	}
	return nil
}

// keyFileProblem says what is wrong with the path of a key file, or "".
func keyFileProblem(path string) string {
	if !strings.HasPrefix(path, "/") && !strings.HasPrefix(path, "~/") || strings.ContainsRune(path, 0) {
		return "must be an absolute path or start with ~/"
	}
	return ""
}

// keyEnvProblem says what is wrong with the name of a key's variable, or "".
func keyEnvProblem(name string) string {
	if !envNamePattern.MatchString(name) {
		return "must be an environment variable's name (letters, digits, _)"
	}
	return ""
}
