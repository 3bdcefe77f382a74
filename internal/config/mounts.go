package config

import (
	"errors"
	"strconv"

	"go.yaml.in/yaml/v3"

	"agentbox/internal/grant"
	"agentbox/internal/secfs"
)

// MountDir is one `mounts:` entry of broker.yaml: a host directory a
// sandbox may be given by its name.
type MountDir struct {
	Path     string // absolute and clean, no symlink on the way
	ReadOnly bool
}

// decodeMounts reads `mounts: {NAME: {path: /abs/dir, read_only: BOOL}}`.
// read_only is required: whether a sandbox may write a host directory is
// never a default.
func decodeMounts(n *yaml.Node, into map[string]MountDir) error {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	return eachKey(n, "mounts", func(name string, k, v *yaml.Node) error {
		p := join("mounts", name)
		if !grant.ValidMount(name) {
			return errAt(p, k, "invalid mount name (letters, digits, '.', '_' and '-', starting with a letter or digit, at most 64)")
		}
		var m MountDir
		var hasPath, hasRO bool
		var pathNode *yaml.Node
		err := eachKey(v, p, func(key string, k, v *yaml.Node) error {
			switch key {
			case "path":
				if v.Kind != yaml.ScalarNode || v.Tag != "!!str" || !secfs.IsAbsClean(v.Value) || v.Value == "/" {
					return errAt(join(p, key), v, "must be an absolute, clean path of a directory (not /)")
				}
				m.Path, hasPath, pathNode = v.Value, true, v
			case "read_only":
				b, err := strconv.ParseBool(v.Value)
				if v.Kind != yaml.ScalarNode || v.Tag != "!!bool" || err != nil {
					return errAt(join(p, key), v, "must be true or false")
				}
				m.ReadOnly, hasRO = b, true
			default:
				return errAt(join(p, key), k, "unknown key")
			}
			return nil
		})
		if err != nil {
			return err
		}
		if !hasPath || !hasRO {
			return errAt(p, k, "needs path and read_only")
		}
		if err := CheckMountDir(m.Path); err != nil {
			return errAt(join(p, "path"), pathNode, "%v", err)
		}
		into[name] = m
		return nil
	})
}

// CheckMountDir checks that the host path p is an existing directory
// reached without following a symbolic link (whoever can write a
// directory on the way could swap one in). The error never names p.
func CheckMountDir(p string) error {
	f, _, err := secfs.OpenDirNoFollow(p, nil)
	switch {
	case err == nil:
		f.Close()
		return nil
	case errors.Is(err, secfs.ErrType):
		return errors.New("is not a directory")
	case errors.Is(err, secfs.ErrSymlink):
		return errors.New("passes through a symbolic link (give the real path)")
	}
	return errors.New("is not an existing directory")
}
