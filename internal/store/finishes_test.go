package store

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"agentbox/internal/wire"
)

// TestFinishLifecycle: a queued finish records the child's done head and
// a read queued status; a second queue of the same id is refused; the
// delivery that completes it removes it with an unread done status; a
// delivery of a finish already completed delivers nothing.
func TestFinishLifecycle(t *testing.T) {
	s, _ := openTestStore(t)
	ctx := context.Background()
	f := Finish{Child: "c", Parent: "o", ManifestID: "d-1", Head: "abc", Branch: "c", Kind: "done", Body: "b"}
	if _, _, err := s.BeginManifest(ctx, "c", "d-1", "message"); err != nil {
		t.Fatal(err)
	}
	sent, err := s.QueueFinish(ctx, f, "waiting")
	if err != nil || !sent.Status.Read || !sent.Fresh {
		t.Fatalf("queue: %+v %v", sent, err)
	}
	if _, err := s.QueueFinish(ctx, f, "waiting"); err == nil {
		t.Fatal("the same id queued twice")
	}
	if c, _ := s.Sandbox(ctx, "c"); c.DoneHead != "abc" || c.Cleanup {
		t.Fatalf("child after queue: %+v", c)
	}
	fs, err := s.Finishes(ctx, "o")
	if err != nil || len(fs) != 1 || fs[0].ManifestID != "d-1" || fs[0].Head != "abc" || fs[0].InReplyTo != nil {
		t.Fatalf("finishes: %+v %v", fs, err)
	}
	if ps, err := s.FinishParents(ctx); err != nil || len(ps) != 1 || ps[0] != "o" {
		t.Fatalf("parents: %v %v", ps, err)
	}
	d := Delivery{From: "c", To: "o", ManifestID: "d-1", Kind: "done", Body: "b", Journaled: true,
		StatusDetail: "delivered", DoneHead: "abc", Cleanup: true, Finish: fs[0].Seq}
	done, err := s.DeliverMessage(ctx, d)
	if err != nil || done.Status.Read {
		t.Fatalf("delivery: %+v %v", done, err)
	}
	if fs, _ := s.Finishes(ctx, "o"); len(fs) != 0 {
		t.Fatalf("finishes after delivery: %+v", fs)
	}
	if _, err := s.DeliverMessage(ctx, d); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a second delivery of the finish: %v", err)
	}
	if got, _ := s.ListItems(ctx, "o", true); len(got) != 1 {
		t.Fatalf("o's inbox: %d items, want the one report", len(got))
	}
	if c, _ := s.Sandbox(ctx, "c"); !c.Cleanup {
		t.Fatalf("child after delivery: %+v", c)
	}
}

// TestRefuseFinish: a finish whose orchestrator vanished is removed, the
// child's report no longer counts as accepted, and it gets an unread
// refused status; refusing it again does nothing.
func TestRefuseFinish(t *testing.T) {
	s, _ := openTestStore(t)
	ctx := context.Background()
	if _, _, err := s.BeginManifest(ctx, "c", "d-1", "message"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.QueueFinish(ctx, Finish{Child: "c", Parent: "o", ManifestID: "d-1", Head: "abc", Branch: "c", Kind: "done"}, "waiting"); err != nil {
		t.Fatal(err)
	}
	fs, _ := s.Finishes(ctx, "o")
	for range 2 {
		if err := s.RefuseFinish(ctx, fs[0], "gone"); err != nil {
			t.Fatal(err)
		}
	}
	unread, _ := s.ListItems(ctx, "c", false)
	if len(unread) != 1 {
		t.Fatalf("c's unread: %+v", unread)
	}
	var st wire.StatusItem
	json.Unmarshal(unread[0].Doc, &st)
	if st.Ref != "d-1" || st.State != wire.StateRefused || st.Detail != "gone" {
		t.Fatalf("status: %+v", st)
	}
	if c, _ := s.Sandbox(ctx, "c"); c.DoneHead != "" {
		t.Fatalf("child after refusal: %+v", c)
	}
	if fs, _ := s.Finishes(ctx, "o"); len(fs) != 0 {
		t.Fatalf("finishes after refusal: %+v", fs)
	}
}

// TestFinishGoesWithItsChild: destroying the child removes its finish.
func TestFinishGoesWithItsChild(t *testing.T) {
	s, _ := openTestStore(t)
	ctx := context.Background()
	s.BeginManifest(ctx, "c", "d-1", "message")
	if _, err := s.QueueFinish(ctx, Finish{Child: "c", Parent: "o", ManifestID: "d-1", Head: "abc", Branch: "c", Kind: "done"}, "waiting"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSandbox(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if ps, _ := s.FinishParents(ctx); len(ps) != 0 {
		t.Fatalf("parents after the child's delete: %v", ps)
	}
}
