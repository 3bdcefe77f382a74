package gitx_test

import (
	"bufio"
	"bytes"
	"compress/zlib"
	"context"
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"strconv"
	"syscall"
	"testing"
	"time"

	"agentbox/internal/gitx"
)

// bombBaseBytes is the base blob of a delta bomb: each 2-byte copy
// instruction of the delta repeats all of it.
const bombBaseBytes = 1 << 20

// deltaBomb is a pack of one commit whose tree holds a 1 MiB blob and a
// blob of size bytes stored as a delta of a few KiB against it: a valid
// commit, nothing fsck refuses, whose pack is tiny whatever size is.
type deltaBomb struct {
	commit string
	pack   []byte
}

func newDeltaBomb(t *testing.T, size int64) deltaBomb {
	t.Helper()
	if size%bombBaseBytes != 0 {
		t.Fatalf("bomb size %d is not a multiple of %d", size, bombBaseBytes)
	}
	base := bytes.Repeat([]byte("a"), bombBaseBytes)
	baseID := objectID("blob", base)

	// The big blob's id: its bytes are base, size/bombBaseBytes times.
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", size)
	for range size / bombBaseBytes {
		h.Write(base)
	}
	bigID := h.Sum(nil)

	var delta []byte
	delta = binary.AppendUvarint(delta, bombBaseBytes)
	delta = binary.AppendUvarint(delta, uint64(size))
	for range size / bombBaseBytes {
		// copy from offset 0, size in the third size byte: 0x10 << 16 = 1 MiB
		delta = append(delta, 0x80|0x40, 0x10)
	}

	var tree []byte
	tree = append(append(tree, "100644 base\x00"...), baseID...)
	tree = append(append(tree, "100644 big\x00"...), bigID...)
	treeID := objectID("tree", tree)
	commit := []byte("tree " + hex.EncodeToString(treeID) + "\n" +
		"author A <a@example.com> 1700000000 +0000\ncommitter A <a@example.com> 1700000000 +0000\n\nbomb\n")
	commitID := objectID("commit", commit)

	var pack bytes.Buffer
	pack.WriteString("PACK")
	binary.Write(&pack, binary.BigEndian, uint32(2))
	binary.Write(&pack, binary.BigEndian, uint32(4))
	packObject(&pack, 1, commit, nil)
	packObject(&pack, 2, tree, nil)
	packObject(&pack, 3, base, nil)
	packObject(&pack, 7, delta, baseID) // REF_DELTA against the base blob
	sum := sha1.Sum(pack.Bytes())
	pack.Write(sum[:])
	return deltaBomb{commit: hex.EncodeToString(commitID), pack: pack.Bytes()}
}

func objectID(kind string, data []byte) []byte {
	h := sha1.New()
	fmt.Fprintf(h, "%s %d\x00", kind, len(data))
	h.Write(data)
	return h.Sum(nil)
}

// packObject writes one pack entry: its type and size header, the base's
// id for a REF_DELTA, then data deflated.
func packObject(w *bytes.Buffer, kind byte, data, baseID []byte) {
	size := uint64(len(data))
	c := kind<<4 | byte(size&0x0f)
	size >>= 4
	for size > 0 {
		w.WriteByte(c | 0x80)
		c = byte(size & 0x7f)
		size >>= 7
	}
	w.WriteByte(c)
	w.Write(baseID)
	z := zlib.NewWriter(w)
	z.Write(data)
	z.Close()
}

// bombSource is a hostile source's side of a transfer: upload-pack's
// protocol (version 0, no side band) by hand, answering any want with
// the bomb's pack.
func bombSource(b deltaBomb) gitx.Runner {
	return gitx.RunnerFunc(func(ctx context.Context, c gitx.Cmd) (int, error) {
		writePkt(c.Stdout, b.commit+" refs/jailbee/transfer\x00ofs-delta\n")
		io.WriteString(c.Stdout, "0000")
		r := bufio.NewReader(c.Stdin)
		for {
			line, err := readPkt(r)
			if err != nil {
				return 1, nil
			}
			if line == "done\n" {
				break
			}
		}
		writePkt(c.Stdout, "NAK\n")
		c.Stdout.Write(b.pack)
		return 0, nil
	})
}

func writePkt(w io.Writer, s string) {
	fmt.Fprintf(w, "%04x%s", len(s)+4, s)
}

func readPkt(r *bufio.Reader) (string, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return "", err
	}
	l, err := strconv.ParseUint(string(n[:]), 16, 16)
	if err != nil {
		return "", err
	}
	if l < 4 {
		return "", nil // flush
	}
	buf := make([]byte, l-4)
	_, err = io.ReadFull(r, buf)
	return string(buf), err
}

// maxChildRSS is the largest resident size, in bytes, of a waited-for
// descendant of the test process so far.
func maxChildRSS(t *testing.T) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru); err != nil {
		t.Fatal(err)
	}
	return ru.Maxrss << 10
}

// TestTransferToHostRefusesDeltaBomb is the pack bomb: a source sends a
// pack of a few KiB whose one delta expands to a blob larger than host
// git may hold in memory. Host git fetching it fails (git's own memory
// bound), instead of allocating what the source chose; the repository
// gets no ref.
func TestTransferToHostRefusesDeltaBomb(t *testing.T) {
	size := int64(gitx.MaxHostFetchMemory) + bombBaseBytes
	bomb := newDeltaBomb(t, size)
	t.Logf("pack of %d bytes for a blob of %d", len(bomb.pack), size)
	dst, _, _ := newRepo(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := gitx.Transfer(ctx, gitx.SandboxRepo("bomb", bombSource(bomb), t.TempDir()), bomb.commit,
		gitx.HostRepo(dst), "refs/jailbee/sandboxes/bomb/main", gitx.TransferOptions{})
	t.Logf("largest host git: %d bytes resident; %v", maxChildRSS(t), err)
	if err == nil {
		t.Fatalf("host git took a blob of %d bytes from a delta of %d", size, len(bomb.pack))
	}
	if out := git(t, dst, "for-each-ref", "refs/jailbee/"); out != "" {
		t.Fatalf("the repository got refs: %q", out)
	}
}

// TestTransferToHostTakesLargestGitDelta: the largest delta stock git
// makes (core.bigFileThreshold, 512 MiB: larger blobs are never
// deltified) still fits host git's memory bound.
func TestTransferToHostTakesLargestGitDelta(t *testing.T) {
	bomb := newDeltaBomb(t, 512<<20)
	dst, _, _ := newRepo(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := gitx.Transfer(ctx, gitx.SandboxRepo("big", bombSource(bomb), t.TempDir()), bomb.commit,
		gitx.HostRepo(dst), "refs/jailbee/sandboxes/big/main", gitx.TransferOptions{}); err != nil {
		t.Fatal(err)
	}
}
