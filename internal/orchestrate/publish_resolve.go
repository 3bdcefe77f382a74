package orchestrate

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"agentbox/internal/manifest"
	"agentbox/internal/outboxread"
	"agentbox/internal/pubjournal"
	"agentbox/internal/shortname"
	"agentbox/internal/wire"
)

// DetailPublishInterrupted is the failed status of a publish whose broker
// stopped while an action was in flight.
const DetailPublishInterrupted = "the broker stopped while publishing"

// RecoverPublish finishes what a dead broker's publish workers left: a
// prepared action (its forge call may have been made) becomes uncertain
// and its proposal waits for a person; a proposal stopped between actions
// fails (publishing it again continues). Nothing is retried.
func (o *Orchestrator) RecoverPublish(ctx context.Context) {
	if o.Publishing == nil {
		return
	}
	all, err := o.Publishing.Journal.All()
	if err != nil {
		o.logger().Error("recover publish", "err", err)
		return
	}
	for _, j := range all {
		if j.State != pubjournal.Running {
			continue
		}
		i := j.Next()
		j.State = pubjournal.Halted
		if i < len(j.Actions) && j.Actions[i].State == pubjournal.Prepared {
			j.State = pubjournal.Blocked
			j.Actions[i].State, j.Actions[i].Detail = pubjournal.Uncertain, DetailPublishInterrupted+" after sending it (outcome uncertain: it may have been applied)"
		}
		if o.saveJournal(j) != nil {
			continue
		}
		o.logger().Warn("publish interrupted by a broker stop", "proposal", j.Key(), "state", j.State)
		detail := fmt.Sprintf("%s/%s: %s; publish it again with a new id to continue", j.Outbox, j.Name, DetailPublishInterrupted)
		if j.State == pubjournal.Blocked {
			detail = failedDetail(j, i)
		}
		o.publishFailed(ctx, j, detail)
	}
}

// Outboxes lists every publish journal (`jailbee outbox ls`).
func (o *Orchestrator) Outboxes() ([]*pubjournal.Journal, error) {
	if o.Publishing == nil {
		return nil, nil
	}
	return o.Publishing.Journal.All()
}

// Outbox returns the journal of key, "<sandbox>/<outbox>/<name>"
// (`jailbee outbox show`).
func (o *Orchestrator) Outbox(key string) (*pubjournal.Journal, error) {
	if o.Publishing == nil {
		return nil, refusef("%s", DetailPublishOff)
	}
	sandbox, outbox, name, ok := splitKey(key)
	if !ok {
		return nil, refusef("no proposal `%s` (want SANDBOX/OUTBOX/NAME, as `jailbee outbox ls` shows it)", key)
	}
	j, err := o.Publishing.Journal.Load(sandbox, outbox, name)
	if err == nil && j == nil {
		return nil, refusef("no proposal `%s`", key)
	}
	return j, err
}

func splitKey(key string) (sandbox, outbox, name string, ok bool) {
	parts := strings.Split(key, "/")
	if len(parts) != 3 || !shortname.Valid(parts[0]) || outboxread.Dirs[parts[1]] == "" || !manifest.ValidPublishName(parts[2]) {
		return "", "", "", false
	}
	return parts[0], parts[1], parts[2], true
}

// ResolveOutbox settles a blocked proposal's uncertain action, as a person
// decided: applied (with the URL they found) or retry (sent once more).
// Either way the proposal then continues with its actions not applied, in
// a worker, and its publish manifest gets a new final status.
func (o *Orchestrator) ResolveOutbox(ctx context.Context, key string, applied bool, url string) (*pubjournal.Journal, error) {
	j, err := o.Outbox(key)
	if err != nil {
		return nil, err
	}
	if j.State != pubjournal.Blocked {
		return nil, refusef("`%s` has no uncertain action (it is %s)", key, j.State)
	}
	if err := o.claimPublish(j.Sandbox, j.Ref); err != nil {
		return nil, err
	}
	i := j.Next()
	if applied {
		j.Actions[i] = pubjournal.Action{Kind: j.Actions[i].Kind, State: pubjournal.Applied, URL: url, Number: numberInURL(url),
			Detail: "resolved by hand as applied"}
	} else {
		j.Actions[i] = pubjournal.Action{Kind: j.Actions[i].Kind}
	}
	j.State = pubjournal.Running
	if err := o.saveJournal(j); err != nil {
		o.releasePublish(j.Sandbox)
		return nil, err
	}
	o.appendStatus(ctx, j.Sandbox, j.Ref, wire.StateStarted, fmt.Sprintf("%s/%s: resolved on the host, publishing continues", j.Outbox, j.Name))
	o.startPublish(&pubWork{sandbox: j.Sandbox, outbox: j.Outbox, name: j.Name, ref: j.Ref})
	return j, nil
}

// numberInURL is the issue or pull request number a URL a person gave
// ends in (.../issues/N, .../pull/N, before any #fragment), or 0: what a
// create the forge answered would have recorded.
func numberInURL(u string) int {
	u, _, _ = strings.Cut(u, "#")
	u, _, _ = strings.Cut(u, "?")
	parts := strings.Split(strings.TrimSuffix(u, "/"), "/")
	if len(parts) < 2 {
		return 0
	}
	switch parts[len(parts)-2] {
	case "issues", "pull", "pulls":
	default:
		return 0
	}
	n, err := strconv.Atoi(parts[len(parts)-1])
	if err != nil || n <= 0 || strconv.Itoa(n) != parts[len(parts)-1] {
		return 0
	}
	return n
}
