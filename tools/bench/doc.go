// Package bench measures the runner event path end to end, in one process:
// the new design (runners on the mTLS EventsService.Connect stream, group
// commit, Redis fan-out, the gateway's SSE handler) against the design it
// replaces (one HMAC-signed JSON HTTP POST per event, a single-row insert
// and a publish, the runner waiting for each answer), both with PostgreSQL's
// synchronous_commit on and an optional delay proxy that adds round-trip
// time between runners and the control plane. cmd/bench-events drives it.
//
// It also measures the gateway's SSE fan-out against Mercure, embedded as
// a library (ssebench.go; cmd/bench-sse drives it). Mercure is why this is
// a module of its own: it must never enter the product modules' graphs.
//
// It must not be used by tests or production code, and it creates and drops
// its own database and Redis key prefix: it never touches existing data.
package bench
