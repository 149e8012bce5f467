// Package process is the embedded default sandbox provider: it runs the
// runner binary as a child process in a per-task work directory, inside
// bubblewrap (own mount, PID and IPC namespaces; network kept) when bwrap is
// installed and works, with the deadline enforced by coreutils timeout. Its
// state lives in a JSON file per sandbox, so a restarted Dispatch can list
// and destroy sandboxes it started earlier. It isolates far less than a VM or
// container and must not be used for untrusted work in production.
package process
