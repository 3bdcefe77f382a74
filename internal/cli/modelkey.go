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

// modelConfig turns broker.yaml's `model` into the broker's: the upstream
// and the key, read now from its file or variable. With no key named it
// returns nil: no sandbox gets a model socket. Errors name the file or
// variable, never the key.
func modelConfig(m config.Model) (*broker.ModelConfig, error) {
	if !m.HasKey() {
		return nil, nil
	}
	up, err := url.Parse(m.Upstream)
	if err != nil {
		return nil, fmt.Errorf("model.upstream: %v", err) // ParseBroker checked it
	}
	var key string
	if m.APIKeyEnv != "" {
		key = strings.TrimSpace(os.Getenv(m.APIKeyEnv))
		if key == "" {
			return nil, fmt.Errorf("model.api_key_env: the variable %s is not set (or empty) in the broker's environment", m.APIKeyEnv)
		}
	} else if key, err = readAPIKeyFile(m.APIKeyFile); err != nil {
		return nil, err
	}
	if !visibleASCII(key) {
		return nil, errors.New("model: the API key holds characters other than visible ASCII (one key, no spaces)")
	}
	return &broker.ModelConfig{Upstream: up, Key: key, MaxOutputTokensPerHour: m.MaxOutputTokensPerHour}, nil
}

// readAPIKeyFile reads the key from path ("~/" is the broker user's home):
// a regular file, not a symlink, owned by the broker's user and readable
// by nobody else.
func readAPIKeyFile(path string) (string, error) {
	if rest, ok := strings.CutPrefix(path, "~/"); ok {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("model.api_key_file: %v", err)
		}
		path = filepath.Join(home, rest)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0)
	if err != nil {
		return "", fmt.Errorf("model.api_key_file %s: %v", path, errors.Unwrap(err))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("model.api_key_file %s: %v", path, err)
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.Mode().IsRegular():
		return "", fmt.Errorf("model.api_key_file %s: not a regular file", path)
	case st == nil || int(st.Uid) != os.Geteuid():
		return "", fmt.Errorf("model.api_key_file %s: not owned by the broker's user", path)
	case fi.Mode().Perm()&0o077 != 0:
		return "", fmt.Errorf("model.api_key_file %s: readable by others (mode %04o): chmod 600 it", path, fi.Mode().Perm())
	}
	data, err := io.ReadAll(io.LimitReader(f, maxAPIKeyBytes+1))
	if err != nil {
		return "", fmt.Errorf("model.api_key_file %s: %v", path, err)
	}
	if len(data) > maxAPIKeyBytes {
		return "", fmt.Errorf("model.api_key_file %s: over %d bytes: not a key", path, maxAPIKeyBytes)
	}
	key := strings.TrimSpace(string(data))
	if key == "" {
		return "", fmt.Errorf("model.api_key_file %s: empty", path)
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
