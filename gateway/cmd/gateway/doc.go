// Command gateway serves taskrunner's public REST API (grpc-gateway), health,
// readiness and the OpenAPI document, dialing the gRPC services. It is the
// only place that reads signals.
package main
