// Command taskctl is taskrunner's command-line client: it creates API tokens
// (directly in the database, for bootstrapping), manages tasks over gRPC and
// creates a development PKI. Human output by default, --json for scripts.
package main
