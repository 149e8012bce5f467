// Package rpcserver assembles a gRPC server the same way for every service:
// one interceptor chain (recovery → request id → logging → authentication →
// error mapping), gRPC health that starts NOT_SERVING until dependencies
// answer, reflection when asked for, and Subset/Without to serve only some
// RPCs of a service on a port. It holds no service logic.
package rpcserver
