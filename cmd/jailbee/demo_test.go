package main_test

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDemoPrintsPastableCommands: the demo prints each command it runs
// so that pasting the line into a shell runs the same words.
func TestDemoPrintsPastableCommands(t *testing.T) {
	script, err := os.ReadFile("../../scripts/demo.sh")
	if err != nil {
		t.Fatal(err)
	}
	shown := regexp.MustCompile(`(?ms)^shown\(\) \{.*?^\}$`).Find(script)
	if shown == nil {
		t.Fatal("scripts/demo.sh has no shown()")
	}
	words := []string{"jb", "exec", "lead", "--", "jailbee", "inbox", "send", "spawn", "--text", "Fix the parser",
		"sh", "-c", "echo 'Which lexer do you mean?' | jailbee inbox send message --reply-to h-1",
		"", "$HOME", "a\"b", "back\\slash", "tab\there", "/tmp/jb-demo.Ab12/repo", "--model", "sonnet[1m]", "*"}
	out, err := exec.Command("bash", append([]string{"-c", string(shown) + "\nshown \"$@\"", "demo"}, words...)...).Output()
	if err != nil {
		t.Fatal(err)
	}
	line, ok := strings.CutPrefix(strings.TrimSuffix(string(out), "\n"), "$ ")
	if !ok {
		t.Fatalf("not a command line: %q", out)
	}
	if !strings.Contains(line, "'Fix the parser'") {
		t.Errorf("a text with spaces is not quoted: %s", line)
	}
	// Pasted into a shell, the line gives back the very same words.
	pasted, err := exec.Command("bash", "-c", "printf '%s\\0' "+line).Output()
	if err != nil {
		t.Fatalf("pasting %s: %v", line, err)
	}
	if got := strings.Split(strings.TrimSuffix(string(pasted), "\x00"), "\x00"); !slices.Equal(got, words) {
		t.Errorf("pasting %s gives\n%q, want\n%q", line, got, words)
	}
}
