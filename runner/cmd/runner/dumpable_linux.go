package main

import "golang.org/x/sys/unix"

// protectSecrets makes the runner non-dumpable: /proc/<pid>/environ and
// /proc/<pid>/mem then belong to root, so an agent running under the same
// uid (the uid-1000 image) cannot read the task certificate's key from the
// runner's environment.
func protectSecrets() error {
	return unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
}
