package launch

import "fmt"

// Error codes a launch command reports (in JSON as "code").
const (
	CodeUsage        = "usage"          // the request itself is malformed
	CodeAssignment   = "assignment"     // the assignment broke a rule
	CodeBranchExists = "branch_exists"  // the task branch exists: no reuse
	CodeRepository   = "repository"     // the repository or its Git metadata
	CodeCompose      = "compose"        // a Compose or devcontainer input
	CodeImage        = "image_missing"  // an assigned image is not present
	CodeEngine       = "engine"         // the Docker engine or the CLI failed
	CodeUser         = "container_user" // the container user is not the consumer
	CodeInspection   = "inspection"     // the final inspection refused
	CodeExists       = "exists"         // the feature name is taken
	CodeNotFound     = "not_found"      // no such feature
	CodeNotRunning   = "not_running"    // the feature is not running
	CodeInternal     = "internal"       // anything else
)

// CodeAssignmentChanged: exec-provider or dispatch-tool found an
// assignment that is not the one the feature was started with (its
// SHA-256 differs from the launch record's, or the record, written by an
// older branchbox, holds none).
const CodeAssignmentChanged = "assignment_changed"

// Error is a launch command's refusal or failure: Code is stable, Message
// says what and why without a secret, a capability or a value.
type Error struct {
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Message }

func fail(code, format string, args ...any) error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}
