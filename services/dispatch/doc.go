// Package dispatch implements DispatchService: admission (per-owner quota,
// per-repository and global running limits, a FIFO queue), starting one
// sandbox per task through a sandbox.Provider with a freshly minted task
// certificate, cancellation, and the reaper that makes sure no sandbox
// outlives its task. All of its state is in PostgreSQL and in provider
// labels, so it is safe with several replicas and survives restarts. It
// never puts a GitHub token into a sandbox.
package dispatch
