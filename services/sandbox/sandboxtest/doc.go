// Package sandboxtest is the conformance suite every sandbox.Provider must
// pass: idempotent Create per task, Get, List by label, idempotent Destroy
// that leaves nothing of the task behind, the deadline carried into the
// provider's own mechanism, and orphans found by the managed-by label. Each
// provider's tests run it against that provider's test server (or, for the
// process provider, the real thing). It only drives the sandbox.Provider
// interface plus the few hooks a Harness gives; it must not know any
// provider's internals.
package sandboxtest
