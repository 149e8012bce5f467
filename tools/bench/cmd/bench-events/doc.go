// Command bench-events measures the runner event path of the new design
// (mTLS gRPC stream, group commit, Redis, SSE) against the HMAC-signed
// JSON callbacks it replaces, in one process against real PostgreSQL and
// Redis, and prints both side by side. See tools/bench/README.md.
package main
