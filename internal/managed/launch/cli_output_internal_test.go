package launch

import (
	"strings"
	"testing"
	"unicode"
)

// TestLastLinesArePrintable: what a failed launch quotes of a CLI's
// output (the output of the repository's lifecycle commands and images
// among it) reaches the operator's terminal and the launch record with no
// control or format character: an OSC 52 clipboard write, a screen
// clear, a C1 CSI, a bidi override, a carriage return rewriting the line,
// invalid UTF-8. The text around them stays.
func TestLastLinesArePrintable(t *testing.T) {
	const hostile = "\x1b]52;c;SGVsbG8=\x07copied\n\x1b[2J\x1b[Hcleared\n\u009b31mred\n\u202eeulav\nfake\rbranchbox: ok\n\xff\x9bbyte\n    at Object.<anonymous> (cli.js:1:1)\n"
	got := lastLines(hostile, 12)
	for _, r := range got {
		if r != '\n' && !unicode.IsPrint(r) {
			t.Fatalf("lastLines holds %U: %q", r, got)
		}
	}
	for _, want := range []string{"copied", "cleared", "red", "eulav", "branchbox: ok", "byte"} {
		if !strings.Contains(got, want) {
			t.Errorf("lastLines lost %q: %q", want, got)
		}
	}
	if strings.Contains(got, "cli.js") {
		t.Errorf("lastLines kept a stack frame: %q", got)
	}
}
