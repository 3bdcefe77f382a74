package orchestrate

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"agentbox/internal/agent"
	"agentbox/internal/backend"
	"agentbox/internal/config"
	"agentbox/internal/manifest"
	"agentbox/internal/store"
)

// Idle reports (the spec's idle passage): a ready child whose agent has an
// adapter (Claude Code) and has been waiting for input, or idle with no
// subagent history, for the repository's orchestration.idle_after_seconds
// gets its orchestrator a host message of kind idle, then another each
// idle_after_seconds while it stays so. Busy or unknown, or a new accepted
// message of the child, ends the stretch; an accepted blocked suppresses
// reports until the child's next accepted message; an accepted done, a stop
// or a destroy ends the watch (watchAgent), and the episode is kept in the
// child's agent record so that a restarted broker carries on.

// idleEpisode is the state of a child's idle reports, in its agent record.
type idleEpisode struct {
	// Since is when the current stretch of waiting began (Unix ms, 0:
	// none); Reported when it was last reported (0: not yet).
	Since    int64 `json:"since,omitempty"`
	Reported int64 `json:"reported,omitempty"`
	// MsgSeq is the child's last accepted message the watch has seen: a
	// newer one resets the episode.
	MsgSeq int64 `json:"msg_seq,omitempty"`
}

// step is the episode after one look at the agent: its activity, the
// child's last accepted message, now; report says an idle report is due.
func (e idleEpisode) step(a agent.Activity, last store.ChildMessage, now time.Time, after time.Duration) (next idleEpisode, report bool) {
	if last.Seq != e.MsgSeq {
		e = idleEpisode{MsgSeq: last.Seq}
	}
	if last.Kind == manifest.MsgBlocked || !a.Counts() {
		return idleEpisode{MsgSeq: e.MsgSeq}, false
	}
	ms := now.UnixMilli()
	if e.Since == 0 {
		e.Since = ms
		return e, false
	}
	due := e.Since + after.Milliseconds()
	if e.Reported != 0 {
		due = e.Reported + after.Milliseconds()
	}
	if ms < due {
		return e, false
	}
	e.Reported = ms
	return e, true
}

// idleAfter is the repository's orchestration.idle_after_seconds (its
// default when the config cannot be read).
func idleAfter(repo string) time.Duration {
	secs := config.DefaultIdleAfterSeconds
	if cfg, err := LoadRepoConfig(repo); err == nil && cfg.Orchestration.IdleAfterSeconds > 0 {
		secs = cfg.Orchestration.IdleAfterSeconds
	}
	return time.Duration(secs) * time.Second
}

// maxFirstLine bounds the first line of the child's last message quoted in
// an idle report.
const maxFirstLine = 200

// checkIdle takes one look at a ready child's live agent (seen) for its
// idle reports: agents without an adapter are left alone.
func (o *Orchestrator) checkIdle(ctx context.Context, sb store.Sandbox, seen agentSeen, after time.Duration) {
	var doc spawnDoc
	if json.Unmarshal([]byte(sb.SpawnDoc), &doc) != nil || !doc.Agent.IsClaude() {
		return
	}
	act := o.claudeActivity(ctx, sb.Name, seen.Identity)
	o.logger().Debug("agent activity", "sandbox", sb.Name, "activity", act)
	last, err := o.Store.LastChildMessage(ctx, sb.Parent, sb.Name)
	if err != nil || ctx.Err() != nil {
		return
	}
	now := time.Now()
	next, report := seen.Idle.step(act, last, now, after)
	if next == seen.Idle {
		return
	}
	var tail string
	if report {
		tail = o.paneTail(ctx, sb.Name, seen.Window)
	}
	o.serial(ctx, func(ctx context.Context) {
		_, curSeen, ok := o.watchedAgent(ctx, sb.Name)
		if !ok || curSeen.Identity != seen.Identity || curSeen.Idle != seen.Idle {
			return // ended meanwhile, another agent, or another look came first
		}
		// A message of the child accepted since the look changes the
		// episode: the next look sees it.
		if now, err := o.Store.LastChildMessage(ctx, sb.Parent, sb.Name); err != nil || now.Seq != last.Seq {
			return
		}
		curSeen.Idle = next
		raw, _ := json.Marshal(curSeen)
		if err := o.Store.SetAgent(ctx, sb.Name, string(raw)); err != nil {
			return
		}
		if !report {
			return
		}
		body := idleBody(sb.Name, act, time.Duration(next.Reported-next.Since)*time.Millisecond, last, tail)
		if _, err := o.Store.DeliverHostReply(ctx, sb.Parent, sb.Name, manifest.MsgIdle, body, doc.Ref); err != nil {
			o.logger().Error("deliver idle", "sandbox", sb.Name, "err", err)
			return
		}
		o.logger().Info("agent idle reported", "sandbox", sb.Name, "activity", act)
		o.notify(sb.Parent)
	})
}

// claudeActivity probes the Claude agent id inside the sandbox.
func (o *Orchestrator) claudeActivity(ctx context.Context, name string, id agent.Identity) agent.Activity {
	out, err := o.lookAt(ctx, name, agent.ProbeArgv(id.PID), agent.MaxProbeOutput+1)
	if err != nil {
		o.logger().Debug("agent probe failed", "sandbox", name, "err", err)
		return agent.Unknown
	}
	p, err := agent.ParseProbe(out)
	if err != nil {
		o.logger().Debug("agent probe unreadable", "sandbox", name, "err", err)
		return agent.Unknown
	}
	o.logger().Debug("agent probe", "sandbox", name, "probe", string(out))
	return agent.ClaudeActivity(p, id, backend.WorkspacePath)
}

// paneTail is the agent's pane tail for a report ("" when it cannot be
// read).
func (o *Orchestrator) paneTail(ctx context.Context, name, window string) string {
	out, err := o.lookAt(ctx, name, agent.CaptureArgv(window), 64<<10)
	if err != nil {
		return ""
	}
	return agent.PaneTail(out)
}

// idleBody is an idle report's text: the child, how long it has waited,
// its last accepted message's kind and first line (or none), then the
// pane tail when there is one.
func idleBody(child string, act agent.Activity, waited time.Duration, last store.ChildMessage, tail string) string {
	what := "its turn is over and it waits for a prompt"
	if act == agent.Waiting {
		what = "it needs input"
	}
	lastMsg := "none"
	if last.Seq != 0 {
		first, _, _ := strings.Cut(last.Body, "\n")
		if len(first) > maxFirstLine {
			first = strings.ToValidUTF8(first[:maxFirstLine], "") + "..."
		}
		lastMsg = fmt.Sprintf("%s: %s", last.Kind, first)
	}
	body := fmt.Sprintf("`%s` has been idle for %s (%s). Its last accepted message: %s.", child, waited.Round(time.Second), what, lastMsg)
	if tail != "" {
		body += "\n\nPane tail:\n" + tail
	}
	return body
}
