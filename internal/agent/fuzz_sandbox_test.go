package agent

import (
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// FuzzParseServices: what tmux in a sandbox prints for its services'
// windows never panics the parser, and yields only wanted names in a
// known state with a pid or exit status that can be.
func FuzzParseServices(f *testing.F) {
	f.Add([]byte("web\t0\t\t42\ndb\t1\t3\t0\n"))
	f.Add([]byte("web\t1\t\t0\nweb\t0\t\t7\n"))
	f.Add([]byte("db\t0\t\t1\n\x00\t\t\t\n"))
	names := []string{"web", "db"}
	f.Fuzz(func(t *testing.T, out []byte) {
		for name, st := range ParseServices(out, names) {
			if !slices.Contains(names, name) {
				t.Fatalf("unwanted name %q", name)
			}
			switch st.State {
			case ServiceRunning:
				if st.PID <= 1 || st.PID > maxPID {
					t.Fatalf("%s running with pid %d", name, st.PID)
				}
			case ServiceExited:
				if st.Code < -1 || st.Code > 255 {
					t.Fatalf("%s exited with %d", name, st.Code)
				}
			default:
				t.Fatalf("%s in state %q", name, st.State)
			}
		}
	})
}

// clean reports whether s is what cleanText lets through: valid UTF-8
// without control characters but newlines and tabs.
func clean(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r != '\n' && r != '\t' && (r < 0x20 || r == 0x7f || r >= 0x80 && r < 0xa0 || unicode.Is(unicode.Cf, r)) {
			return false
		}
	}
	return true
}

// FuzzParsePanes: a sandbox's captured panes (printed on the host's
// terminal by `jailbee logs`, and in idle reports) never panic the
// parsers and come out clean and bounded.
func FuzzParsePanes(f *testing.F) {
	f.Add([]byte("stray\n\x00one\x1b\nfirst\x07 \n\n\nsecond\n\n\x00two\nx\n"))
	f.Add([]byte("\x00\xff\xfe\n\x9b31m\x00"))
	f.Add([]byte("\x00win\u202edow\nab\u2066c\u200bd\n"))
	f.Add([]byte(strings.Repeat("é", PaneTailBytes)))
	f.Fuzz(func(t *testing.T, out []byte) {
		for _, p := range ParsePanes(out) {
			if !clean(p.Window) || len(p.Lines) > MaxPaneLines {
				t.Fatalf("pane %q with %d lines", p.Window, len(p.Lines))
			}
			for _, l := range p.Lines {
				if !clean(l) || strings.Contains(l, "\n") {
					t.Fatalf("line %q", l)
				}
			}
		}
		tail := PaneTail(out)
		if !clean(tail) || len(tail) > PaneTailBytes || strings.Count(tail, "\n") >= PaneTailLines {
			t.Fatalf("tail %q", tail)
		}
	})
}
