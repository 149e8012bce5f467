// Package rest builds the gateway's HTTP handler: the grpc-gateway REST API
// generated from the protos (only the routes of the HTTP rule file), the
// routes mounted next to it (SSE, console, webhook, metrics), health,
// readiness, request ids, body limits, CORS, and /openapi.json, which it
// assembles from the generated document and openapi_overlay.json and also
// uses to answer unknown routes (404) and methods (405). Every error answer
// goes through gateway/httperr. It must not implement business rules:
// every decision is made by the gRPC services it calls.
package rest
