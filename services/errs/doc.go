// Package errs defines the domain errors every service returns and maps them to
// gRPC status codes in exactly one place (ToStatus). It must not carry internal
// details to clients: SQL, stacks and secrets are logged, never returned.
package errs
