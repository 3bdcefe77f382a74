package broker_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"agentbox/internal/inbox"
	"agentbox/internal/wire"
)

// TestCrashDuringConcurrentSendsKeepsEveryReply kills the broker while 8
// children send to their orchestrator at once (their commits share
// fsyncs): after a restart every send that got a reply is in the
// orchestrator's inbox exactly once, and resending every id, replied or
// cut off, delivers nothing twice.
func TestCrashDuringConcurrentSendsKeepsEveryReply(t *testing.T) {
	const senders, before = 8, 40
	bin, state, repo := jailbeeBin(t), shortTempDir(t), makeRepo(t)
	p := startProcBroker(t, bin, state)
	p.newSandbox(wire.NewArgs{Name: "orch", Repo: repo, Role: "orchestrator"})
	names := make([]string, senders)
	for i := range names {
		names[i] = fmt.Sprintf("k%d", i)
		p.newSandbox(wire.NewArgs{Name: names[i], Repo: repo, Branch: "work/" + names[i], Role: "child", Parent: "orch"})
	}

	// Each sender sends k<i>-1, k<i>-2, ... until the broker dies; replied
	// collects the ids whose "done" status came back, tried every id sent.
	var mu sync.Mutex
	replied, tried := map[string]bool{}, map[string]string{}
	enough := make(chan struct{})
	var wg sync.WaitGroup
	for _, name := range names {
		c := p.client(name)
		wg.Go(func() {
			for n := 1; ; n++ {
				id := fmt.Sprintf("%s-%d", name, n)
				mu.Lock()
				tried[id] = name
				mu.Unlock()
				var st wire.StatusItem
				m := map[string]any{"version": 1, "type": "message", "id": id, "body": "concurrent " + id}
				if err := c.Call(context.Background(), "send", map[string]any{"manifest": m}, &st); err != nil {
					return // the broker died
				}
				if st.State != wire.StateDone || st.Ref != id {
					t.Errorf("send %s: %+v", id, st)
					return
				}
				mu.Lock()
				replied[id] = true
				if len(replied) == before {
					close(enough)
				}
				mu.Unlock()
			}
		})
	}
	<-enough
	p.kill9()
	wg.Wait()
	if t.Failed() {
		return
	}

	p = startProcBroker(t, bin, state)
	orch := p.client("orch")
	delivered := func() map[string]int {
		count := map[string]int{}
		for _, it := range unread(t, orch) {
			if tried[it.OriginID] != it.From {
				t.Fatalf("orch has a message %s from %s that no one sent", it.OriginID, it.From)
			}
			count[it.OriginID]++
		}
		return count
	}
	got := delivered()
	for id := range replied {
		if got[id] != 1 {
			t.Errorf("send %s got a reply before the crash; after it orch has it %d times", id, got[id])
		}
	}
	for id, n := range got {
		if n != 1 {
			t.Errorf("orch has %s %d times", id, n)
		}
	}
	// Every sender resends all it tried: the replied ones answer their
	// recorded status, the cut-off ones are delivered now, once.
	clients := map[string]*inbox.Client{}
	for _, name := range names {
		clients[name] = p.client(name)
	}
	for id, name := range tried {
		st := sendMessage(t, clients[name], map[string]any{"id": id, "body": "concurrent " + id})
		if st.State != wire.StateDone || st.Ref != id {
			t.Fatalf("resend of %s after the crash: %+v", id, st)
		}
	}
	got = delivered()
	if len(got) != len(tried) {
		t.Errorf("after the resends orch has %d distinct messages, want %d", len(got), len(tried))
	}
	for id, n := range got {
		if n != 1 {
			t.Errorf("after the resends orch has %s %d times", id, n)
		}
	}
}
