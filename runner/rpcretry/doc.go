// Package rpcretry is the runner's one rule for calls to the control plane: which gRPC
// failures are worth another attempt, the jittered exponential backoff between attempts
// (github.com/cenkalti/backoff/v5, capped near a second so a runner is back within about a
// second of the service), the matching connection backoff for grpc-go's own reconnects, and Do,
// which retries a unary call until it succeeds, is definitely refused, or its context (the
// task's deadline) ends. The Events stream client and the repository token source both use it,
// so a control-plane restart is survived the same way everywhere. It must not log secrets: it
// never sees request or response bodies.
package rpcretry
