// Package httperr writes the gateway's one error answer, a google.rpc.Status
// as JSON, {code, message, details}, with the HTTP status that matches the
// gRPC code. REST, SSE, the webhook, body limits and routing all answer
// through it, so a client parses one shape everywhere. It also builds the
// statuses the gateway itself decides (invalid field, no route, body too
// large) and truncates echoed client values without splitting a character.
// It must not decide anything about tasks and must not log: callers do.
package httperr
