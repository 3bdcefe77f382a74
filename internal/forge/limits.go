package forge

import "time"

// Bounds of what the host sends to and reads from the forge.
const (
	// RequestTimeout bounds one API call, answer included: GitHub answers
	// in well under a second; past this the outcome is uncertain.
	RequestTimeout = 30 * time.Second
	// MaxResponseBytes bounds an answer's body: a pull request's JSON is
	// tens of KiB; more is not GitHub.
	MaxResponseBytes = 1 << 20
	// MaxMessageBytes bounds the forge's own message an *Error carries.
	MaxMessageBytes = 200
	// MaxURLBytes bounds an html_url kept from an answer (a GitHub URL is
	// under 200 bytes): it is journaled, sent to the orchestrator and
	// printed on the host's terminal.
	MaxURLBytes = 2048
	// MaxTokenBytes bounds the token file (a GitHub token is under 100
	// bytes; a fine-grained one about 93).
	MaxTokenBytes = 4 << 10

	// MaxTitleRunes is GitHub's bound on an issue or pull request title.
	MaxTitleRunes = 256
	// MaxBodyRunes is GitHub's bound on an issue, comment, pull request
	// or review body.
	MaxBodyRunes = 65536
	// MaxLabelRunes is GitHub's bound on a label name.
	MaxLabelRunes = 50
	// MaxLabels bounds the labels of one call (GitHub allows 100 per issue).
	MaxLabels = 100
	// MaxRefBytes bounds a head or base branch name (git's own limit on a
	// ref name component is the filesystem's, 255).
	MaxRefBytes = 255
)
