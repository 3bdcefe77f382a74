package orchestrate

import (
	"strings"
	"testing"
	"time"

	"agentbox/internal/agent"
	"agentbox/internal/manifest"
	"agentbox/internal/store"
)

// TestIdleEpisode walks one child's episode through the spec's rules: the
// first report idle_after after the stretch began, then one per
// idle_after; busy, unknown or a new accepted message start over; an
// accepted blocked suppresses reports until the next accepted message.
func TestIdleEpisode(t *testing.T) {
	const after = 10 * time.Second
	t0 := time.Unix(1_700_000_000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	note := store.ChildMessage{Seq: 7, Kind: manifest.MsgNote, Body: "working"}
	blocked := store.ChildMessage{Seq: 9, Kind: manifest.MsgBlocked, Body: "stuck"}
	var e idleEpisode
	for i, s := range []struct {
		sec    int
		act    agent.Activity
		last   store.ChildMessage
		report bool
	}{
		{0, agent.Idle, store.ChildMessage{}, false},    // the stretch begins
		{9, agent.Idle, store.ChildMessage{}, false},    // not yet
		{10, agent.Waiting, store.ChildMessage{}, true}, // idle_after: the first report
		{15, agent.Idle, store.ChildMessage{}, false},   // the cadence is from the report
		{20, agent.Idle, store.ChildMessage{}, true},    // the second
		{21, agent.Busy, store.ChildMessage{}, false},   // activity: over
		{22, agent.Idle, store.ChildMessage{}, false},   // a new stretch
		{31, agent.Idle, store.ChildMessage{}, false},
		{32, agent.Idle, store.ChildMessage{}, true},
		{33, agent.Idle, note, false}, // an accepted message: over, a new stretch
		{42, agent.Idle, note, false},
		{43, agent.Idle, note, true},
		{44, agent.Unknown, note, false},    // unknown does not count: over
		{45, agent.Waiting, blocked, false}, // blocked: suppressed
		{60, agent.Waiting, blocked, false},
		{100, agent.Waiting, blocked, false},
		{101, agent.Waiting, note2(), false}, // the next message lifts it: a new stretch
		{111, agent.Waiting, note2(), true},
	} {
		var report bool
		e, report = e.step(s.act, s.last, at(s.sec), after)
		if report != s.report {
			t.Fatalf("step %d (t=%ds, %s, last %q): report %v, want %v (episode %+v)", i, s.sec, s.act, s.last.Kind, report, s.report, e)
		}
	}
}

func note2() store.ChildMessage {
	return store.ChildMessage{Seq: 12, Kind: manifest.MsgQuestion, Body: "which way?"}
}

// TestIdleBody: the report names the child, the wait and the last
// message's kind and bounded first line, or none, then the pane tail.
func TestIdleBody(t *testing.T) {
	got := idleBody("fix-a", agent.Waiting, 95*time.Second, store.ChildMessage{}, "")
	if got != "`fix-a` has been idle for 1m35s (it needs input). Its last accepted message: none." {
		t.Fatalf("%q", got)
	}
	long := strings.Repeat("é", 300) + "\nsecond line"
	got = idleBody("fix-a", agent.Idle, 10*time.Second, store.ChildMessage{Seq: 1, Kind: "note", Body: long}, "❯ ")
	if !strings.Contains(got, "(its turn is over and it waits for a prompt). Its last accepted message: note: ") ||
		strings.Contains(got, "second line") || !strings.HasSuffix(got, "...\n\nPane tail:\n❯ ") || !utf8Valid(got) {
		t.Fatalf("%q", got)
	}
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "") == s }
