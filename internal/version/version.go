// Package version is the version both programs print for --version.
package version

import "runtime/debug"

// Version is set at build time:
//
//	go build -ldflags "-X agentbox/internal/version.Version=v1.2.0" ./cmd/jailbee
//
// Empty, String falls back to what the Go toolchain recorded.
var Version string

// revisionLen is how much of a commit hash String shows: enough to name a
// commit, short enough to read.
const revisionLen = 12

// String is Version, else the build's version control revision
// ("devel-<rev>", "-dirty" when the tree had changes), else the module's
// version (go install module@version), else "devel".
func String() string {
	if Version != "" {
		return Version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	return fromBuildInfo(bi)
}

func fromBuildInfo(bi *debug.BuildInfo) string {
	var rev string
	var dirty bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	switch {
	case rev != "":
		v := "devel-" + rev[:min(len(rev), revisionLen)]
		if dirty {
			v += "-dirty"
		}
		return v
	case bi.Main.Version != "" && bi.Main.Version != "(devel)":
		return bi.Main.Version
	}
	return "devel"
}
