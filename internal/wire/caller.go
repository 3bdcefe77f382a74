package wire

// Role is a sandbox's place in the tree: an orchestrator, or a child of
// one. It is stored in broker.db and sent over the admin socket as is.
type Role string

// Roles.
const (
	RoleOrchestrator Role = "orchestrator"
	RoleChild        Role = "child"
)

// Caller is who sent a request: fixed by the broker when it accepts a
// connection, from the socket (the sandbox) it came through. Nothing in a
// request can change it. The broker, the manifest rules and the handlers
// all take this one type.
type Caller struct {
	Sandbox string // the sandbox's short name
	Role    Role
	Parent  string // a child's orchestrator ("" for an orchestrator)
}
