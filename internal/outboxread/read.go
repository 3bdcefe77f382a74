// Package outboxread is the in-sandbox side of publish: `jailbee
// _outbox-read --outbox issue|pr --name NAME`, run by the broker as the
// agent user inside the requester's sandbox, prints one outbox manifest
// and the names of every manifest staged in the two outboxes. Every path
// component is opened without following a symlink (secfs.OpenDirNoFollow,
// secfs.OpenChild), the manifest must be a regular file and is read
// bounded: the outbox is the agent's, and the agent is not trusted.
// Nothing here runs on the host; the broker decodes what it prints as
// hostile bytes.
package outboxread

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"

	"agentbox/internal/manifest"
	"agentbox/internal/secfs"
)

// Command is the hidden command's name.
const Command = "_outbox-read"

// Dirs are the outboxes below the agent's home, by manifest.Outbox*.
var Dirs = map[string]string{
	manifest.OutboxIssue: ".jailbee/issue-outbox",
	manifest.OutboxPR:    ".jailbee/pr-outbox",
}

// MaxListed bounds the names listed per outbox; past it Result.More is set.
const MaxListed = 64

// MaxOutput bounds what the broker reads of the helper's output: the
// manifest in base64 and the two listings, with room to spare.
const MaxOutput = manifest.MaxOutboxBytes*4/3 + 2*MaxListed*200 + 4096

// Error codes of Result.Error.
const (
	ErrMissing    = "missing"     // no such manifest in the outbox
	ErrNotRegular = "not_regular" // a symlink on the path, or not a regular file
	ErrTooLarge   = "too_large"   // more than manifest.MaxOutboxBytes
	ErrUnreadable = "unreadable"  // any other failure
)

// Result is what the helper prints, one JSON line.
type Result struct {
	Manifest []byte   `json:"manifest,omitempty"`
	Error    string   `json:"error,omitempty"`
	Staged   []string `json:"staged"` // "issue/NAME" or "pr/NAME", both outboxes
	More     bool     `json:"more,omitempty"`
}

// Argv runs the helper for manifest name of outbox.
func Argv(outbox, name string) []string {
	return []string{"jailbee", Command, "--outbox", outbox, "--name", name}
}

// IsHelperCommand reports whether arg names the helper.
func IsHelperCommand(arg string) bool { return arg == Command }

// HelperMain runs the helper with args (the command's name first).
func HelperMain(args []string) int {
	fs := flag.NewFlagSet(Command, flag.ContinueOnError)
	outbox := fs.String("outbox", "", "issue or pr")
	name := fs.String("name", "", "the manifest's file name")
	if err := fs.Parse(args[1:]); err != nil || Dirs[*outbox] == "" || !manifest.ValidPublishName(*name) {
		fmt.Fprintln(os.Stderr, "usage: jailbee _outbox-read --outbox issue|pr --name NAME.json")
		return 2
	}
	home, err := os.UserHomeDir()
	if err != nil {
		fmt.Fprintln(os.Stderr, "no home directory")
		return 1
	}
	out, _ := json.Marshal(Read(home, *outbox, *name))
	os.Stdout.Write(append(out, '\n'))
	return 0
}

// Read reads manifest name of outbox under home and lists both outboxes.
func Read(home, outbox, name string) Result {
	r := Result{Staged: []string{}}
	for _, ob := range []string{manifest.OutboxIssue, manifest.OutboxPR} {
		names, more := list(filepath.Join(home, Dirs[ob]))
		for _, n := range names {
			r.Staged = append(r.Staged, ob+"/"+n)
		}
		r.More = r.More || more
	}
	r.Manifest, r.Error = readManifest(filepath.Join(home, Dirs[outbox]), name)
	return r
}

// readManifest opens dir and then name in it, each component without
// following a symlink, and reads it when it is a regular file.
func readManifest(dir, name string) ([]byte, string) {
	d, _, err := secfs.OpenDirNoFollow(dir, nil)
	if err != nil {
		return nil, code(err)
	}
	defer d.Close()
	f, st, err := secfs.OpenChild(d, name, unix.O_RDONLY|unix.O_NONBLOCK)
	if err != nil {
		return nil, code(err)
	}
	defer f.Close()
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, ErrNotRegular
	}
	if st.Size > manifest.MaxOutboxBytes {
		return nil, ErrTooLarge
	}
	// Still bounded: the file may grow while it is read.
	data, err := secfs.ReadAllLimited(f, manifest.MaxOutboxBytes)
	if err != nil {
		return nil, ErrUnreadable
	}
	return data, ""
}

func code(err error) string {
	switch {
	case errors.Is(err, os.ErrNotExist):
		return ErrMissing
	case errors.Is(err, secfs.ErrUnsafe):
		return ErrNotRegular
	}
	return ErrUnreadable
}

// list returns the manifest names in dir (none when it cannot be read),
// at most MaxListed, sorted, and whether there were more.
func list(dir string) ([]string, bool) {
	d, _, err := secfs.OpenDirNoFollow(dir, nil)
	if err != nil {
		return nil, false
	}
	defer d.Close()
	fd, err := unix.Openat(int(d.Fd()), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, false
	}
	f := os.NewFile(uintptr(fd), "outbox")
	defer f.Close()
	var names []string
	for {
		batch, err := f.ReadDir(256)
		for _, e := range batch {
			if manifest.ValidPublishName(e.Name()) {
				names = append(names, e.Name())
			}
		}
		if err != nil || len(names) > MaxListed {
			break
		}
	}
	slices.Sort(names)
	if len(names) > MaxListed {
		return names[:MaxListed], true
	}
	return names, false
}
