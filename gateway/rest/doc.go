// Package rest builds the gateway's HTTP handler: the grpc-gateway REST API
// generated from the protos (only the routes of the HTTP rule file), plus
// health, readiness, the OpenAPI document, request ids and body limits.
// It must not implement business rules: every decision is made by the
// gRPC services it calls.
package rest
