package broker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"agentbox/internal/config"
	"agentbox/internal/inbox"
	"agentbox/internal/store"
	"agentbox/internal/testutil/wait"
	"agentbox/internal/wire"
)

// rightsGrant lets an orchestrator grant the mounts data and gone, loose
// and pypi.org.
const rightsGrant = `{"version":1,"max_running_children":4,"operations":["destroy","import","message","restart","rights","spawn","stop"],"grantable":{"mounts":["data","gone"],"loose":true,"egress":["pypi.org"]},"default_runner":null,"default_runner_source":null}`

// rightsEnv is a broker whose broker.yaml names the host directories data
// (holding the file hello) and gone, with orchestrator orch (rightsGrant)
// and its child kid. It returns the env and gone's directory.
func rightsEnv(t *testing.T) (*testEnv, string) {
	t.Helper()
	return rightsEnvWith(t, func(*testEnv) {})
}

// rightsEnvWith is rightsEnv with set applied to the env before its
// broker starts.
func rightsEnvWith(t *testing.T, set func(*testEnv)) (*testEnv, string) {
	t.Helper()
	root := t.TempDir()
	data, gone := filepath.Join(root, "data"), filepath.Join(root, "gone")
	for _, d := range []string{data, gone} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(data, "hello"), []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e := newTestEnvStopped(t)
	e.sandboxes.Mounts = map[string]config.MountDir{"data": {Path: data, ReadOnly: true}, "gone": {Path: gone, ReadOnly: true}}
	set(e)
	e.start()
	if err := e.admin("new", wire.NewArgs{Name: "orch", Repo: e.repo, Role: "orchestrator", Grant: json.RawMessage(rightsGrant)}, nil); err != nil {
		t.Fatal(err)
	}
	e.child("kid", "orch")
	return e, gone
}

// sendRights sends a rights manifest and returns its first status.
func sendRights(t testing.TB, c *inbox.Client, m map[string]any) wire.StatusItem {
	t.Helper()
	m["version"], m["type"] = 1, "rights"
	var st wire.StatusItem
	if err := c.Call(context.Background(), "send", map[string]any{"manifest": m}, &st); err != nil {
		t.Fatalf("send %v: %v", m["id"], err)
	}
	return st
}

func wantRights(t testing.TB, st wire.StatusItem, state, detail string) {
	t.Helper()
	if st.State != state || !strings.Contains(st.Detail, detail) {
		t.Fatalf("status %s %q, want %s containing %q", st.State, st.Detail, state, detail)
	}
}

// canRead reports whether the sandbox reads data's file.
func (e *testEnv) canRead(name string) bool {
	res, err := e.execIn(name, "", "cat", "/mnt/jailbee/data/hello")
	return err == nil && res.exit == 0 && res.stdout == "from the host\n"
}

// TestRightsMountGrantExpires: a timed mount grant attaches the host
// directory to the running child at once, and its expiry detaches it.
func TestRightsMountGrantExpires(t *testing.T) {
	e, _ := rightsEnv(t)
	c := e.client("orch")
	// No round may expire the grant before the child has read it once
	// (on a loaded machine that read may come after 3 s).
	e.b.HoldRoundsForTest(true)
	st := sendRights(t, c, map[string]any{"id": "r1", "child": "kid", "grant": map[string]any{"mounts": []string{"data"}, "for": "3s"}})
	wantRights(t, st, wire.StateDone, "granted mount data for 3s")
	if !e.canRead("kid") {
		t.Fatal("the granted mount is not readable in the child")
	}
	e.b.HoldRoundsForTest(false)
	wait.For(t, "the expired mount to leave the child's view", func() bool { return !e.canRead("kid") })
}

// TestRightsForBound: grant.for is at most 24h; never is acknowledged as
// (no expiry); a timed grant does not shorten a permanent right.
func TestRightsForBound(t *testing.T) {
	e, _ := rightsEnv(t)
	c := e.client("orch")
	st := sendRights(t, c, map[string]any{"id": "r1", "child": "kid", "grant": map[string]any{"egress": []string{"pypi.org"}, "for": "24h0m1s"}})
	wantRights(t, st, wire.StateRefused, "")
	st = sendRights(t, c, map[string]any{"id": "r2", "child": "kid", "grant": map[string]any{"egress": []string{"pypi.org"}, "for": "24h"}})
	wantRights(t, st, wire.StateDone, "granted egress pypi.org for 24h")
	st = sendRights(t, c, map[string]any{"id": "r3", "child": "kid", "grant": map[string]any{"loose": true, "for": "never"}})
	wantRights(t, st, wire.StateDone, "granted loose (no expiry)")
	st = sendRights(t, c, map[string]any{"id": "r4", "child": "kid", "grant": map[string]any{"loose": true, "for": "1m"}})
	wantRights(t, st, wire.StateDone, "loose keeps its permanent right (no expiry)")
}

// TestRightsRevokeBeforeGrantAndRollback: revoke runs before grant; when
// the second mount fails to attach (its host directory vanished), the
// first is detached again, nothing is recorded, and the reply is failed.
func TestRightsRevokeBeforeGrantAndRollback(t *testing.T) {
	e, gone := rightsEnv(t)
	c := e.client("orch")
	st := sendRights(t, c, map[string]any{"id": "r1", "child": "kid", "grant": map[string]any{"mounts": []string{"data"}, "for": "never"}})
	wantRights(t, st, wire.StateDone, "granted mount data (no expiry)")
	st = sendRights(t, c, map[string]any{"id": "r2", "child": "kid",
		"revoke": map[string]any{"mounts": []string{"data"}}, "grant": map[string]any{"loose": true, "for": "1h"}})
	wantRights(t, st, wire.StateDone, "revoked mount data; granted loose for 1h")
	if e.canRead("kid") {
		t.Fatal("the revoked mount is still in the child's view")
	}

	if err := os.Remove(gone); err != nil {
		t.Fatal(err)
	}
	st = sendRights(t, c, map[string]any{"id": "r3", "child": "kid", "grant": map[string]any{"mounts": []string{"data", "gone"}, "for": "1h"}})
	wantRights(t, st, wire.StateFailed, "")
	if e.canRead("kid") {
		t.Fatal("a failed grant left its first mount attached")
	}
	st = sendRights(t, c, map[string]any{"id": "r4", "child": "kid", "revoke": map[string]any{"mounts": []string{"data"}}})
	wantRights(t, st, wire.StateDone, "mount data was not held")
}

// TestRightsChildGivesUp: a child revokes its own right, and its parent
// gets the note.
func TestRightsChildGivesUp(t *testing.T) {
	e, _ := rightsEnv(t)
	c := e.client("orch")
	st := sendRights(t, c, map[string]any{"id": "r1", "child": "kid", "grant": map[string]any{"loose": true, "mounts": []string{"data"}, "for": "1h"}})
	wantRights(t, st, wire.StateDone, "granted")
	kid := e.client("kid")
	st = sendRights(t, kid, map[string]any{"id": "g1", "revoke": map[string]any{"loose": true, "mounts": []string{"data"}}})
	wantRights(t, st, wire.StateDone, "revoked loose, mount data")
	if e.canRead("kid") {
		t.Fatal("the given-up mount is still in the child's view")
	}
	if m := messageFrom(t, c, "kid", "note"); m.Body != "kid gave up: loose, mount data" {
		t.Fatalf("parent's note %q", m.Body)
	}
}

// TestRightsExpiryWhileDown: an expiry that passed while no broker ran is
// applied when the next one starts, before it serves.
func TestRightsExpiryWhileDown(t *testing.T) {
	e, _ := rightsEnv(t)
	c := e.client("orch")
	// No round of this broker expires the grant: only the next broker's
	// start may (and the child's read below may come after 2 s).
	e.b.HoldRoundsForTest(true)
	st := sendRights(t, c, map[string]any{"id": "r1", "child": "kid", "grant": map[string]any{"mounts": []string{"data"}, "for": "2s"}})
	granted := time.Now()
	wantRights(t, st, wire.StateDone, "granted mount data for 2s")
	if !e.canRead("kid") {
		t.Fatal("the granted mount is not readable in the child")
	}
	e.stop()
	time.Sleep(time.Until(granted.Add(3 * time.Second))) // past the expiry, with no broker running
	e.start()
	if e.canRead("kid") {
		t.Fatal("an expiry that passed while the broker was down was not applied at start")
	}
}

// TestRightsHandAddedSurviveRevoke: rights added by hand are listed with
// their owner, attach at once, and an orchestrator's revoke leaves them
// with the spec's detail; the host removes them.
func TestRightsHandAddedSurviveRevoke(t *testing.T) {
	e, _ := rightsEnv(t)
	var res wire.RightsResult
	if err := e.admin("rights", wire.RightsArgs{Name: "kid", Add: wire.RightsItems{Mounts: []string{"data"}, Egress: []string{"pypi.org"}}}, &res); err != nil {
		t.Fatal(err)
	}
	want := []wire.RightInfo{{Kind: "egress", Item: "pypi.org", Owner: "hand"}, {Kind: "mount", Item: "data", Owner: "hand"}}
	if !slices.Equal(res.Rights, want) {
		t.Fatalf("rights %+v, want %+v", res.Rights, want)
	}
	if !e.canRead("kid") {
		t.Fatal("the hand-added mount is not readable in the child")
	}
	c := e.client("orch")
	st := sendRights(t, c, map[string]any{"id": "r1", "child": "kid", "revoke": map[string]any{"mounts": []string{"data"}, "egress": []string{"pypi.org"}}})
	wantRights(t, st, wire.StateDone, "mount data was not given by orchestration; left as is; egress pypi.org was not given by orchestration; left as is")
	if !e.canRead("kid") {
		t.Fatal("an orchestrator's revoke took a hand-added mount")
	}
	st = sendRights(t, c, map[string]any{"id": "r2", "child": "kid", "grant": map[string]any{"mounts": []string{"data"}, "for": "1m"}})
	wantRights(t, st, wire.StateDone, "mount data is held by hand; left as is")

	if err := e.admin("rights", wire.RightsArgs{Name: "kid", Remove: wire.RightsItems{Mounts: []string{"data"}}}, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Rights) != 1 || e.canRead("kid") {
		t.Fatalf("after removing the mount by hand: rights %+v, mount readable %v", res.Rights, e.canRead("kid"))
	}
}

// egressRec records the rights the egress hook was told ended.
type egressRec struct {
	mu    sync.Mutex
	ended []string
}

func (r *egressRec) Changed(sandbox string, ended []store.Right) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, right := range ended {
		r.ended = append(r.ended, sandbox+": "+right.Key())
	}
}

func (r *egressRec) has(s string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Contains(r.ended, s)
}

// TestRightsEgressHook: the proxy reads a child's egress rights (entries,
// loose, the repo cap) and is told when one expires or is given up.
func TestRightsEgressHook(t *testing.T) {
	rec := &egressRec{}
	e, _ := rightsEnvWith(t, func(e *testEnv) { e.egress = rec })
	c := e.client("orch")
	st := sendRights(t, c, map[string]any{"id": "r1", "child": "kid", "grant": map[string]any{"egress": []string{"pypi.org"}, "loose": true, "for": "2s"}})
	wantRights(t, st, wire.StateDone, "granted loose, egress pypi.org for 2s")
	got, err := e.b.EgressRights(context.Background(), "kid")
	if err != nil || !got.Loose || !slices.Equal(got.Egress, []string{"pypi.org"}) || got.RepoCap != nil {
		t.Fatalf("EgressRights %+v, %v", got, err)
	}
	wait.For(t, "the hook to hear of the expiry", func() bool { return rec.has("kid: egress pypi.org") && rec.has("kid: loose") })
	if got, _ := e.b.EgressRights(context.Background(), "kid"); got.Loose || len(got.Egress) != 0 {
		t.Fatalf("EgressRights after expiry %+v", got)
	}
}

// TestRightsReattachedAtStart: a local sandbox loses its mounts when it
// stops; the broker attaches its mount rights again when it starts.
func TestRightsReattachedAtStart(t *testing.T) {
	e, _ := rightsEnv(t)
	c := e.client("orch")
	st := sendRights(t, c, map[string]any{"id": "r1", "child": "kid", "grant": map[string]any{"mounts": []string{"data"}, "for": "never"}})
	wantRights(t, st, wire.StateDone, "granted mount data (no expiry)")
	if err := e.admin("stop", wire.NameArgs{Name: "kid"}, nil); err != nil {
		t.Fatal(err)
	}
	if err := e.admin("start", wire.NameArgs{Name: "kid"}, nil); err != nil {
		t.Fatal(err)
	}
	if !e.canRead("kid") {
		t.Fatal("the mount right was not attached again at start")
	}
	// A resend of the same id gets its recorded status and applies nothing.
	st = sendRights(t, c, map[string]any{"id": "r1", "child": "kid", "grant": map[string]any{"mounts": []string{"data"}, "for": "never"}})
	wantRights(t, st, wire.StateDone, "granted mount data (no expiry)")
}

// TestRightsLooseGrantsNoAddress: an orchestrator with grantable loose
// (and a repository with no egress cap) cannot give a child an address
// entry, by a rights manifest or a spawn: the child's proxy would let it
// reach that address even where it refuses one (the host's loopback, the
// metadata service), which the orchestrator's own loose never reaches.
func TestRightsLooseGrantsNoAddress(t *testing.T) {
	e, _ := rightsEnv(t)
	c := e.client("orch")
	const refusal = "is not grantable: an address is granted only by a grantable entry that names it"
	st := sendRights(t, c, map[string]any{"id": "r1", "child": "kid", "grant": map[string]any{"egress": []string{"127.0.0.1"}, "for": "5m"}})
	wantRights(t, st, wire.StateRefused, "egress `127.0.0.1` "+refusal)
	st = spawn(t, c, "spawn-a", map[string]any{"branch": "fix/a", "prompt": "p",
		"rights": map[string]any{"mounts": []string{}, "loose": true, "egress": []string{"169.254.169.254"}}})
	wantRights(t, st, wire.StateRefused, "egress `169.254.169.254` "+refusal)
	// A name is still the loose orchestrator's to grant.
	st = sendRights(t, c, map[string]any{"id": "r2", "child": "kid", "grant": map[string]any{"egress": []string{"example.org"}, "for": "5m"}})
	wantRights(t, st, wire.StateDone, "granted egress example.org for 5m")
	var res wire.RightsResult
	if err := e.admin("rights", wire.RightsArgs{Name: "kid"}, &res); err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Rights {
		if r.Kind == "egress" && r.Item != "example.org" {
			t.Fatalf("the child holds egress %s", r.Item)
		}
	}
}

// TestRightsSpawnMount: a spawn's mount right is attached when the child
// is made, owned by orchestration and permanent.
func TestRightsSpawnMount(t *testing.T) {
	e, _ := rightsEnvWith(t, func(e *testEnv) { e.withAgent() })
	c := e.client("orch")
	st := spawn(t, c, "spawn-m", map[string]any{"branch": "fix/m", "prompt": "stay-busy", "on_done": "keep",
		"rights": map[string]any{"mounts": []string{"data"}, "loose": false, "egress": []string{}}})
	wantRights(t, st, "started", "")
	statusOf(t, c, "spawn-m", "done", "failed")
	if !e.canRead("fix-m") {
		t.Fatal("the spawn's mount is not readable in the child")
	}
	var res wire.RightsResult
	if err := e.admin("rights", wire.RightsArgs{Name: "fix-m"}, &res); err != nil {
		t.Fatal(err)
	}
	if want := []wire.RightInfo{{Kind: "mount", Item: "data", Owner: "orchestration"}}; !slices.Equal(res.Rights, want) {
		t.Fatalf("rights %+v, want %+v", res.Rights, want)
	}
}

// TestRightsExpiryAfterKill: a broker killed with a timed mount grant
// outstanding; the expiry passes while none runs; the next broker detaches
// the mount before it answers.
func TestRightsExpiryAfterKill(t *testing.T) {
	localOnly(t, "live mounts of a running local sandbox")
	data := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, "hello"), []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	state := shortTempDir(t)
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatal(err)
	}
	conf := "mounts:\n  data:\n    path: " + data + "\n    read_only: true\n"
	if err := os.WriteFile(filepath.Join(state, "broker.yaml"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := jailbeeBin(t)
	p := startProcBroker(t, bin, state)
	repo := makeRepo(t)
	p.newSandbox(wire.NewArgs{Name: "orch", Repo: repo, Role: "orchestrator", Grant: json.RawMessage(rightsGrant)})
	p.newSandbox(wire.NewArgs{Name: "kid", Repo: repo, Branch: "work/kid", Role: "child", Parent: "orch"})
	canRead := func() bool {
		res, err := adminExec(t, p.adminPath(), "kid", "", "cat", "/mnt/jailbee/data/hello")
		return err == nil && res.exit == 0
	}
	// Long enough for the child's read below on a loaded machine (the
	// process broker's rounds cannot be held).
	st := sendRights(t, p.client("orch"), map[string]any{"id": "r1", "child": "kid", "grant": map[string]any{"mounts": []string{"data"}, "for": "15s"}})
	granted := time.Now()
	wantRights(t, st, wire.StateDone, "granted mount data for 15s")
	if !canRead() {
		t.Fatalf("the granted mount is not readable in the child\n%s", p.stderr)
	}
	p.kill9()
	time.Sleep(time.Until(granted.Add(16 * time.Second))) // past the expiry, with no broker running
	p = startProcBroker(t, bin, state)
	if canRead() {
		t.Fatal("an expiry that passed while the broker was dead was not applied at start")
	}
}

// fdHoarders is the number of processes, and holdFDs the descriptors each
// holds, that make a detach's scan of a sandbox's processes long: some
// 0.2 s per 16,384 descriptors, so 50 of them take the scan to its
// bound (10 s).
const fdHoarders, holdFDs = 50, 16000

// TestMountRevokeScanStallsNobodyElse: a child makes a detach of its
// mount slow (processes holding many descriptors, each one looked at) and
// its orchestrator revokes the mount: while that detach scans, another
// orchestrator's send is answered. The detach ran on the broker's turn,
// so every sandbox's mutations and every host command waited for the
// scan (up to its bound per mount, as often as an orchestrator revokes).
func TestMountRevokeScanStallsNobodyElse(t *testing.T) {
	localOnly(t, "the executor's handling is the backends' alike; the scan costs the Incus pass twice the time")
	e, _ := rightsEnv(t)
	e.orchestrator("other")
	e.child("quiet", "other")
	lead := e.client("orch")
	st := sendRights(t, lead, map[string]any{"id": "r1", "child": "kid", "grant": map[string]any{"mounts": []string{"data"}, "for": "never"}})
	wantRights(t, st, wire.StateDone, "granted mount data")
	// Each takes as many as its hard limit leaves, up to holdFDs; with
	// much fewer the scan is too short to be sure the send comes first.
	if h, _ := strconv.Atoi(e.mustExec("kid", "sh", "-c", "ulimit -Hn")); h > 0 && h < holdFDs/2 {
		t.Skipf("the sandbox's open-file hard limit (%d) leaves too few descriptors for a long scan", h)
	}
	hoard := fmt.Sprintf(`n=%d; h=$(ulimit -Hn); [ "$h" = unlimited ] || [ "$h" -gt $((n+16)) ] || n=$((h-16)); ulimit -n $((n+16)) &&
for i in $(seq %d); do setsid perl -e 'open my $n, "<", "/dev/null"; my @k = map { open my $d, "<&", $n or die; $d } 1..$ARGV[0]; print "ready\n"; close STDOUT; sleep 600' $n </dev/null >>/tmp/hoarders 2>/dev/null & done`, holdFDs, fdHoarders)
	e.mustExec("kid", "sh", "-c", hoard)
	wait.For(t, "the hoarders to hold their descriptors", func() bool {
		return e.mustExec("kid", "sh", "-c", "grep -c ready /tmp/hoarders || true") == strconv.Itoa(fdHoarders)
	})

	revoked := make(chan wire.StatusItem, 1)
	go func() {
		var st wire.StatusItem
		lead.Call(context.Background(), "send", map[string]any{"manifest": map[string]any{
			"version": 1, "type": "rights", "id": "r2", "child": "kid", "revoke": map[string]any{"mounts": []string{"data"}}}}, &st)
		revoked <- st
	}()
	wait.For(t, "the revoke's detach to begin", func() bool { return !e.canRead("kid") })
	ctx, cancel := context.WithTimeout(context.Background(), wait.Guard)
	defer cancel()
	var sent wire.StatusItem
	err := e.client("other").Call(ctx, "send", map[string]any{"manifest": map[string]any{
		"version": 1, "id": "m-1", "type": "message", "to": "quiet", "body": "hello"}}, &sent)
	if err != nil || sent.State != wire.StateDone {
		t.Fatalf("another orchestrator's send while a detach scans: %+v %v", sent, err)
	}
	select {
	case st := <-revoked:
		t.Fatalf("the revoke answered (%s %q) before another orchestrator's send: that send waited for the detach's scan", st.State, st.Detail)
	default:
	}
	select {
	case <-revoked:
	case <-time.After(2 * time.Minute):
		t.Fatal("the revoke never answered")
	}
}
