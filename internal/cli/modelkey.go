package cli

import (
	"fmt"
	"net/url"
	"os"
	"strings"

	"agentbox/internal/broker"
	"agentbox/internal/config"
	"agentbox/internal/secfs"
)

// maxAPIKeyBytes bounds the key file (a key is about 100 bytes).
const maxAPIKeyBytes = 4 << 10

// modelConfig turns broker.yaml's `model` into the broker's: the
// upstream and the key, and each LiteLLM profile's, read now from their
// files or variables. With no key named anywhere it returns nil: no
// sandbox gets a model socket. Errors name the file or variable, never a
// key.
func modelConfig(m config.Model) (*broker.ModelConfig, error) {
	if !m.HasKey() && len(m.LiteLLM) == 0 {
		return nil, nil
	}
	out := &broker.ModelConfig{MaxOutputTokensPerHour: m.MaxOutputTokensPerHour, MaxInputTokensPerHour: m.MaxInputTokensPerHour, ProviderTools: m.ProviderTools}
	if m.HasKey() {
		up, key, err := loadEndpoint("model", m.Upstream, m.APIKeyFile, m.APIKeyEnv)
		if err != nil {
			return nil, err
		}
		out.Upstream, out.Key = up, key
	}
	for name, e := range m.LiteLLM {
		up, key, err := loadEndpoint("model.litellm."+name, e.Upstream, e.APIKeyFile, e.APIKeyEnv)
		if err != nil {
			return nil, err
		}
		if out.LiteLLM == nil {
			out.LiteLLM = map[string]broker.ModelEndpoint{}
		}
		out.LiteLLM[name] = broker.ModelEndpoint{Upstream: up, Key: key}
	}
	return out, nil
}

// loadEndpoint parses an endpoint's upstream and reads its key (path names
// it in errors).
func loadEndpoint(path, upstream, keyFile, keyEnv string) (*url.URL, string, error) {
	up, err := url.Parse(upstream)
	if err != nil {
		return nil, "", fmt.Errorf("%s.upstream: %v", path, err) // ParseBroker checked it
	}
	var key string
	if keyEnv != "" {
		key = strings.TrimSpace(os.Getenv(keyEnv))
		if key == "" {
			return nil, "", fmt.Errorf("%s.api_key_env: the variable %s is not set (or empty) in the broker's environment", path, keyEnv)
		}
	} else if key, err = readAPIKeyFile(path, keyFile); err != nil {
		return nil, "", err
	}
	if !secfs.IsSingleToken(key) {
		return nil, "", fmt.Errorf("%s: the API key holds characters other than visible ASCII (one key, no spaces)", path)
	}
	return up, key, nil
}

// readAPIKeyFile reads the key from path (secfs.ReadSecretFile: "~/" is
// the broker user's home; a regular file, not a symlink, owned by the
// broker's user and readable by nobody else).
func readAPIKeyFile(at, path string) (string, error) {
	key, err := secfs.ReadSecretFile(path, maxAPIKeyBytes)
	if err != nil {
		return "", fmt.Errorf("%s.api_key_file %s: %v", at, path, err)
	}
	return key, nil
}
