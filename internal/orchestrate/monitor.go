package orchestrate

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"agentbox/internal/agent"
	"agentbox/internal/manifest"
	"agentbox/internal/store"
)

// livenessInterval paces the watch on a ready child's agent.
const livenessInterval = 5 * time.Second

// watchAgent watches a ready child's agent (the identity seen at
// readiness) until it ends, the child stops or goes, or its done report
// is accepted. An agent that ends without an accepted done sends the
// orchestrator a message of kind blocked. A live agent with an adapter
// is looked at for idle reports too (idle.go). A restarted broker resumes
// the watch (RecoverSpawns): the agent runs on in its sandbox. A watch
// watches the agent id alone: once the child's record names another (a
// restart's), that agent's own watch takes over and this one ends, so
// restarts never add watches.
func (o *Orchestrator) watchAgent(name string, id agent.Identity) {
	if o.Go == nil {
		return
	}
	o.Go(func(ctx context.Context) {
		var after time.Duration // the repository's idle_after_seconds, read once
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(livenessInterval):
			}
			sb, seen, ok := o.watchedAgent(ctx, name)
			if !ok || seen.Identity != id {
				return // gone, stopped, failed, done, its agent ended or replaced: nothing to watch
			}
			id, alive := o.observeAgent(ctx, name, seen.Window)
			if ctx.Err() != nil {
				return
			}
			if alive && id == seen.Identity {
				if after == 0 {
					after = idleAfter(sb.Repo)
				}
				o.checkIdle(ctx, sb, seen, after)
				continue
			}
			if !o.answers(ctx, name) {
				// Its sandbox is down (the broker's round records it
				// stopped and tells), or did not answer now: look again.
				continue
			}
			o.agentEnded(ctx, sb, seen)
			return
		}
	})
}

// watchedAgent reads sandbox name's record and its agent as last seen,
// when there is one to watch: the child is ready, its done not accepted,
// and its agent not seen ending.
func (o *Orchestrator) watchedAgent(ctx context.Context, name string) (store.Sandbox, agentSeen, bool) {
	sb, err := o.Store.Sandbox(ctx, name)
	if err != nil || sb.State != store.StateReady || sb.DoneHead != "" {
		return store.Sandbox{}, agentSeen{}, false
	}
	var seen agentSeen
	if json.Unmarshal([]byte(sb.Agent), &seen) != nil || seen.Ended {
		return store.Sandbox{}, agentSeen{}, false
	}
	return sb, seen, true
}

// agentEnded records that a child's agent ended and, unless its done was
// accepted meanwhile, tells its orchestrator: kind blocked.
func (o *Orchestrator) agentEnded(ctx context.Context, sb store.Sandbox, seen agentSeen) {
	o.serial(ctx, func(ctx context.Context) {
		// Another watch of the same agent (a restarted agent's) told already.
		if _, cur, ok := o.watchedAgent(ctx, sb.Name); !ok || cur.Identity != seen.Identity {
			return
		}
		seen.Ended = true
		raw, _ := json.Marshal(seen)
		if err := o.Store.SetAgent(ctx, sb.Name, string(raw)); err != nil {
			return
		}
		body := fmt.Sprintf("the agent of `%s` (%s) ended without reporting done; the child keeps running: message it, or restart, import, stop or destroy it", sb.Name, seen.Window)
		if _, err := o.Store.DeliverHostMessage(ctx, sb.Parent, sb.Name, manifest.MsgBlocked, body); err != nil {
			o.logger().Error("deliver blocked", "sandbox", sb.Name, "err", err)
			return
		}
		o.logger().Info("agent ended without done", "sandbox", sb.Name)
		o.notify(sb.Parent)
	})
}
