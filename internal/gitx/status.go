package gitx

import (
	"bytes"
	"context"
	"errors"
	"fmt"
)

// WorkTree is what one `git status` inside a sandbox says of its checkout.
type WorkTree struct {
	Branch string // "" when HEAD is detached
	Commit string // HEAD's full object id
	Clean  bool   // no change, staged or not, and no untracked file
}

// ReadWorkTree reads r's HEAD and whether its work tree is clean with one
// git process inside the sandbox (git status --porcelain=v2 --branch),
// where IsClean and Head take three.
func ReadWorkTree(ctx context.Context, r Repo) (WorkTree, error) {
	if r.run == nil {
		return WorkTree{}, errors.New("gitx: ReadWorkTree runs only inside a sandbox")
	}
	stdout, stderr := output(0), output(0)
	code, err := r.run.Run(ctx, Cmd{
		Argv: []string{"git", "status", "--porcelain=v2", "--branch", "-z", "--untracked-files=all", "--ignore-submodules=dirty"},
		Dir:  r.dir, Env: sandboxEnv, Stdout: stdout, Stderr: stderr,
	})
	if err != nil {
		return WorkTree{}, fmt.Errorf("git status in %s: %w", r.name, err)
	}
	if code != 0 {
		return WorkTree{}, &SandboxGitError{Sub: "status", Where: r.name, Code: code, Stderr: stderrText(stderr)}
	}
	wt, err := parseStatusV2(stdout.Bytes(), stdout.Truncated())
	if err != nil {
		return WorkTree{}, fmt.Errorf("git status in %s: %w", r.name, err)
	}
	if wt.Branch != "" {
		if err := CheckBranchName(ctx, wt.Branch); err != nil {
			return WorkTree{}, fmt.Errorf("git status in %s: not a branch name", r.name)
		}
	}
	return wt, nil
}

// parseStatusV2 reads `git status --porcelain=v2 --branch -z` output (the
// sandbox's bytes: anything may be in it). truncated says the output went
// on past out. Clean means every record is a header.
func parseStatusV2(out []byte, truncated bool) (WorkTree, error) {
	wt := WorkTree{Clean: !truncated}
	var oid, head bool
	for rec := range bytes.SplitSeq(out, []byte{0}) {
		if len(rec) == 0 {
			continue
		}
		v, isHeader := bytes.CutPrefix(rec, []byte("# "))
		if !isHeader {
			wt.Clean = false
			continue
		}
		switch key, val, _ := bytes.Cut(v, []byte(" ")); string(key) {
		case "branch.oid":
			if oid {
				return WorkTree{}, errors.New("two branch.oid headers")
			}
			oid = true
			if string(val) == "(initial)" {
				return WorkTree{}, errors.New("HEAD has no commit")
			}
			if !shaPattern.Match(val) {
				return WorkTree{}, errors.New("branch.oid is not a commit id")
			}
			wt.Commit = string(val)
		case "branch.head":
			if head {
				return WorkTree{}, errors.New("two branch.head headers")
			}
			head = true
			if string(val) != "(detached)" {
				wt.Branch = string(val)
			}
		}
	}
	if !oid || !head {
		return WorkTree{}, errors.New("no branch headers")
	}
	return wt, nil
}
