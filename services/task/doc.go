// Package task implements TaskService: creating, reading and listing tasks,
// and the task state machine (ARCHITECTURE.md section 2), which it alone
// enforces. Storage rows are converted to protos only at the gRPC edge.
// It must not start sandboxes itself: dispatch and cancellation of running
// tasks are delegated to DispatchService through the Dispatcher interface.
package task
