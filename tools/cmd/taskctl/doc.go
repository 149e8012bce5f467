// Command taskctl is taskrunner's command-line client: it creates API tokens
// (directly in the database, for bootstrapping), lists and revokes them and
// manages tasks over gRPC (plaintext, or TLS with --ca/--tls), and creates a
// development PKI. Human output by default; --json prints what the REST API
// returns for the same call. Help never shows a flag's environment value.
package main
