// Package devstack brings up what a developer machine needs to run taskrunner
// locally: it finds PostgreSQL and Redis, or starts throwaway instances under
// .dev/ (installing the server packages with apt when allowed), and supervises
// the stack's processes. It is for development and tests only, never for
// production deployments.
package devstack
