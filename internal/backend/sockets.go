package backend

import (
	"os"
	"path/filepath"
)

// SocketsIn lists the Unix sockets directly in dir, the host directory of
// an attachment: AttachSocket gives each to the agent's uid (a model
// socket directory holds one socket per endpoint). Anything else there
// (a name something planted) is left alone; a missing dir has none.
func SocketsIn(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if e.Type() == os.ModeSocket {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	return out, nil
}
