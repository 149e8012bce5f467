// Package stages is the runner's core: it turns one task into one pull request. It gets a
// repository token, clones the base branch, makes sure OpenSpec is initialised, drives the
// agent through explore → propose → apply → archive, reports stage changes (from stage
// boundaries and from what the agent does), rate-limited redacted log tails, diff stats and
// usage, then commits, pushes taskrunner/<task-id> and opens the PR. It enforces the hard
// deadline, the budget, the turn cap and Cancel, and on timeout or a limit it saves the work
// so far in a draft PR. Every event goes through a Reporter, in order; the package must not
// talk to the Events service itself, read the environment or handle signals.
package stages
