// Command runner is the binary inside every task sandbox (ARCHITECTURE.md section 7). It is
// configured only by environment variables (runner/config), streams events to the Events
// service over mTLS, and drives the agent from the base branch to a pull request
// (runner/stages). It is the only place that reads the environment and handles signals.
//
// Exit status: 0 when the task completed or was cancelled on request, 1 when it failed (after
// reporting Failed), 2 when the configuration is invalid (nothing is reported: the message on
// stderr names the bad variable).
package main
