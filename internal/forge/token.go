package forge

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"agentbox/internal/config"
	"agentbox/internal/secfs"
)

// LoadToken reads the token broker.yaml's forge section names: from
// token_file (a regular file, not a symlink, owned by the broker's user
// and readable by nobody else, as ssh wants a private key) or from the
// variable token_env. With neither it returns ErrNoToken. Errors name the
// file or the variable, never what they hold.
func LoadToken(c config.Forge) (string, error) {
	var token string
	switch {
	case c.TokenEnv != "":
		token = strings.TrimSpace(os.Getenv(c.TokenEnv))
		if token == "" {
			return "", fmt.Errorf("forge.token_env: the variable %s is not set (or empty) in the broker's environment", c.TokenEnv)
		}
	case c.TokenFile != "":
		var err error
		if token, err = secfs.ReadSecretFile(c.TokenFile, MaxTokenBytes); err != nil {
			return "", fmt.Errorf("forge.token_file %s: %v", c.TokenFile, err)
		}
	default:
		return "", ErrNoToken
	}
	if !secfs.IsSingleToken(token) {
		return "", errors.New("forge: the token holds characters other than visible ASCII (one token, no spaces)")
	}
	return token, nil
}

// FromConfig is New with broker.yaml's forge section: its API URL and the
// token LoadToken reads now.
func FromConfig(c config.Forge) (*GitHub, error) {
	token, err := LoadToken(c)
	if err != nil {
		return nil, err
	}
	return New(Config{APIURL: c.APIURL, Token: token})
}

// GitURL is the git remote of r: tmpl (broker.yaml forge.git_url) with
// {owner} and {name} filled in. r must be valid (ParseRepo).
func GitURL(tmpl string, r Repo) string {
	return strings.NewReplacer("{owner}", r.Owner, "{name}", r.Name).Replace(tmpl)
}
