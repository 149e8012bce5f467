// Package pki issues and loads the X.509 material behind taskrunner's mTLS: the runner CA,
// per-task client certificates (SPIFFE-style URI SAN spiffe://<trust-domain>/task/<task-id>),
// server certificates, hot-reloaded TLS configs for gRPC servers and runners, and the
// identity check that turns a verified peer certificate into a task id.
//
// It uses only the standard library's crypto (ECDSA P-256). It must never log, return in an
// error, or otherwise expose private key material, and it must never treat a certificate that
// was merely presented (rather than verified against the runner CA) as an identity.
package pki
