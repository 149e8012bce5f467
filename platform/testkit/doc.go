// Package testkit holds test helpers that tests in every module share: an
// in-memory gRPC server and client over bufconn, and a Server-Sent Events
// reader. It lives in the leaf module so that runner, gateway, services and
// tools tests can all import it without a cycle; only tests import it.
package testkit
