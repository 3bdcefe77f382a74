package version

import (
	"runtime/debug"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	rev := debug.BuildSetting{Key: "vcs.revision", Value: "442c9385d1730e4ca6e9d6fdc32276edb21962c2"}
	for _, tc := range []struct {
		name string
		bi   debug.BuildInfo
		want string
	}{
		{"revision", debug.BuildInfo{Settings: []debug.BuildSetting{rev, {Key: "vcs.modified", Value: "false"}}}, "devel-442c9385d173"},
		{"dirty", debug.BuildInfo{Settings: []debug.BuildSetting{rev, {Key: "vcs.modified", Value: "true"}}}, "devel-442c9385d173-dirty"},
		{"go install", debug.BuildInfo{Main: debug.Module{Version: "v1.4.0"}}, "v1.4.0"},
		{"nothing recorded", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "devel"},
	} {
		if got := fromBuildInfo(&tc.bi); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
