package secfs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// ReadSecretFile reads a secret (an API key, a token) from path ("~/" is
// the home of the process's user), the way ssh reads a private key: a
// regular file, not a symlink, owned by the process's effective user and
// readable by nobody else, at most maxBytes; surrounding whitespace is
// trimmed and the rest must not be empty. Errors never carry the file's
// content, nor path (the caller names it as it sees fit).
func ReadSecretFile(path string, maxBytes int64) (string, error) {
	if rest, ok := strings.CutPrefix(path, "~/"); ok {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		path = filepath.Join(home, rest)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0)
	if err != nil {
		return "", WithoutPath(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", WithoutPath(err)
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.Mode().IsRegular():
		return "", errors.New("not a regular file")
	case st == nil || int(st.Uid) != os.Geteuid():
		return "", errors.New("not owned by the broker's user")
	case fi.Mode().Perm()&0o077 != 0:
		return "", fmt.Errorf("readable by others (mode %04o): chmod 600 it", fi.Mode().Perm())
	}
	data, err := io.ReadAll(io.LimitReader(f, maxBytes+1))
	if err != nil {
		return "", WithoutPath(err)
	}
	if int64(len(data)) > maxBytes {
		return "", fmt.Errorf("over %d bytes: not a key", maxBytes)
	}
	secret := strings.TrimSpace(string(data))
	if secret == "" {
		return "", errors.New("empty")
	}
	return secret, nil
}

// IsSingleToken reports whether secret is one token of visible ASCII (no
// space, no control character): safe in an HTTP header, where a newline
// would start another.
func IsSingleToken(secret string) bool {
	for i := 0; i < len(secret); i++ {
		if secret[i] < 0x21 || secret[i] > 0x7e {
			return false
		}
	}
	return secret != ""
}
