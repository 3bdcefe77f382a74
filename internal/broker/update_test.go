package broker_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"agentbox/internal/store"
)

// TestUpdateTransport: an update without merge fetches the orchestrator's
// current branch (or an explicit ref, or a host base) into the running
// child at the spec's refs, touches nothing else there, and leaves the
// child a message of kind update with the exact ref and commit.
func TestUpdateTransport(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	e.child("kid", "orch")
	orch, kid := e.client("orch"), e.client("kid")
	kidHead := e.mustExec("kid", "git", "rev-parse", "HEAD")

	e.mustExec("orch", "sh", "-c", "echo o > o.txt && git add o.txt && "+commitCmd+" -m o")
	branch := e.mustExec("orch", "git", "symbolic-ref", "--short", "HEAD")
	orchHead := e.mustExec("orch", "git", "rev-parse", "HEAD")
	ref := "refs/jailbee/from/orch/" + branch

	wantStatus(t, sendManifest(t, orch, map[string]any{"id": "up-1", "type": "update", "child": "kid"}),
		"done", "delivered to kid: "+ref+" at "+orchHead[:12])
	if got := e.mustExec("kid", "git", "rev-parse", ref); got != orchHead {
		t.Fatalf("%s in the child = %s, want %s", ref, got, orchHead)
	}
	if got := e.mustExec("kid", "sh", "-c", "git rev-parse HEAD; git status --porcelain; test -e o.txt || echo no-o"); got != kidHead+"\nno-o" {
		t.Fatalf("the child after an update without merge: %q", got)
	}
	msg := messageFrom(t, kid, "orch", "update")
	if msg.OriginID != "up-1" || msg.ImportedRef != ref || msg.ImportedSHA != orchHead || msg.MergedHead != "" {
		t.Fatalf("update message %+v", msg)
	}
	// A resend answers the same and delivers nothing new.
	e.mustExec("orch", "sh", "-c", commitCmd+" --allow-empty -m more")
	wantStatus(t, sendManifest(t, orch, map[string]any{"id": "up-1", "type": "update", "child": "kid"}),
		"done", "delivered to kid: "+ref+" at "+orchHead[:12])
	if got := e.mustExec("kid", "git", "rev-parse", ref); got != orchHead {
		t.Fatalf("a resend updated again: %s", got)
	}

	// An explicit ref (here the older commit, by id) and a host base land
	// at refs/jailbee/update/<orchestrator>/<id>.
	wantStatus(t, sendManifest(t, orch, map[string]any{"id": "up-2", "type": "update", "child": "kid", "ref": orchHead}),
		"done", "delivered to kid: refs/jailbee/update/orch/up-2 at "+orchHead[:12])
	hostHead := hostGit(t, e.repo, "rev-parse", "main")
	wantStatus(t, sendManifest(t, orch, map[string]any{"id": "up-3", "type": "update", "child": "kid", "base": "main"}),
		"done", "delivered to kid: refs/jailbee/update/orch/up-3 at "+hostHead[:12])
	if got := e.mustExec("kid", "git", "rev-parse", "refs/jailbee/update/orch/up-3"); got != hostHead {
		t.Fatalf("base update landed %s, want %s", got, hostHead)
	}
	if msg := messageFrom(t, kid, "orch", "update"); msg.OriginID != "up-2" || msg.ImportedRef != "refs/jailbee/update/orch/up-2" {
		t.Fatalf("ref update message %+v", msg)
	}

	// A detached orchestrator needs a selector; the refusals name no host path.
	e.mustExec("orch", "git", "checkout", "-q", "--detach")
	wantStatus(t, sendManifest(t, orch, map[string]any{"id": "up-4", "type": "update", "child": "kid"}),
		"refused", "your HEAD is detached: check out a branch, or name a source with --ref or --base")
	wantStatus(t, sendManifest(t, orch, map[string]any{"id": "up-5", "type": "update", "child": "kid", "ref": "refs/heads/nope"}),
		"refused", "`ref` refs/heads/nope names no commit in your repository")
	wantStatus(t, sendManifest(t, orch, map[string]any{"id": "up-6", "type": "update", "child": "kid", "base": "nope"}),
		"refused", "base `nope` is not a branch of the host repository")

	// A stopped child is refused; so is a child of another orchestrator.
	wantStatus(t, sendManifest(t, orch, map[string]any{"id": "stop-1", "type": "stop", "child": "kid"}), "done", "child `kid` stopped")
	wantStatus(t, sendManifest(t, orch, map[string]any{"id": "up-7", "type": "update", "child": "kid", "ref": orchHead}),
		"refused", "`kid` is stopped: restart it before updating it")
	e.orchestrator("other")
	wantStatus(t, sendManifest(t, e.client("other"), map[string]any{"id": "up-1", "type": "update", "child": "kid"}),
		"refused", "`kid` is not a child of this orchestrator")
}

// TestUpdateMerge: merge: true fast-forwards, makes a merge commit, or
// leaves HEAD alone, and reports the child's new HEAD as merged_head; it
// refuses a dirty, detached or conflicting child without moving its HEAD.
func TestUpdateMerge(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	e.child("kid", "orch")
	orch, kid := e.client("orch"), e.client("kid")
	update := func(id string) map[string]any {
		return map[string]any{"id": id, "type": "update", "child": "kid", "merge": true}
	}
	commit := func(name, file, content string) string {
		e.mustExec(name, "sh", "-c", "echo "+content+" > "+file+" && git add "+file+" && "+commitCmd+" -m "+file)
		return e.mustExec(name, "git", "rev-parse", "HEAD")
	}
	kidHead := func() string { return e.mustExec("kid", "git", "rev-parse", "HEAD") }

	// Fast-forward: the child has nothing of its own yet.
	o1 := commit("orch", "o1.txt", "o1")
	wantStatus(t, sendManifest(t, orch, update("m-1")), "done",
		"delivered to kid: refs/jailbee/from/orch/main at "+o1[:12]+"; work/kid fast-forwarded to "+o1[:12])
	if got := kidHead(); got != o1 {
		t.Fatalf("after a fast-forward the child is at %s, want %s", got, o1)
	}
	if msg := messageFrom(t, kid, "orch", "update"); msg.MergedHead != o1 || msg.ImportedSHA != o1 {
		t.Fatalf("fast-forward message %+v", msg)
	}

	// Divergent: a merge commit on the child's branch, both sides' files there.
	k1 := commit("kid", "k1.txt", "k1")
	o2 := commit("orch", "o2.txt", "o2")
	st := sendManifest(t, orch, update("m-2"))
	merged := kidHead()
	wantStatus(t, st, "done", "delivered to kid: refs/jailbee/from/orch/main at "+o2[:12]+"; merged into work/kid as "+merged[:12])
	if parents := e.mustExec("kid", "git", "rev-list", "--parents", "-n1", "HEAD"); parents != merged+" "+k1+" "+o2 {
		t.Fatalf("merge commit parents: %q", parents)
	}
	if got := e.mustExec("kid", "sh", "-c", "cat k1.txt o2.txt; git status --porcelain; git symbolic-ref --short HEAD"); got != "k1\no2\nwork/kid" {
		t.Fatalf("the child after the merge: %q", got)
	}
	if msg := messageFrom(t, kid, "orch", "update"); msg.MergedHead != merged {
		t.Fatalf("merge message %+v, want merged_head %s", msg, merged)
	}

	// Already contained: HEAD stays, no merged_head.
	wantStatus(t, sendManifest(t, orch, update("m-3")), "done",
		"delivered to kid: refs/jailbee/from/orch/main at "+o2[:12]+"; already contained in work/kid, HEAD unchanged")
	if msg := messageFrom(t, kid, "orch", "update"); msg.MergedHead != "" || !strings.Contains(msg.Body, "nothing changed") {
		t.Fatalf("contained message %+v", msg)
	}

	// Refusals leave the child's HEAD where it was.
	commit("kid", "c.txt", "kid-side")
	commit("orch", "c.txt", "orch-side")
	before := kidHead()
	wantStatus(t, sendManifest(t, orch, update("m-4")), "refused",
		"the update conflicts with `kid`'s branch work/kid in \"c.txt\": nothing was merged")
	e.mustExec("kid", "touch", "untracked")
	wantStatus(t, sendManifest(t, orch, update("m-5")), "refused",
		"`kid` has uncommitted changes: a merge needs a clean work tree")
	e.mustExec("kid", "rm", "untracked")
	e.mustExec("kid", "git", "checkout", "-q", "--detach")
	wantStatus(t, sendManifest(t, orch, update("m-6")), "refused",
		"the HEAD of `kid` is detached: it must be on its branch to merge an update")
	e.mustExec("kid", "git", "checkout", "-q", "work/kid")
	// A merge of its own in progress (with strategy ours: clean tree).
	e.mustExec("kid", "sh", "-c", "git -c user.name=K -c user.email=k@example.com merge -q --no-commit -s ours refs/jailbee/from/orch/main && test -f .git/MERGE_HEAD && git status --porcelain")
	wantStatus(t, sendManifest(t, orch, update("m-7")), "refused",
		"`kid` is in the middle of a merge: it must finish or abort it first")
	e.mustExec("kid", "git", "merge", "--abort")
	if got := kidHead(); got != before {
		t.Fatalf("refused merges moved the child from %s to %s", before, got)
	}
}

// evilRelay is a child's git config that rewrites the relay URL of every
// fetch into it: the rewritten command asks the source, through the same
// relay, for the object named in $HOME/want, into $HOME/loot; or, when
// $HOME/raw exists, sends its bytes as the request and keeps the answer
// in $HOME/raw.out (no git client's checks in the way).
const evilRelay = `cat > "$HOME/evil.sh" <<X
if [ -f $HOME/raw ]; then cat $HOME/raw >&3; cat <&3 > $HOME/raw.out; exit 1; fi
env -u GIT_DIR -u GIT_WORK_TREE git -C $HOME/loot -c protocol.ext.allow=always -c protocol.version=2 fetch -q "ext::\$1 \$2" "\$(cat $HOME/want):refs/loot" 2>>$HOME/loot.err
exit 1
X
rm -rf "$HOME/loot" && git init -q "$HOME/loot" && git config "url.ext::sh $HOME/evil.sh .insteadOf" ext::`

// TestUpdateServesOnlyItsCommit: a child that rewrites its relay URL
// during an update cannot fetch an object of the source it was not sent,
// neither from the host repository (an update with a base) nor from its
// orchestrator's; the same updates work once it stops.
func TestUpdateServesOnlyItsCommit(t *testing.T) {
	e := newTestEnv(t)
	hostGit(t, e.repo, "checkout", "-q", "-b", "secret")
	if err := os.WriteFile(filepath.Join(e.repo, "secret.txt"), []byte("host secret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	hostGit(t, e.repo, "add", "secret.txt")
	hostGit(t, e.repo, "commit", "-q", "-m", "secret")
	hostBlob := hostGit(t, e.repo, "rev-parse", "secret:secret.txt")
	hostGit(t, e.repo, "checkout", "-q", "main")
	e.orchestrator("orch")
	e.child("kid", "orch")
	orch := e.client("orch")
	e.mustExec("orch", "sh", "-c", "git checkout -q -b side && echo orch secret > s.txt && git add s.txt && "+commitCmd+" -m s && git checkout -q -")
	orchBlob := e.mustExec("orch", "git", "rev-parse", "side:s.txt")
	e.mustExec("kid", "sh", "-c", evilRelay)
	// Commits the child does not have, so that its fetches connect.
	hostGit(t, e.repo, "commit", "-q", "--allow-empty", "-m", "new on main")
	e.mustExec("orch", "sh", "-c", commitCmd+" --allow-empty -m new")

	for i, c := range []struct {
		blob     string
		manifest map[string]any
	}{
		{hostBlob, map[string]any{"type": "update", "child": "kid", "base": "main"}},
		{orchBlob, map[string]any{"type": "update", "child": "kid"}},
	} {
		e.mustExec("kid", "sh", "-c", `echo `+c.blob+` > "$HOME/want"`)
		c.manifest["id"] = fmt.Sprintf("evil-%d", i)
		sendManifest(t, orch, c.manifest)
		if res, _ := e.execIn("kid", "", "sh", "-c", `git -C "$HOME/loot" cat-file -e `+c.blob); res.exit == 0 {
			t.Fatalf("the child fetched an object it was not sent (%v)", c.manifest)
		}
	}

	// The source itself refuses an object it did not advertise.
	req := fmt.Sprintf("%04xwant %s\n00000009done\n", 4+len("want \n")+len(hostBlob), hostBlob)
	if _, err := e.execIn("kid", req, "sh", "-c", `cat > "$HOME/raw"`); err != nil {
		t.Fatal(err)
	}
	sendManifest(t, orch, map[string]any{"id": "evil-raw", "type": "update", "child": "kid", "base": "main"})
	if out := e.mustExec("kid", "sh", "-c", `cat "$HOME/raw.out"`); strings.Contains(out, "PACK") || !strings.Contains(out, "not our ref "+hostBlob) {
		t.Fatalf("the source's answer to a want of an object it did not advertise: %q", out)
	}

	e.mustExec("kid", "sh", "-c", `rm "$HOME/raw" && git config --remove-section "url.ext::sh $HOME/evil.sh "`)
	wantStatus(t, sendManifest(t, orch, map[string]any{"id": "up-base", "type": "update", "child": "kid", "base": "main"}),
		"done", "delivered to kid: refs/jailbee/update/orch/up-base at "+hostGit(t, e.repo, "rev-parse", "main")[:12])
	wantStatus(t, sendManifest(t, orch, map[string]any{"id": "up-orch", "type": "update", "child": "kid", "ref": "refs/heads/side"}),
		"done", "delivered to kid: refs/jailbee/update/orch/up-orch at "+e.mustExec("orch", "git", "rev-parse", "side")[:12])
}

// TestUpdateServesNoHostTag: a child that rewrites its relay URL and asks
// the host repository's upload-pack, during an update with a base, for the
// tags that point into what it is sent (include-tag) gets none: the
// broker passes on only a plain fetch's requests, so the host's annotated
// tag (its name, message and tagger) stays on the host.
func TestUpdateServesNoHostTag(t *testing.T) {
	e := newTestEnv(t)
	e.orchestrator("orch")
	e.child("kid", "orch")
	orch := e.client("orch")
	hostGit(t, e.repo, "commit", "-q", "--allow-empty", "-m", "new on main")
	hostGit(t, e.repo, "tag", "-a", "-m", "unreleased codename", "v9-secret", "main")
	main := hostGit(t, e.repo, "rev-parse", "main")
	e.mustExec("kid", "sh", "-c", evilRelay)
	want := "want " + main + " ofs-delta include-tag\n"
	req := fmt.Sprintf("%04x%s00000009done\n", 4+len(want), want)
	if _, err := e.execIn("kid", req, "sh", "-c", `cat > "$HOME/raw"`); err != nil {
		t.Fatal(err)
	}
	sendManifest(t, orch, map[string]any{"id": "evil-tag", "type": "update", "child": "kid", "base": "main"})
	// No answer at all when the transfer was cut before the relay kept one.
	answer := e.mustExec("kid", "sh", "-c", `cat "$HOME/raw.out" 2>/dev/null; true`)
	i := strings.Index(answer, "PACK")
	if i < 0 {
		return // the source never answered the request
	}
	loot := filepath.Join(t.TempDir(), "loot")
	hostGit(t, "", "init", "-q", "--bare", loot)
	cmd := exec.Command("git", "-C", loot, "unpack-objects", "-q")
	cmd.Stdin = strings.NewReader(answer[i:])
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("unpack the answer: %v: %s", err, out)
	}
	if objs := hostGit(t, loot, "cat-file", "--batch-all-objects", "--batch-check=%(objecttype)"); strings.Contains(objs, "tag") {
		t.Fatalf("the child got the host's tag: %s", hostGit(t, loot, "cat-file", "--batch-all-objects", "--batch-check"))
	}
}

// TestUpdateRefusedWhenTheChildsInboxIsFull: an update's message reports
// a change already made, so its delivery is never refused; the child's
// room is checked before the update instead. Updates to a child that
// never reads fill its inbox to the quota and no further, and a refused
// update changes nothing in the child.
func TestUpdateRefusedWhenTheChildsInboxIsFull(t *testing.T) {
	const limit = 3
	e := newTestEnvQuota(t, store.Quota{MaxUnreadItems: limit})
	e.orchestrator("orch")
	e.child("kid", "orch")
	orch, kid := e.client("orch"), e.client("kid")
	room := limit - len(unread(t, kid))
	if room <= 0 {
		t.Fatalf("kid's inbox starts with %d unread items", limit-room)
	}
	base := hostGit(t, e.repo, "rev-parse", "main")
	for i := range room {
		id := fmt.Sprintf("up-%d", i)
		wantStatus(t, sendManifest(t, orch, map[string]any{"id": id, "type": "update", "child": "kid", "base": "main"}),
			"done", "delivered to kid: refs/jailbee/update/orch/"+id+" at "+base[:12])
	}
	st := sendManifest(t, orch, map[string]any{"id": "up-past", "type": "update", "child": "kid", "base": "main"})
	want := fmt.Sprintf("the inbox of `kid` is full: %d unread items (at most %d) and ", limit, limit)
	if st.State != "refused" || !strings.HasPrefix(st.Detail, want) || !strings.HasSuffix(st.Detail, "; send again with a new id once `kid` has read its messages") {
		t.Fatalf("the update past the quota: %s %q, want refused %q...", st.State, st.Detail, want)
	}
	if got := e.mustExec("kid", "git", "for-each-ref", "refs/jailbee/update/orch/up-past"); got != "" {
		t.Fatalf("a refused update fetched %q into the child", got)
	}
	if got := unread(t, kid); len(got) != limit {
		t.Fatalf("kid's inbox holds %d unread items, want %d", len(got), limit)
	}
}
