// Package crashpoint lets crash tests choose where a broker (or a
// branchbox launch) dies: a
// process whose JAILBEE_CRASHPOINT environment variable names a point
// kills itself with SIGKILL when it reaches it, exactly as kill -9 from
// outside would, but at a known step instead of a lucky moment. Unset (as
// always outside tests) a point costs one string comparison.
package crashpoint

import (
	"os"
	"syscall"
)

// EnvVar names the point the process dies at.
const EnvVar = "JAILBEE_CRASHPOINT"

// Points a broker passes, in the order of their operations.
const (
	SpawnCreated      = "spawn-created"      // the child's sandbox exists, its record does not say so yet
	DoneImported      = "done-imported"      // a done report's import landed, the report is not delivered
	DoneDelivered     = "done-delivered"     // a done report is delivered, the child's destroy not begun
	FinishImported    = "finish-imported"    // a pending finish's import landed, the report is not delivered
	UpdateMerged      = "update-merged"      // an update merged in the child, its message is not delivered
	DestroyUnitGone   = "destroy-unit-gone"  // a sandbox's unit and files are gone, its record is not
	ImportTransferred = "import-transferred" // an import's ref landed, its status is not recorded
	PublishCalled     = "publish-called"     // a publish action's forge call returned, its outcome is not journaled
)

// Points a branchbox launch passes.
const (
	LaunchWorktreeAdded     = "launch-worktree-added"     // the worktree exists, nothing is delegated
	LaunchContainersCreated = "launch-containers-created" // the containers exist, none inspected or started
	LaunchContainerUp       = "launch-container-up"       // devcontainer up returned, nothing inspected
	LaunchProxyStarted      = "launch-proxy-started"      // a port proxy runs, the launch is not marked running
)

// Points a branchbox tool-request dispatch passes.
const (
	DispatchStaged         = "dispatch-staged"          // the request is in .processing/, not claimed
	DispatchClaimAppended  = "dispatch-claim-appended"  // the claim is appended to the ledger, not synced
	DispatchClaimed        = "dispatch-claimed"         // the claim is durable, nothing relayed
	DispatchRelayed        = "dispatch-relayed"         // the endpoint answered, nothing recorded
	DispatchRecordAppended = "dispatch-record-appended" // the done record is appended, not synced
	DispatchRecorded       = "dispatch-recorded"        // the response is recorded, the consumer's file not placed
	DispatchResponded      = "dispatch-responded"       // the consumer's file is placed, the staged copy not removed
)

var armed = os.Getenv(EnvVar)

// Hit kills the process if point is the armed one.
func Hit(point string) {
	if armed != "" && armed == point {
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // SIGKILL cannot be caught; nothing runs past here
	}
}
