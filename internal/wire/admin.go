package wire

import "encoding/json"

// The host admin socket's ops (<state>/admin.sock), shared by the broker
// and the host commands. Arguments and results are JSON like the sandbox
// protocol's; exec also carries three descriptors (see ExecArgs).

// NewArgs are the arguments of "new".
type NewArgs struct {
	Name   string          `json:"name"`
	Repo   string          `json:"repo,omitempty"`
	Branch string          `json:"branch,omitempty"`
	Role   Role            `json:"role"`
	Parent string          `json:"parent,omitempty"`
	Grant  json.RawMessage `json:"grant,omitempty"`
}

// NewResult is the result of "new".
type NewResult struct {
	Name   string `json:"name"`
	UUID   string `json:"uuid"`
	Branch string `json:"branch"`
}

// NameArgs name one sandbox ("start", "stop").
type NameArgs struct {
	Name string `json:"name"`
}

// DestroyArgs are the arguments of "destroy".
type DestroyArgs struct {
	Name  string `json:"name"`
	Force bool   `json:"force"`
}

// DestroyResult is the result of "destroy".
type DestroyResult struct {
	Destroyed int `json:"destroyed"`
}

// SandboxInfo is one entry of "ls" (and of `jailbee ls --json`).
type SandboxInfo struct {
	Name    string  `json:"name"`
	Role    Role    `json:"role"`
	Parent  *string `json:"parent"`
	State   string  `json:"state"`
	Running bool    `json:"running"`
	Branch  string  `json:"branch"`
	UUID    string  `json:"uuid"`
	Socket  *string `json:"socket"`
	// LastStatus is a spawned child's latest status for its spawn or last
	// restart, as its orchestrator has it.
	LastStatus *StatusItem `json:"last_status,omitempty"`
}

// ExecArgs are the arguments of "exec". The request line is sent with the
// command's stdin, stdout and stderr as SCM_RIGHTS (three descriptors, in
// that order; with TTY all three are one terminal). The reply comes when
// the command has ended; the client closing the connection first ends it.
type ExecArgs struct {
	Name string            `json:"name"`
	Argv []string          `json:"argv"`
	User string            `json:"user,omitempty"`
	Env  map[string]string `json:"env,omitempty"`
	Dir  string            `json:"dir,omitempty"`
	TTY  bool              `json:"tty,omitempty"`
}

// ExecResult is the result of "exec".
type ExecResult struct {
	Exit int `json:"exit"`
}
