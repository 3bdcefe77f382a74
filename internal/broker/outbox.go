package broker

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"unicode"

	"agentbox/internal/pubjournal"
	"agentbox/internal/wire"
)

// maxResolveURL bounds the URL a person gives `jailbee outbox resolve
// --applied`.
const maxResolveURL = 2048

// adminOutbox serves "outbox-ls", "outbox-show" and "outbox-resolve"; the
// resolve runs on the executor, in order with sends.
func (b *Broker) adminOutbox(ctx context.Context, op string, raw json.RawMessage, log *slog.Logger) *reply {
	var a wire.OutboxArgs
	if werr := decodeArgs(raw, &a); werr != nil {
		return replyErr(werr)
	}
	switch op {
	case "outbox-ls":
		all, err := b.orchestrator.Outboxes()
		if err != nil {
			return b.adminFailure(op, err, log)
		}
		return replyOK(outboxList(all))
	case "outbox-show":
		j, err := b.orchestrator.Outbox(a.Key)
		if err != nil {
			return b.adminFailure(op, err, log)
		}
		return replyOK(outboxShown(j))
	}
	if a.Applied == a.Retry {
		return replyErr(wire.Errorf(wire.CodeBadRequest, "give exactly one of --applied --url URL or --retry"))
	}
	if a.Applied && !resolveURL(a.URL) {
		return replyErr(wire.Errorf(wire.CodeBadRequest, "--applied needs --url: the http(s) URL of what was applied, at most %d bytes", maxResolveURL))
	}
	if a.Retry && a.URL != "" {
		return replyErr(wire.Errorf(wire.CodeBadRequest, "--url goes with --applied, not --retry"))
	}
	var r *reply
	err := b.runExec(ctx, nil, nil, func(ctx context.Context) {
		j, err := b.orchestrator.ResolveOutbox(ctx, a.Key, a.Applied, a.URL)
		if err != nil {
			r = b.adminFailure(op, err, log)
			return
		}
		log.Info("admin request done", "proposal", j.Key(), "applied", a.Applied)
		r = replyOK(j)
	})
	if err != nil {
		r = replyErr(err)
	}
	return r
}

// resolveURL reports whether u is a plain http(s) URL fit to be journaled
// and shown.
func resolveURL(u string) bool {
	if u == "" || len(u) > maxResolveURL || strings.ContainsFunc(u, unicode.IsSpace) || strings.ContainsFunc(u, unicode.IsControl) {
		return false
	}
	p, err := url.Parse(u)
	return err == nil && (p.Scheme == "https" || p.Scheme == "http") && p.Host != "" && p.User == nil
}

// outboxList is outbox-ls's answer within one reply line
// (maxResultBytes): each journal without its proposal (up to 1.5 MiB
// each; outbox-show has it), those not done first, and More when some had
// to be left out. Journals accumulate: done ones are kept (up to
// pubjournal.MaxJournals per sandbox).
func outboxList(all []*pubjournal.Journal) wire.OutboxList {
	list := wire.OutboxList{Proposals: []wire.OutboxJournal{}}
	slices.SortStableFunc(all, func(a, b *pubjournal.Journal) int {
		return boolOrder(a.State == pubjournal.Done) - boolOrder(b.State == pubjournal.Done)
	})
	budget := maxResultBytes - len(`{"proposals":[],"more":true}`)
	for _, j := range all {
		c := *j
		c.Proposal = nil
		raw, err := json.Marshal(c)
		if budget -= len(raw) + 1; err != nil || budget < 0 {
			list.More = true
			break
		}
		list.Proposals = append(list.Proposals, c)
	}
	return list
}

func boolOrder(b bool) int {
	if b {
		return 1
	}
	return 0
}

// outboxShown is outbox-show's answer: j, without its proposal when the
// two would not fit in one reply line.
func outboxShown(j *pubjournal.Journal) *pubjournal.Journal {
	if raw, err := json.Marshal(j); err == nil && len(raw) <= maxResultBytes {
		return j
	}
	c := *j
	c.Proposal = nil
	return &c
}
