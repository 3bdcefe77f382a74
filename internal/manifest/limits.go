package manifest

const (
	// MaxManifestBytes bounds a manifest before it is parsed: it arrives in
	// one protocol line, which is at most 1 MiB.
	MaxManifestBytes = 1 << 20

	// MaxTextBytes bounds prompt and message text, inline or from the
	// request body (spec: "at most 65536 bytes").
	MaxTextBytes = 65536

	// MaxIDLen is the longest manifest id (spec: ^[a-z0-9][a-z0-9-]{0,63}$).
	MaxIDLen = 64

	// MaxFileNameLen bounds prompt_file and body_file: they only label the
	// request body, so a file name's usual limit is plenty.
	MaxFileNameLen = 255

	// MaxBranchLen bounds branch and base names.
	MaxBranchLen = 255

	// MaxRefLen bounds an explicit ref.
	MaxRefLen = 1024

	// MaxNoteBytes bounds a spawn note: a label shown in listings.
	MaxNoteBytes = 1024

	// MaxServices bounds a services list (spec: "1 to 32", "up to 32").
	MaxServices = 32

	// MaxPR is the largest pull request number accepted (GitHub numbers
	// are 32-bit).
	MaxPR = 1<<31 - 1

	// maxShownLen bounds how much of a caller's value a refusal repeats.
	maxShownLen = 64
)
