package gitx_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"agentbox/internal/gitx"
)

// rawFetch is a hostile destination's side of a transfer: it reads the
// source's advertisement, sends want of the advertised commit with caps,
// then the lines extra, a flush and done, and keeps all the source
// answers in *answer.
func rawFetch(caps string, extra []string, answer *[]byte) gitx.Runner {
	return gitx.RunnerFunc(func(ctx context.Context, c gitx.Cmd) (int, error) {
		r := bufio.NewReader(c.Stdin)
		var oid string
		for {
			line, err := readPkt(r)
			if err != nil {
				return 1, nil
			}
			if line == "" {
				break
			}
			if oid == "" {
				oid, _, _ = strings.Cut(line, " ")
			}
		}
		var req bytes.Buffer
		writePkt(&req, "want "+oid+" "+caps+"\n")
		for _, l := range extra {
			writePkt(&req, l+"\n")
		}
		req.WriteString("0000")
		writePkt(&req, "done\n")
		c.Stdout.Write(req.Bytes())
		*answer, _ = io.ReadAll(r)
		return 0, nil
	})
}

// packObjects lists the objects of the pack in answer (by type), "" when
// there is none.
func packObjects(t *testing.T, answer []byte) string {
	t.Helper()
	i := bytes.Index(answer, []byte("PACK"))
	if i < 0 {
		return ""
	}
	repo := filepath.Join(t.TempDir(), "unpacked")
	git(t, "", "init", "--quiet", "--bare", repo)
	cmd := exec.Command("git", "-C", repo, "unpack-objects", "-q")
	cmd.Stdin = bytes.NewReader(answer[i:])
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("unpack the answer: %v: %s", err, out)
	}
	return git(t, repo, "cat-file", "--batch-all-objects", "--batch-check=%(objecttype) %(objectname)")
}

// TestTransferServesNoTag: a destination that asks the source for its
// tags (include-tag) gets none, although an annotated tag of the source
// (a name, a message, a tagger) points at the commit sent: the transfer
// is refused before the source sees the request.
func TestTransferServesNoTag(t *testing.T) {
	src, _, second := newRepo(t)
	git(t, src, "tag", "-a", "-m", "unreleased codename", "v9-secret", second)
	var answer []byte
	err := gitx.Transfer(context.Background(), gitx.HostRepo(src), second,
		gitx.SandboxRepo("greedy", rawFetch("include-tag ofs-delta", nil, &answer), t.TempDir()),
		"refs/jailbee/start", gitx.TransferOptions{IdleTimeout: 10 * time.Second})
	if objs := packObjects(t, answer); strings.Contains(objs, "tag ") {
		t.Fatalf("the destination got the source's tag: %s", objs)
	}
	if err == nil {
		t.Fatal("a transfer whose destination asked for tags succeeded")
	}
	t.Log(err)
}

// TestTransferAnswersNoRefName: deepen-not names a ref of the source,
// which upload-pack resolves among all its refs (hidden or in another
// namespace): the answers to an existing name and a missing one differ,
// an oracle of the source's branch names. The destination's request is
// refused before the source sees it, so both answers are the same.
func TestTransferAnswersNoRefName(t *testing.T) {
	src, first, second := newRepo(t)
	git(t, src, "branch", "secret-plan", first)
	answers := map[string]string{}
	for _, ref := range []string{"refs/heads/secret-plan", "refs/heads/no-such-branch"} {
		var answer []byte
		err := gitx.Transfer(context.Background(), gitx.HostRepo(src), second,
			gitx.SandboxRepo("greedy", rawFetch("ofs-delta deepen-not", []string{"deepen-not " + ref}, &answer), t.TempDir()),
			"refs/jailbee/start", gitx.TransferOptions{IdleTimeout: 10 * time.Second})
		if err == nil {
			t.Errorf("a transfer whose destination sent deepen-not %s succeeded", ref)
		}
		answers[ref] = string(answer)
	}
	if answers["refs/heads/secret-plan"] != answers["refs/heads/no-such-branch"] {
		t.Fatalf("the source answers an existing ref name and a missing one differently: %q", answers)
	}
}

// TestTransferHonestShallowDestination: an honest fetch into a shallow
// repository (it sends shallow lines) still goes through the filter.
func TestTransferHonestShallowDestination(t *testing.T) {
	src, _, second := newRepo(t)
	var answer []byte
	if err := gitx.Transfer(context.Background(), gitx.HostRepo(src), second,
		gitx.SandboxRepo("honest", rawFetch("multi_ack_detailed side-band-64k thin-pack no-progress ofs-delta deepen-since deepen-not agent=git/2.39.5 object-format=sha1", []string{"shallow " + second}, &answer), t.TempDir()),
		"refs/jailbee/start", gitx.TransferOptions{IdleTimeout: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
}

// TestTransferDestinationLeavesItsStdoutOpen: a destination whose
// process ends while something of its own (a daemon it started) still
// holds its stdout does not hold the transfer: it ends with the
// destination's process.
func TestTransferDestinationLeavesItsStdoutOpen(t *testing.T) {
	src, _, second := newRepo(t)
	var leaked *os.File
	t.Cleanup(func() {
		if leaked != nil {
			leaked.Close()
		}
	})
	leaving := gitx.RunnerFunc(func(ctx context.Context, c gitx.Cmd) (int, error) {
		fd, err := syscall.Dup(int(c.Stdout.(*os.File).Fd()))
		if err != nil {
			return 0, err
		}
		leaked = os.NewFile(uintptr(fd), "daemon's stdout")
		return 1, nil
	})
	done := make(chan error, 1)
	go func() {
		done <- gitx.Transfer(context.Background(), gitx.HostRepo(src), second,
			gitx.SandboxRepo("leaves", leaving, t.TempDir()), "refs/jailbee/start", gitx.TransferOptions{})
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a transfer whose destination failed succeeded")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the transfer waits for the destination's stdout after its process ended")
	}
}
