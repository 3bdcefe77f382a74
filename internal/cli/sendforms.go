package cli

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"agentbox/internal/grant"
	"agentbox/internal/manifest"
)

// idPrefix is the prefix of a generated manifest id: the type's name
// ("msg" for messages, as the spec's examples write them).
func idPrefix(t manifest.Type) string {
	if t == manifest.TypeMessage {
		return "msg"
	}
	return string(t)
}

// setTextLabel names the text file of a manifest whose text travels as the
// request body (prompt_file / body_file): "<id>.md".
func setTextLabel(m *manifest.Manifest) {
	label := m.ID + ".md"
	switch {
	case m.Message != nil && m.Message.BodyFile != "":
		m.Message.BodyFile = label
	case m.Spawn != nil && m.Spawn.PromptFile != "":
		m.Spawn.PromptFile = label
	case m.Restart != nil && m.Restart.PromptFile != "":
		m.Restart.PromptFile = label
	}
}

// textSource is the --text / --file / stdin choice of the forms that carry
// a prompt or message.
type textSource struct {
	what     string // "message text" or "prompt", for flag help and errors
	text     string
	file     string
	withFile bool // the form offers --file
}

func (s *textSource) add(c *cobra.Command, what string, withFile bool) {
	s.what = what
	c.Flags().StringVar(&s.text, "text", "", what+" (default: read stdin)")
	if withFile {
		s.withFile = true
		c.Flags().StringVar(&s.file, "file", "", "read the "+what+" from this absolute path outside the repository")
	}
}

// maxText is the most prompt or message text a send carries, whatever its
// source: the manifest's own limit, which the broker applies alike to
// inline text (--text) and to the request body (stdin, --file).
const maxText = manifest.MaxTextBytes

// maxCounted bounds how far a too long stdin or --file is read to say how
// long it is; past it the error says "more than".
const maxCounted = 64 << 20

// read returns the text and whether it travels as the request body (stdin
// and --file do; --text goes inline). Text past maxText, or not UTF-8, is a
// usage error (exit 2) before anything is sent: the broker would refuse it
// only after the id was printed, and would alter invalid UTF-8 (the JSON
// encoding replaces it) rather than keep the text byte for byte.
func (s *textSource) read(cmd *cobra.Command) (text string, asBody bool, err error) {
	if cmd.Flags().Changed("text") {
		if s.withFile && s.file != "" {
			return "", false, exitf(ExitUsage, "give --text or --file, not both")
		}
		if err := s.check("--text", s.text, int64(len(s.text))); err != nil {
			return "", false, err
		}
		return s.text, false, nil
	}
	var r io.Reader = cmd.InOrStdin()
	source := "stdin"
	if s.file != "" {
		if err := checkOutsideRepo(s.file); err != nil {
			return "", false, err
		}
		f, err := os.Open(s.file)
		if err != nil {
			return "", false, exitf(ExitUsage, "cannot read --file")
		}
		defer f.Close()
		r, source = f, "--file"
	}
	data, err := io.ReadAll(io.LimitReader(r, maxText+1))
	if err != nil {
		return "", false, exitf(ExitUsage, "cannot read the %s from %s", s.what, source)
	}
	n := int64(len(data))
	if n > maxText {
		rest, _ := io.Copy(io.Discard, io.LimitReader(r, maxCounted-n+1))
		n += rest
	}
	if err := s.check(source, string(data), n); err != nil {
		return "", false, err
	}
	return string(data), true, nil
}

// check refuses text of n bytes from source past maxText, or not valid
// UTF-8, naming the source and the limit.
func (s *textSource) check(source, text string, n int64) error {
	switch {
	case n > maxCounted:
		return exitf(ExitUsage, "%s from %s is more than %d bytes; at most %d", s.what, source, maxCounted, maxText)
	case n > maxText:
		return exitf(ExitUsage, "%s from %s is %d bytes; at most %d", s.what, source, n, maxText)
	case !utf8.ValidString(text):
		return exitf(ExitUsage, "%s from %s is not valid UTF-8", s.what, source)
	}
	return nil
}

// checkOutsideRepo enforces "--file only with an absolute path outside the
// repo": a prompt file left in the work tree would make a fork refused.
func checkOutsideRepo(path string) error {
	if !filepath.IsAbs(path) {
		return exitf(ExitUsage, "--file needs an absolute path")
	}
	cwd, err := os.Getwd()
	if err != nil {
		return nil
	}
	root := repoRoot(cwd)
	if root == "" {
		return nil
	}
	file := filepath.Clean(path)
	if resolved, err := filepath.EvalSymlinks(file); err == nil {
		file = resolved
	}
	if resolvedRoot, err := filepath.EvalSymlinks(root); err == nil {
		root = resolvedRoot
	}
	if file == root || strings.HasPrefix(file, root+string(filepath.Separator)) {
		return exitf(ExitUsage, "--file must be outside the repository (untracked files make a fork spawn refused)")
	}
	return nil
}

// repoRoot is the nearest directory at or above dir holding .git, or "".
func repoRoot(dir string) string {
	for {
		if _, err := os.Lstat(filepath.Join(dir, ".git")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// runnerFlags are --agent/--profile/--model.
type runnerFlags struct{ agent, profile, model string }

func (r *runnerFlags) add(c *cobra.Command) {
	c.Flags().StringVar(&r.agent, "agent", "", "runner agent: claude or claude-jb")
	c.Flags().StringVar(&r.profile, "profile", "", "LiteLLM profile (needs --agent claude-jb)")
	c.Flags().StringVar(&r.model, "model", "", "model tier: fable, opus, sonnet or haiku, optionally with [1m]")
}

// runner returns the chosen runner, nil when --agent is absent.
func (r *runnerFlags) runner() (*grant.Runner, error) {
	if r.agent == "" {
		if r.profile != "" || r.model != "" {
			return nil, exitf(ExitUsage, "--profile and --model need --agent")
		}
		return nil, nil
	}
	if r.profile != "" && r.agent != grant.AgentClaudeJB {
		return nil, exitf(ExitUsage, "--profile needs --agent claude-jb")
	}
	return &grant.Runner{Agent: r.agent, Profile: r.profile, Model: r.model}, nil
}

// servicesFlag parses --services a,b ("" = none); changed=false = omitted.
func servicesFlag(cmd *cobra.Command, value string) []string {
	if !cmd.Flags().Changed("services") {
		return nil
	}
	out := []string{}
	for _, s := range strings.Split(value, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func exclusive(cmd *cobra.Command, names ...string) error {
	var set []string
	for _, n := range names {
		if cmd.Flags().Changed(n) {
			set = append(set, "--"+n)
		}
	}
	if len(set) > 1 {
		return exitf(ExitUsage, "%s are mutually exclusive", strings.Join(set, " and "))
	}
	return nil
}

func newSendMessageCmd() *cobra.Command {
	var f sendFlags
	var src textSource
	var child, kind, replyTo string
	c := &cobra.Command{
		Use:   "message [--child C] [--kind K] [--reply-to ID] (--text T | stdin) [--wait] [--timeout DUR|none]",
		Short: "Send a message to a child (--child) or, from a child, to its orchestrator",
		Long: `Send a message. An orchestrator names the child with --child (--to, the
manifest's field name, is the same flag); a child omits it and the message
goes to its orchestrator. --kind is note (default), question, done or
blocked. --reply-to takes the id of the inbox message you answer (its h- id
or its origin_id). The text comes from --text or, without it, stdin.
A child's agent may exit once its done is accepted (send it with --wait):
the child is finished. An agent that exits before is reported blocked.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			text, asBody, err := src.read(cmd)
			if err != nil {
				return err
			}
			if kind == "" {
				kind = manifest.MsgNote
			}
			msg := &manifest.Message{To: child, Kind: kind, Body: text}
			if asBody {
				msg.BodyFile = "-"
			}
			if replyTo != "" {
				msg.InReplyTo = &replyTo
			}
			return runSend(cmd, f, &manifest.Manifest{Type: manifest.TypeMessage, Message: msg})
		},
	}
	f.add(c)
	src.add(c, "message text", false)
	c.Flags().StringVar(&child, "child", "", "the child's short name (orchestrators only)")
	// The spec writes this form with --to, the manifest's field name.
	c.Flags().StringVar(&child, "to", "", "the same as --child")
	c.Flags().StringVar(&kind, "kind", "", "note, question, done or blocked")
	c.Flags().StringVar(&replyTo, "reply-to", "", "id of the message you answer")
	return c
}

func newSendSpawnCmd() *cobra.Command {
	var f sendFlags
	var src textSource
	var rf runnerFlags
	var branch, base, ref, note, onDone, profile, services string
	var isNew, loose, noWarm bool
	var pr int
	var warm, mounts, egress []string
	c := &cobra.Command{
		Use:   "spawn [--branch B] [--new [--base main] | --ref REF | --pr N] [options] (--text T | --file ABS | stdin)",
		Short: "Create a child sandbox on a branch, with a prompt",
		Long: `Create a child. Without --new, --ref or --pr the child forks your committed HEAD
(a dirty tree is refused). --new starts from --base (default: the repo's
base); --ref REF (a full refs/ name or a 40-hex commit) forks that source;
--pr N checks out pull request N. The prompt comes from --text, --file (an
absolute path outside the repository) or stdin.

Rights (within your grant): --mount M (repeatable), --loose, --egress H
(repeatable). --warm PATH (repeatable) or --no-warm choose warm paths (forks
only). --on-done destroy|keep, --note T, --agent A [--profile P] [--model M],
--autostart-profile NAME, --services a,b ('' starts none).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := exclusive(cmd, "new", "ref", "pr"); err != nil {
				return err
			}
			if err := exclusive(cmd, "warm", "no-warm"); err != nil {
				return err
			}
			if (isNew || cmd.Flags().Changed("pr")) && (len(warm) > 0 || noWarm) {
				return exitf(ExitUsage, "--warm and --no-warm are only for forks (not with --new or --pr)")
			}
			if base != "" && !isNew {
				return exitf(ExitUsage, "--base needs --new")
			}
			runner, err := rf.runner()
			if err != nil {
				return err
			}
			text, asBody, err := src.read(cmd)
			if err != nil {
				return err
			}
			s := &manifest.Spawn{Kind: manifest.KindFork, Branch: branch, Base: base, Ref: ref, Note: note,
				OnDone: onDone, Runner: runner, AutostartProfile: profile, Services: servicesFlag(cmd, services),
				Prompt: text, Rights: grant.Rights{Mounts: mounts, Loose: loose, Egress: egress}}
			if asBody {
				s.PromptFile = "-"
			}
			m := &manifest.Manifest{Version: 1, Type: manifest.TypeSpawn, Spawn: s}
			switch {
			case isNew:
				s.Kind = manifest.KindNew
			case cmd.Flags().Changed("pr"):
				s.Kind, s.PR, m.Version = manifest.KindPR, pr, 2
			case ref != "":
				m.Version = 2
			}
			if noWarm {
				s.WarmPaths, m.Version = []string{}, 2
			} else if len(warm) > 0 {
				s.WarmPaths, m.Version = warm, 2
			}
			return runSend(cmd, f, m)
		},
	}
	f.add(c)
	src.add(c, "prompt", true)
	rf.add(c)
	c.Flags().StringVar(&branch, "branch", "", "the child's branch (its short name derives from it)")
	c.Flags().BoolVar(&isNew, "new", false, "start from --base instead of forking your HEAD")
	c.Flags().StringVar(&base, "base", "", "with --new: the base branch")
	c.Flags().StringVar(&ref, "ref", "", "fork this refs/ name or 40-hex commit")
	c.Flags().IntVar(&pr, "pr", 0, "check out this pull request")
	c.Flags().StringArrayVar(&warm, "warm", nil, "warm path glob (repeatable)")
	c.Flags().BoolVar(&noWarm, "no-warm", false, "no warm paths")
	c.Flags().StringArrayVar(&mounts, "mount", nil, "mount by name (repeatable)")
	c.Flags().BoolVar(&loose, "loose", false, "loose network")
	c.Flags().StringArrayVar(&egress, "egress", nil, "egress host (repeatable)")
	c.Flags().StringVar(&note, "note", "", "a note kept with the child")
	c.Flags().StringVar(&onDone, "on-done", "", "destroy or keep")
	c.Flags().StringVar(&profile, "autostart-profile", "", "autostart profile")
	c.Flags().StringVar(&services, "services", "", "services to start, comma-separated ('' = none)")
	return c
}

// childFlag adds the --child flag every child-directed form has.
func childFlag(c *cobra.Command, dst *string) {
	c.Flags().StringVar(dst, "child", "", "the child's short name")
}

func requireChild(child string) error {
	if child == "" {
		return exitf(ExitUsage, "--child is required")
	}
	return nil
}

// newChildForm is a send form whose manifest names one child and little
// else (import, stop, destroy): addFlags adds its other flags, build makes
// the manifest.
func newChildForm(use, short string, addFlags func(*cobra.Command), build func(child string) *manifest.Manifest) *cobra.Command {
	var f sendFlags
	var child string
	c := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := requireChild(child); err != nil {
				return err
			}
			return runSend(cmd, f, build(child))
		},
	}
	f.add(c)
	childFlag(c, &child)
	if addFlags != nil {
		addFlags(c)
	}
	return c
}

func newSendImportCmd() *cobra.Command {
	return newChildForm("import --child C", "Fetch a child's committed work as refs/jailbee/from/<child>/<branch>", nil,
		func(child string) *manifest.Manifest {
			return &manifest.Manifest{Type: manifest.TypeImport, Import: &manifest.Import{Child: child}}
		})
}

func newSendStopCmd() *cobra.Command {
	return newChildForm("stop --child C", "Stop a running child, freeing its slot", nil,
		func(child string) *manifest.Manifest {
			return &manifest.Manifest{Type: manifest.TypeStop, Stop: &manifest.Stop{Child: child}}
		})
}

func newSendDestroyCmd() *cobra.Command {
	var force bool
	return newChildForm("destroy --child C [--force]", "Delete a child (refused for unimported work unless --force)",
		func(c *cobra.Command) {
			c.Flags().BoolVar(&force, "force", false, "destroy even with unimported work, if HEAD equals the last import")
		},
		func(child string) *manifest.Manifest {
			return &manifest.Manifest{Type: manifest.TypeDestroy, Destroy: &manifest.Destroy{Child: child, Force: force}}
		})
}

func newSendUpdateCmd() *cobra.Command {
	var f sendFlags
	var child, ref, base string
	var merge bool
	c := &cobra.Command{
		Use:   "update --child C [--ref REF | --base BRANCH] [--merge]",
		Short: "Transport your branch (or REF, or a host BRANCH) into a running child",
		Long: `Transport your branch (or REF, or a host BRANCH) into a running child.

Your current branch lands in the child at refs/jailbee/from/<you>/<branch>;
--ref or --base land at refs/jailbee/update/<you>/<id>. Without --merge
nothing else in the child moves. With --merge the source is applied to the
child's branch (fast-forward, merge commit, or nothing when it is already
there) after a conflict check; a dirty, detached or conflicting child is
refused. The child gets a message of kind update with imported_ref,
imported_sha and, when its HEAD moved, merged_head.`,
		Example: `  jailbee inbox send update --child fix-issue-12 --wait
  jailbee inbox send update --child pool-release --base release/1 --merge --wait`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := requireChild(child); err != nil {
				return err
			}
			if err := exclusive(cmd, "ref", "base"); err != nil {
				return err
			}
			return runSend(cmd, f, &manifest.Manifest{Type: manifest.TypeUpdate, Update: &manifest.Update{Child: child, Ref: ref, Base: base, Merge: merge}})
		},
	}
	f.add(c)
	childFlag(c, &child)
	c.Flags().StringVar(&ref, "ref", "", "a full refs/ name or 40-hex commit of your repository")
	c.Flags().StringVar(&base, "base", "", "a host branch")
	c.Flags().BoolVar(&merge, "merge", false, "merge into the child's branch after a conflict check")
	return c
}

func newSendRestartCmd() *cobra.Command {
	var f sendFlags
	var src textSource
	var rf runnerFlags
	var child, onDone, profile, services string
	var agentOnly, defaultRunner bool
	c := &cobra.Command{
		Use:   "restart --child C [--agent-only] [--agent A [--profile P] [--model M] | --default-runner] (--text T | stdin)",
		Short: "Start a stopped child again with a new prompt (--agent-only: replace a running child's agent)",
		Long: `Start a stopped child again with a new prompt from --text or stdin. Without
--agent the child keeps its runner; --default-runner selects the current
effective default. --agent-only replaces only the agent of a running child.
--on-done destroy|keep changes its policy; --autostart-profile and --services
as for spawn.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := requireChild(child); err != nil {
				return err
			}
			if defaultRunner && rf.agent != "" {
				return exitf(ExitUsage, "--agent and --default-runner are mutually exclusive")
			}
			runner, err := rf.runner()
			if err != nil {
				return err
			}
			text, asBody, err := src.read(cmd)
			if err != nil {
				return err
			}
			r := &manifest.Restart{Child: child, Prompt: text, OnDone: onDone, AgentOnly: agentOnly,
				AutostartProfile: profile, Services: servicesFlag(cmd, services)}
			if asBody {
				r.PromptFile = "-"
			}
			if runner != nil || defaultRunner {
				r.Runner = manifest.RunnerChoice{Set: true, Runner: runner}
			}
			return runSend(cmd, f, &manifest.Manifest{Type: manifest.TypeRestart, Restart: r})
		},
	}
	f.add(c)
	src.add(c, "prompt", false)
	rf.add(c)
	childFlag(c, &child)
	c.Flags().BoolVar(&agentOnly, "agent-only", false, "replace only the agent of a running child")
	c.Flags().BoolVar(&defaultRunner, "default-runner", false, "use the current effective default runner")
	c.Flags().StringVar(&onDone, "on-done", "", "destroy or keep")
	c.Flags().StringVar(&profile, "autostart-profile", "", "autostart profile")
	c.Flags().StringVar(&services, "services", "", "services to start, comma-separated ('' = none)")
	return c
}

func newSendRefreshCmd() *cobra.Command {
	var f sendFlags
	var child, services string
	var force bool
	c := &cobra.Command{
		Use:   "refresh --child C --services db,web [--force]",
		Short: "Refresh services in a child",
		Long: `Restart the named services (1 to 32, duplicates removed) of a running
child, in the order named, each in a fresh tmux window; their dependencies,
setup and on_start do not run again. Only services the child's starts run
(its autostart profile's or its explicit services, with their dependencies)
can be refreshed. While the child's agent may be at work (it has not
reported done or ended, and is not a Claude agent judged idle or waiting),
the refresh is refused unless --force. Needs the refresh operation, which
no grant has unless granted explicitly. Answered done, refused or failed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := requireChild(child); err != nil {
				return err
			}
			if !cmd.Flags().Changed("services") {
				return exitf(ExitUsage, "--services is required")
			}
			return runSend(cmd, f, &manifest.Manifest{Type: manifest.TypeRefresh, Refresh: &manifest.Refresh{Child: child, Services: servicesFlag(cmd, services), Force: force}})
		},
	}
	f.add(c)
	childFlag(c, &child)
	c.Flags().StringVar(&services, "services", "", "services, comma-separated")
	c.Flags().BoolVar(&force, "force", false, "skip the idle gate")
	return c
}

func newSendRightsCmd() *cobra.Command {
	var f sendFlags
	var child, forTTL string
	var loose, revokeLoose bool
	var mounts, egress, revokeMounts, revokeEgress []string
	c := &cobra.Command{
		Use:   "rights [--child C] [--loose] [--mount K]... [--egress H]... --for T [--revoke-loose] [--revoke-mount K]... [--revoke-egress H]...",
		Short: "Grant or revoke a child's rights (children: revoke their own)",
		Long: `Grant rights to your child (--loose, --mount, --egress, with --for T: a TTL
of at most 24h, or never) and/or revoke them (--revoke-loose, --revoke-mount,
--revoke-egress). Revokes apply before grants, as one request (undone if a step fails); a timed grant
never shortens a longer right, and rights added by hand on the host are left
as is. A child revokes its own rights and omits --child and every grant
flag; its orchestrator gets a note. See docs/rights.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r := &manifest.Rights{Child: child}
			if loose || len(mounts) > 0 || len(egress) > 0 || forTTL != "" {
				r.Grant = &manifest.RightsGrant{Items: grant.Rights{Loose: loose, Mounts: mounts, Egress: egress}, For: forTTL}
			}
			if revokeLoose || len(revokeMounts) > 0 || len(revokeEgress) > 0 {
				r.Revoke = &grant.Rights{Loose: revokeLoose, Mounts: revokeMounts, Egress: revokeEgress}
			}
			if r.Grant == nil && r.Revoke == nil {
				return exitf(ExitUsage, "name at least one right to grant or revoke")
			}
			return runSend(cmd, f, &manifest.Manifest{Type: manifest.TypeRights, Rights: r})
		},
	}
	f.add(c)
	c.Flags().StringVar(&child, "child", "", "the child's short name (children: omit, or your own)")
	c.Flags().BoolVar(&loose, "loose", false, "grant loose network")
	c.Flags().StringArrayVar(&mounts, "mount", nil, "grant a mount (repeatable)")
	c.Flags().StringArrayVar(&egress, "egress", nil, "grant an egress host (repeatable)")
	c.Flags().StringVar(&forTTL, "for", "", "how long the grant lasts: a TTL up to 24h, or never")
	c.Flags().BoolVar(&revokeLoose, "revoke-loose", false, "revoke loose network")
	c.Flags().StringArrayVar(&revokeMounts, "revoke-mount", nil, "revoke a mount (repeatable)")
	c.Flags().StringArrayVar(&revokeEgress, "revoke-egress", nil, "revoke an egress host (repeatable)")
	return c
}

func newSendPublishCmd() *cobra.Command {
	var f sendFlags
	var issue, pr string
	c := &cobra.Command{
		Use:   "publish (--issue NAME | --pr NAME)",
		Short: "Publish a staged outbox manifest (orchestrators with publish rights)",
		Long: `Publish NAME.json staged in ~/.jailbee/issue-outbox (--issue: an issue
proposal) or ~/.jailbee/pr-outbox (--pr: a pull request source or a review).
The broker reads it inside this sandbox, checks it against the grant's publish
rights and the hourly budget, answers started, and then done with the URLs and
issue numbers, or failed with the forge's message. --wait returns on started:
wait for the final status of the same id. One publish runs at a time. A
proposal published already is refused; one that failed part way continues
with its actions not applied when sent again with a new id. Formats and rules:
docs/publish.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p := &manifest.Publish{Outbox: manifest.OutboxIssue, Manifest: issue}
			switch {
			case issue != "" && pr != "":
				return exitf(ExitUsage, "--issue and --pr are mutually exclusive")
			case pr != "":
				p.Outbox, p.Manifest = manifest.OutboxPR, pr
			case issue == "":
				return exitf(ExitUsage, "give --issue NAME or --pr NAME")
			}
			return runSend(cmd, f, &manifest.Manifest{Type: manifest.TypePublish, Publish: p})
		},
	}
	f.add(c)
	c.Flags().StringVar(&issue, "issue", "", "issue outbox manifest name (NAME.json)")
	c.Flags().StringVar(&pr, "pr", "", "PR outbox manifest name (NAME.json)")
	return c
}
