// Package e2e holds the end-to-end test: it starts the whole stack as real
// processes on real ports (devstack up: PostgreSQL, Redis, Jaeger, the forge,
// the scripted model API, taskrunnerd, the gateway, and the process provider
// running the real runner and Claude Code CLI), drives a task over REST and
// SSE, merges its pull request and reads the task's trace back from Jaeger.
// It has no non-test code.
package e2e
