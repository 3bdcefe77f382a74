package orchestrate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"agentbox/internal/crashpoint"
	"agentbox/internal/forge"
	"agentbox/internal/gitx"
	"agentbox/internal/grant"
	"agentbox/internal/manifest"
	"agentbox/internal/outboxread"
	"agentbox/internal/pubjournal"
	"agentbox/internal/store"
	"agentbox/internal/wire"
)

// DefaultActionsPerHour is an orchestrator's publish budget when
// broker.yaml sets none.
const DefaultActionsPerHour = 30

// DefaultBytesPerHour is what an orchestrator's sources may bring into
// the user's repository in any hour when broker.yaml sets none: one
// transfer of the largest size. Each transfer may bring gitx's
// MaxTransferBytes, and a publish a minute would otherwise fill the
// user's disk by the hour (a hostile upload-pack sends what it likes).
const DefaultBytesPerHour = gitx.MaxTransferBytes

// Publishing is what the broker gives the publish manifest: the forge
// with the host's credentials, the journals and the budget.
type Publishing struct {
	Forge          forge.Forge
	Journal        *pubjournal.Dir
	ActionsPerHour int
	// BytesPerHour bounds what one orchestrator's sources bring into the
	// user's repository in any hour (0: DefaultBytesPerHour).
	BytesPerHour int64
	// GitURL is broker.yaml forge.git_url: a repository's git remote,
	// with {owner} and {name}. Token authenticates pushes to it.
	GitURL string
	Token  string
}

// DetailPublishOff refuses publish on a broker without a forge.
const DetailPublishOff = "publishing is not configured on this broker (broker.yaml forge)"

// DetailTooManyJournals refuses a new proposal of an orchestrator whose
// journals are at pubjournal.MaxJournals with none finished to make room.
var DetailTooManyJournals = fmt.Sprintf("this orchestrator has %d publish journals and none is done or failed: "+
	"a person resolves its blocked proposals first (jailbee outbox ls)", pubjournal.MaxJournals)

// pubWork is one admitted publish: the journal key and the actions left.
type pubWork struct {
	sandbox, outbox, name, ref string
	issues                     *manifest.IssueProposal
	pr                         *manifest.PRManifest
}

// Publish runs a publish manifest: the manifest is read from the
// requester's own outbox inside its sandbox, decoded, its actions' budget
// reserved, checked against the grant (a refusal refunds the budget), and
// journaled; the answer is started, and a worker applies the actions and
// appends done or failed.
func (o *Orchestrator) Publish(ctx context.Context, req wire.Caller, m *manifest.Manifest, from manifest.Sender) (store.Sent, error) {
	prev, found, err := o.Store.BeginManifest(ctx, req.Sandbox, m.ID, string(m.Type))
	if err != nil || found {
		return prev, err
	}
	w, detail, err := o.admitPublish(ctx, req, m, from)
	if r, ok := AsRefusal(err); ok {
		return o.Store.FinishManifest(ctx, req.Sandbox, m.ID, wire.StateRefused, r.Detail)
	}
	if err != nil {
		o.logger().Error("manifest failed", "sandbox", req.Sandbox, "manifest", m.ID, "type", m.Type, "err", err)
		return o.Store.FinishManifest(ctx, req.Sandbox, m.ID, wire.StateFailed, "publish failed (see the broker log)")
	}
	sent, err := o.Store.FinishManifest(ctx, req.Sandbox, m.ID, wire.StateStarted, detail)
	o.startPublish(w)
	return sent, err
}

// admitPublish holds the requester's publish slot from here until its
// worker ends (released at once on a refusal or a fault).
func (o *Orchestrator) admitPublish(ctx context.Context, req wire.Caller, m *manifest.Manifest, from manifest.Sender) (w *pubWork, detail string, err error) {
	p := o.Publishing
	if p == nil || p.Forge == nil || p.Journal == nil {
		return nil, "", refusef("%s", DetailPublishOff)
	}
	if err := o.claimPublish(req.Sandbox, m.ID); err != nil {
		return nil, "", err
	}
	defer func() {
		if err != nil {
			o.releasePublish(req.Sandbox)
		}
	}()
	pub := m.Publish
	read, err := o.readOutbox(ctx, req.Sandbox, pub.Outbox, pub.Manifest)
	if err != nil {
		return nil, "", err
	}
	w = &pubWork{sandbox: req.Sandbox, outbox: pub.Outbox, name: pub.Manifest, ref: m.ID}
	canonical, kinds, err := w.decode(read.Manifest)
	if err != nil {
		return nil, "", err
	}
	prev, err := p.Journal.Load(w.sandbox, w.outbox, w.name)
	if err != nil {
		return nil, "", err
	}
	if err := continuable(prev, w, canonical); err != nil {
		return nil, "", err
	}
	left := len(kinds)
	if prev != nil {
		left -= prev.Next()
	}
	if err := p.Journal.Reserve(w.sandbox, m.ID, left, p.actionsPerHour(), time.Now()); err != nil {
		var be *pubjournal.BudgetError
		if errors.As(err, &be) {
			return nil, "", refusef("%s", be.Error())
		}
		return nil, "", err
	}
	// The policy runs with the budget reserved; its refusal gives it back.
	if err := o.publishPolicy(ctx, from, w, read, kinds); err != nil {
		if rerr := p.Journal.Refund(w.sandbox, m.ID); rerr != nil {
			return nil, "", rerr
		}
		return nil, "", err
	}
	if err := p.Journal.Update(w.sandbox, w.outbox, w.name, func(*pubjournal.Journal) (*pubjournal.Journal, error) {
		return running(prev, w, canonical, kinds), nil
	}); err != nil {
		if errors.Is(err, pubjournal.ErrTooManyJournals) {
			if rerr := p.Journal.Refund(w.sandbox, m.ID); rerr != nil {
				return nil, "", rerr
			}
			return nil, "", refusef("%s", DetailTooManyJournals)
		}
		return nil, "", err
	}
	return w, fmt.Sprintf("publishing %s/%s: %d action(s)", w.outbox, w.name, left), nil
}

func (p *Publishing) bytesPerHour() int64 {
	if p.BytesPerHour <= 0 {
		return DefaultBytesPerHour
	}
	return p.BytesPerHour
}

func (p *Publishing) actionsPerHour() int {
	if p.ActionsPerHour <= 0 {
		return DefaultActionsPerHour
	}
	return p.ActionsPerHour
}

// claimPublish takes sandbox's one publish slot (spec: "One request runs
// per orchestrator"): a second request is refused, not queued.
func (o *Orchestrator) claimPublish(sandbox, ref string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if running, ok := o.publishing[sandbox]; ok {
		return refusef("publish `%s` of this orchestrator is still running: send again with a new id once it has finished", running)
	}
	if o.publishing == nil {
		o.publishing = map[string]string{}
	}
	o.publishing[sandbox] = ref
	return nil
}

func (o *Orchestrator) releasePublish(sandbox string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.publishing, sandbox)
}

// readOutbox runs `jailbee _outbox-read` as the agent user in the
// requester's sandbox and reads its answer as hostile bytes.
func (o *Orchestrator) readOutbox(ctx context.Context, sandbox, outbox, name string) (outboxread.Result, error) {
	var r outboxread.Result
	out, err := o.lookAt(ctx, sandbox, outboxread.Argv(outbox, name), outboxread.MaxOutput+1)
	if err != nil || len(out) > outboxread.MaxOutput || json.Unmarshal(bytes.TrimSpace(out), &r) != nil {
		if errors.Is(err, errInterrupted) {
			return r, err
		}
		return r, refusef("your %s outbox could not be read", outbox)
	}
	where := fmt.Sprintf("`%s` in your %s outbox (~/%s)", name, outbox, outboxread.Dirs[outbox])
	switch r.Error {
	case "":
		return r, nil
	case outboxread.ErrMissing:
		return r, refusef("%s does not exist", where)
	case outboxread.ErrNotRegular:
		return r, refusef("%s is not a regular file (symlinks are refused)", where)
	case outboxread.ErrTooLarge:
		return r, refusef("%s exceeds %d bytes", where, manifest.MaxOutboxBytes)
	}
	return r, refusef("%s cannot be read", where)
}

// decode decodes the outbox manifest strictly; it returns its canonical
// form and its action kinds, one per action (a source or review is one).
func (w *pubWork) decode(raw []byte) ([]byte, []string, error) {
	if w.outbox == manifest.OutboxIssue {
		p, err := manifest.DecodeIssueProposal(raw)
		if err != nil {
			return nil, nil, refusef("`%s`: %v", w.name, err)
		}
		w.issues = p
		kinds := make([]string, len(p.Actions))
		for i, a := range p.Actions {
			kinds[i] = a.Kind
		}
		return p.Encode(), kinds, nil
	}
	m, err := manifest.DecodePRManifest(raw)
	if err != nil {
		return nil, nil, refusef("`%s`: %v", w.name, err)
	}
	w.pr = m
	kind := manifest.PRSourceKind
	if m.Review != nil {
		kind = manifest.PRReviewKind
	}
	return m.Encode(), []string{kind}, nil
}

// continuable refuses a proposal whose journal says it was published, or
// waits for a person, or that changed since a publish that failed part way
// (which continues with the actions not applied).
func continuable(prev *pubjournal.Journal, w *pubWork, canonical []byte) error {
	if prev == nil {
		return nil
	}
	key := w.outbox + "/" + w.name
	switch prev.State {
	case pubjournal.Done:
		return refusef("`%s` was published already: stage a new manifest under a new name", key)
	case pubjournal.Blocked:
		return refusef("`%s` has an action whose outcome is uncertain: it waits for a person (jailbee outbox resolve %s)", key, prev.Key())
	case pubjournal.Running:
		return refusef("`%s` is being published", key)
	}
	if !bytes.Equal(prev.Proposal, canonical) {
		return refusef("`%s` changed since its publish failed part way: stage the rest under a new name", key)
	}
	return nil
}

// running is the journal of an admitted publish: new, or the failed one
// continued (its failed action pending again).
func running(prev *pubjournal.Journal, w *pubWork, canonical []byte, kinds []string) *pubjournal.Journal {
	j := &pubjournal.Journal{Sandbox: w.sandbox, Outbox: w.outbox, Name: w.name, Proposal: canonical}
	if prev != nil {
		j = prev
	} else {
		for _, k := range kinds {
			j.Actions = append(j.Actions, pubjournal.Action{Kind: k})
		}
	}
	j.Ref, j.State = w.ref, pubjournal.Running
	for i := range j.Actions {
		if j.Actions[i].State == pubjournal.Failed {
			j.Actions[i] = pubjournal.Action{Kind: j.Actions[i].Kind}
		}
	}
	return j
}

// publishPolicy is the grant's word on the proposal, and the pending cap.
func (o *Orchestrator) publishPolicy(ctx context.Context, from manifest.Sender, w *pubWork, read outboxread.Result, kinds []string) error {
	eff := from.Grant.Capped(from.Repo.Orchestration.Cap)
	var err error
	switch {
	case w.issues != nil:
		err = grant.CheckIssues(eff, w.issues.Repo, grant.Dedupe(kinds))
	case w.pr.Source != nil:
		err = grant.CheckPullRequests(eff, false)
	default:
		err = grant.CheckPullRequests(eff, true)
	}
	if err != nil {
		return refusef("%v", err)
	}
	if err := o.pendingCap(w.sandbox, read); err != nil {
		return err
	}
	if w.pr != nil {
		return o.prPolicy(ctx, w)
	}
	return nil
}

// pendingCap refuses when the requester's outboxes hold more than
// MaxOutboxPending pending manifests: staged ones whose journal is not done.
// The listing is the sandbox's bytes: one longer than the helper writes
// (MaxListed per outbox) is refused before any journal is looked at, as
// each look locks the journals of every sandbox.
func (o *Orchestrator) pendingCap(sandbox string, read outboxread.Result) error {
	tooMany := refusef("your outboxes hold more than %d pending manifests: remove the published or abandoned ones", manifest.MaxOutboxPending)
	if read.More || len(read.Staged) > len(outboxread.Dirs)*outboxread.MaxListed {
		return tooMany
	}
	pending := 0
	for _, s := range read.Staged {
		outbox, name, _ := strings.Cut(s, "/")
		if outboxread.Dirs[outbox] == "" || !manifest.ValidPublishName(name) {
			continue
		}
		state, err := o.Publishing.Journal.State(sandbox, outbox, name)
		if err != nil {
			return err
		}
		if state != pubjournal.Done {
			pending++
		}
		if pending > manifest.MaxOutboxPending {
			return tooMany
		}
	}
	return nil
}

// startPublish runs w's actions in a worker, which releases the slot.
func (o *Orchestrator) startPublish(w *pubWork) {
	if o.Go == nil {
		o.releasePublish(w.sandbox)
		return
	}
	o.Go(func(ctx context.Context) {
		defer o.releasePublish(w.sandbox)
		o.runPublish(ctx, w.sandbox, w.outbox, w.name)
	})
}

// runPublish applies a running journal's actions in order, each journaled
// prepared before its forge call and applied (or uncertain, or failed)
// after, and appends the publish manifest's final status.
func (o *Orchestrator) runPublish(ctx context.Context, sandbox, outbox, name string) {
	dir := o.Publishing.Journal
	j, err := dir.Load(sandbox, outbox, name)
	if err != nil || j == nil {
		o.logger().Error("publish journal", "sandbox", sandbox, "outbox", outbox, "name", name, "err", err)
		return
	}
	for i := j.Next(); i < len(j.Actions); i++ {
		j.Actions[i].State = pubjournal.Prepared
		if err := o.saveJournal(j); err != nil {
			o.publishFailed(ctx, j, "the publish journal could not be written (see the broker log)")
			return
		}
		res, err := o.applyAction(ctx, j, i)
		crashpoint.Hit(crashpoint.PublishCalled)
		a := &j.Actions[i]
		switch {
		case err == nil:
			a.State, a.URL, a.Number = pubjournal.Applied, res.URL, res.Number
		case forge.Uncertain(err):
			a.State, a.Detail, j.State = pubjournal.Uncertain, safeForgeText(err), pubjournal.Blocked
		default:
			a.State, a.Detail, j.State = pubjournal.Failed, safeForgeText(err), pubjournal.Halted
		}
		if serr := o.saveJournal(j); serr != nil {
			o.logger().Error("publish journal", "proposal", j.Key(), "err", serr)
		}
		if err != nil {
			o.publishFailed(ctx, j, failedDetail(j, i))
			return
		}
	}
	j.State = pubjournal.Done
	if err := o.saveJournal(j); err != nil {
		o.logger().Error("publish journal", "proposal", j.Key(), "err", err)
	}
	o.appendStatus(ctx, j.Sandbox, j.Ref, wire.StateDone, publishedDetail(j))
}

func (o *Orchestrator) saveJournal(j *pubjournal.Journal) error {
	err := o.Publishing.Journal.Update(j.Sandbox, j.Outbox, j.Name, func(*pubjournal.Journal) (*pubjournal.Journal, error) { return j, nil })
	if err != nil {
		o.logger().Error("publish journal", "proposal", j.Key(), "err", err)
	}
	return err
}

func (o *Orchestrator) publishFailed(ctx context.Context, j *pubjournal.Journal, detail string) {
	o.appendStatus(ctx, j.Sandbox, j.Ref, wire.StateFailed, detail)
}

// actionResult is what an applied action left to show: a URL, and the
// number of an issue or pull request it created or touched.
type actionResult struct {
	URL    string
	Number int
}

// applyAction makes action i's forge call. The proposal is the journal's
// canonical copy, decoded again (it was checked when admitted).
func (o *Orchestrator) applyAction(ctx context.Context, j *pubjournal.Journal, i int) (actionResult, error) {
	f := o.Publishing.Forge
	if j.Outbox == manifest.OutboxPR {
		return o.applyPR(ctx, j)
	}
	p, err := manifest.DecodeCanonicalIssueProposal(j.Proposal)
	if err != nil {
		return actionResult{}, &forge.Error{Op: "publish", Certain: true, Msg: "the journaled proposal cannot be read"}
	}
	repo, err := forge.ParseRepo(p.Repo)
	if err != nil {
		return actionResult{}, &forge.Error{Op: "publish", Certain: true, Msg: err.Error()}
	}
	a := p.Actions[i]
	if a.Kind != grant.IssueCreate {
		// GitHub's issue calls act on pull requests too: the issue rights
		// must not reach one (a review needs its own right and a bound
		// pull request).
		isPR, err := f.IsPullRequest(ctx, repo, a.Issue)
		if err != nil {
			return actionResult{}, err
		}
		if isPR {
			return actionResult{}, &forge.Error{Op: a.Kind, Certain: true,
				Msg: fmt.Sprintf("#%d is a pull request: issue actions act on issues only", a.Issue)}
		}
	}
	switch a.Kind {
	case grant.IssueCreate:
		is, err := f.CreateIssue(ctx, repo, a.Title, a.Body, a.Labels)
		return actionResult{URL: is.URL, Number: is.Number}, err
	case grant.IssueComment:
		url, err := f.Comment(ctx, repo, a.Issue, a.Body)
		return actionResult{URL: url, Number: a.Issue}, err
	case grant.IssueLabel:
		return actionResult{Number: a.Issue}, f.AddLabels(ctx, repo, a.Issue, a.Labels)
	default:
		url, err := f.CloseIssue(ctx, repo, a.Issue)
		return actionResult{URL: url, Number: a.Issue}, err
	}
}

// safeForgeText is what a requester may read of a forge failure: a
// *forge.Error's own text (never the token nor the forge's raw answer),
// else a fixed text.
func safeForgeText(err error) string {
	var fe *forge.Error
	if errors.As(err, &fe) {
		return fe.Error() // bounded by the forge (forge.MaxMessageBytes)
	}
	return "the forge call failed (outcome uncertain: it may have been applied)"
}

func failedDetail(j *pubjournal.Journal, i int) string {
	a := j.Actions[i]
	detail := fmt.Sprintf("%s/%s: action %d (%s) failed: %s", j.Outbox, j.Name, i+1, a.Kind, a.Detail)
	if a.State == pubjournal.Uncertain {
		return detail + fmt.Sprintf("; nothing more is done until a person resolves it (jailbee outbox resolve %s)", j.Key())
	}
	if applied := doneList(j); applied != "" {
		detail += "; applied before: " + applied
	}
	return detail + "; publish it again with a new id to continue with the actions not applied"
}

func publishedDetail(j *pubjournal.Journal) string {
	return fmt.Sprintf("published %s/%s: %s", j.Outbox, j.Name, doneList(j))
}

// doneList names every applied action with its issue number and URL.
func doneList(j *pubjournal.Journal) string {
	var parts []string
	for _, a := range j.Actions {
		if a.State != pubjournal.Applied {
			continue
		}
		s := a.Kind
		if a.Number > 0 {
			s += fmt.Sprintf(" #%d", a.Number)
		}
		if a.URL != "" {
			s += " " + a.URL
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}
