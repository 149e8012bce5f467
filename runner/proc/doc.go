// Package proc starts the runner's child processes (the agent CLI, git, openspec) in their own
// process group, optionally as the unprivileged agent user, and kills the whole process tree
// when their context ends, so nothing the agent started outlives a stage. It must not decide
// what runs or with which environment; callers pass the complete environment.
package proc
