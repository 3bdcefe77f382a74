package cli

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"agentbox/internal/broker"
	"agentbox/internal/config"
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
	out := &broker.ModelConfig{MaxOutputTokensPerHour: m.MaxOutputTokensPerHour}
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
	if !visibleASCII(key) {
		return nil, "", fmt.Errorf("%s: the API key holds characters other than visible ASCII (one key, no spaces)", path)
	}
	return up, key, nil
}

// readAPIKeyFile reads the key from path ("~/" is the broker user's home):
// a regular file, not a symlink, owned by the broker's user and readable
// by nobody else.
func readAPIKeyFile(at, path string) (string, error) {
	if rest, ok := strings.CutPrefix(path, "~/"); ok {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("%s.api_key_file: %v", at, err)
		}
		path = filepath.Join(home, rest)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0)
	if err != nil {
		return "", fmt.Errorf("%s.api_key_file %s: %v", at, path, errors.Unwrap(err))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("%s.api_key_file %s: %v", at, path, err)
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.Mode().IsRegular():
		return "", fmt.Errorf("%s.api_key_file %s: not a regular file", at, path)
	case st == nil || int(st.Uid) != os.Geteuid():
		return "", fmt.Errorf("%s.api_key_file %s: not owned by the broker's user", at, path)
	case fi.Mode().Perm()&0o077 != 0:
		return "", fmt.Errorf("%s.api_key_file %s: readable by others (mode %04o): chmod 600 it", at, path, fi.Mode().Perm())
	}
	data, err := io.ReadAll(io.LimitReader(f, maxAPIKeyBytes+1))
	if err != nil {
		return "", fmt.Errorf("%s.api_key_file %s: %v", at, path, err)
	}
	if len(data) > maxAPIKeyBytes {
		return "", fmt.Errorf("%s.api_key_file %s: over %d bytes: not a key", at, path, maxAPIKeyBytes)
	}
	key := strings.TrimSpace(string(data))
	if key == "" {
		return "", fmt.Errorf("%s.api_key_file %s: empty", at, path)
	}
	return key, nil
}

// visibleASCII reports whether s is one header-safe token.
func visibleASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return s != ""
}
