package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"strconv"
	"sync"
	"time"

	"agentbox/internal/backend"
	"agentbox/internal/backend/local/unit"
)

// outputGrace is how long Exec keeps copying a command's output after it
// ended: a process it left in the background may hold the pipe open.
const outputGrace = 2 * time.Second

// Exec runs opts.Argv in the running sandbox through its supervisor and
// returns its exit status (128+n for a command killed by signal n; 127 for
// a command that does not exist). A command ended by Stop or Destroy
// returns an error wrapping backend.ErrNotRunning.
func (b *Backend) Exec(ctx context.Context, name string, opts backend.ExecOptions) (int, error) {
	if len(opts.Argv) == 0 || opts.Argv[0] == "" {
		return -1, errors.New("exec: empty command")
	}
	switch opts.User {
	case "", AgentUser, strconv.Itoa(backend.AgentUID):
	default:
		return -1, fmt.Errorf("exec: %w: the local backend runs every command as the agent user (uid %d), not %q", backend.ErrUnsupported, backend.AgentUID, opts.User)
	}
	env, err := commandEnv(opts.Env)
	if err != nil {
		return -1, err
	}
	m, err := b.load(name)
	if err != nil {
		return -1, err
	}
	if !m.running() {
		return -1, fmt.Errorf("%w: %s", backend.ErrNotRunning, name)
	}
	if opts.TTY {
		for _, s := range []any{opts.Stdin, opts.Stdout, opts.Stderr} {
			if _, ok := s.(*os.File); !ok {
				return -1, errors.New("exec: a terminal must be an *os.File")
			}
		}
	}
	st, err := newStreams(opts)
	if err != nil {
		return -1, err
	}
	defer st.close()
	req := unit.Request{Argv: opts.Argv, Env: env, Dir: backend.WorkDir(opts.Dir), TTY: opts.TTY}
	var code int
	err = withControl(b.dir(name), func(sock string) error {
		var err error
		code, err = unit.Exec(ctx, sock, req, st.child, func() {
			// The command holds its streams: ours would keep its pipes open.
			st.close()
			if opts.Started != nil {
				opts.Started()
			}
		})
		return err
	})
	st.wait(err == nil)
	switch {
	case ctx.Err() != nil:
		return -1, fmt.Errorf("exec in %s: %w", name, ctx.Err())
	case err != nil && !m.running():
		return -1, fmt.Errorf("exec in %s: %w (stopped while the command ran)", name, backend.ErrNotRunning)
	case err != nil:
		return -1, fmt.Errorf("exec in %s: %w", name, err)
	}
	return code, nil
}

// commandEnv is the whole environment of a command.
func commandEnv(extra map[string]string) ([]string, error) {
	base := backend.ProxyEnv() // the only way out: the egress relay
	maps.Copy(base, map[string]string{
		"PATH": ClientBinDir + ":" + systemPath,
		"HOME": HomePath,
		"USER": AgentUser,
		"LANG": "C.UTF-8",
	})
	return backend.CommandEnv(base, extra)
}

// streams are the three descriptors a command gets and the copies that
// feed them from, or drain them into, non-file readers and writers.
type streams struct {
	child  [3]*os.File // handed to the supervisor
	opened []*os.File  // ours to close once the command is running
	copies sync.WaitGroup
	stdinW *os.File   // our end of a stdin pipe
	outR   []*os.File // our ends of stdout/stderr pipes
}

func newStreams(opts backend.ExecOptions) (*streams, error) {
	s := &streams{}
	ok := false
	defer func() {
		if !ok {
			s.close()
			for _, f := range s.outR {
				f.Close()
			}
			if s.stdinW != nil {
				s.stdinW.Close()
			}
		}
	}()
	switch in := opts.Stdin.(type) {
	case *os.File:
		s.child[0] = in
	case nil:
		f, err := os.Open(os.DevNull)
		if err != nil {
			return nil, err
		}
		s.child[0] = f
		s.opened = append(s.opened, f)
	default:
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		s.child[0], s.stdinW = r, w
		s.opened = append(s.opened, r)
	}
	for i, out := range []io.Writer{opts.Stdout, opts.Stderr} {
		switch o := out.(type) {
		case *os.File:
			s.child[i+1] = o
		case nil:
			f, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
			if err != nil {
				return nil, err
			}
			s.child[i+1] = f
			s.opened = append(s.opened, f)
		default:
			r, w, err := os.Pipe()
			if err != nil {
				return nil, err
			}
			s.child[i+1] = w
			s.opened = append(s.opened, w)
			s.outR = append(s.outR, r)
			s.copies.Add(1)
			go func() {
				defer s.copies.Done()
				io.Copy(o, r)
			}()
		}
	}
	if s.stdinW != nil {
		go func(w *os.File, in io.Reader) {
			io.Copy(w, in)
			w.Close()
		}(s.stdinW, opts.Stdin)
	}
	ok = true
	return s, nil
}

// close closes the descriptors only the command needs.
func (s *streams) close() {
	for _, f := range s.opened {
		f.Close()
	}
	s.opened = nil
}

// wait ends the copies: output is read to its end, for at most
// outputGrace after the command ended (at once when it did not run), and
// a stdin copy still blocked is cut off.
func (s *streams) wait(ran bool) {
	s.close()
	if s.stdinW != nil {
		s.stdinW.Close()
	}
	done := make(chan struct{})
	go func() { s.copies.Wait(); close(done) }()
	grace := outputGrace
	if !ran {
		grace = 0
	}
	select {
	case <-done:
	case <-time.After(grace):
	}
	for _, f := range s.outR {
		f.Close()
	}
	<-done
}
