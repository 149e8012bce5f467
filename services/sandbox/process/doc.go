// Package process is the embedded default sandbox provider: it runs the
// runner binary as a child process in a per-task work directory, inside
// bubblewrap: the host read-only, private /tmp, PID, IPC and UTS
// namespaces, the work root hidden so other tasks' directories do not
// exist, and only the task's own workspace writable (network kept). It
// refuses to start without a working bwrap unless
// TASKRUNNER_PROCESS_UNISOLATED=1 (or Bwrap "never") asks for plain
// processes. The deadline is enforced by coreutils timeout. Its state lives
// in a JSON file per sandbox, so a restarted Dispatch can list and destroy
// sandboxes it started earlier; Destroy removes every file of the task. It
// isolates far less than a VM or container and must not be used for
// untrusted work in production.
package process
