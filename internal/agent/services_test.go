package agent

import (
	"reflect"
	"testing"
)

// TestParseServices: what tmux in a sandbox prints is read strictly: only
// windows named after a wanted service, lines of four fields with a
// valid pid or exit status; a name shown twice is not trusted.
func TestParseServices(t *testing.T) {
	out := "web\t0\t\t42\n" +
		"db\t1\t3\t0\n" +
		"cache\t1\t\t0\n" +
		"scripted\t0\t\t7\n" + // the agent's window
		"aux\t0\t\tnot-a-pid\n" +
		"evil\t0\t\t9\textra\n" +
		"dup\t0\t\t10\ndup\t0\t\t11\n" +
		"big\t1\t999\t0\n"
	got := ParseServices([]byte(out), []string{"web", "db", "cache", "aux", "evil", "dup", "big", "idle"})
	want := map[string]ServiceState{
		"web":   {State: ServiceRunning, PID: 42},
		"db":    {State: ServiceExited, Code: 3},
		"cache": {State: ServiceExited, Code: -1},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("parsed %+v, want %+v", got, want)
	}
}
