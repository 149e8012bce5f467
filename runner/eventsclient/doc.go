// Package eventsclient is the runner's side of the EventsService.Connect
// protocol (events.proto; ARCHITECTURE.md section 4). Send numbers events
// 1, 2, 3 … and only appends them to a buffer: it never waits for the
// network. A background loop connects over mTLS, says Hello, drops what
// Welcome reports as persisted, resends the rest in order, trims the buffer
// on every Ack, sends heartbeats and hands server-pushed Cancel to the caller.
//
// Outages: the runner must outlive any control-plane outage shorter than its
// task's deadline. Every error but a definite refusal is retried
// (rpcretry.Retryable: Unavailable, DeadlineExceeded, Aborted,
// ResourceExhausted, Internal, Unknown, broken connections …); only
// PermissionDenied, Unauthenticated, FailedPrecondition, InvalidArgument,
// NotFound, AlreadyExists, OutOfRange and Unimplemented are fatal, reported by
// Err and Done. Reconnects wait a jittered exponential delay from MinBackoff
// to at most MaxBackoff (about 1 s; rpcretry.NewBackOff), and grpc-go's own
// connection backoff is given the same bounds, while a stream start waits for
// the connection to be ready instead of failing at once: a runner is back
// within about a second of the service. Heartbeats keep one ticker across
// reconnects, so their cadence does not restart with every stream; a beat that
// fell in an outage goes out right after the next Welcome.
//
// Event size: the server refuses an event whose JSON form exceeds its limit
// (64 KiB by default) with InvalidArgument, which would end the stream for
// good. Send therefore never buffers one: a log event over the limit is split
// into several (SplitLines: at most LogBatchBytes of lines each, an overlong
// line cut with "… [truncated N bytes]"), any other event has its long strings
// cut, and invalid UTF-8 is replaced.
//
// Buffer policy: at most BufferSize events (and, with a spill file, at most
// BufferBytes) are kept in memory. With SpillDir set, events beyond that go to
// a file there, in order, and come back to memory as acks make room: nothing
// is refused or lost and the agent never waits. Without SpillDir, Send
// refuses new log, diff_stats and usage events with ErrBufferFull while the
// buffer is full (they get no seq, so no gap appears; diff stats and usage
// are totals that the next report supersedes); stage changes and terminal
// events are always accepted. Events are never dropped once numbered.
//
// Runs: Hello carries the run the runner works on (Config.Run); seqs count
// within the run, from 1. Sessions: SaveSession (at the end of a run) and
// LoadSession (at the start of a follow-up) are unary calls on the same
// connection and certificate, retried like everything else until the
// caller's context ends; archives are at most MaxSessionBytes and must be
// redacted before they are handed over.
//
// The package must not import the control plane's service code: it is built
// into the sandbox image.
package eventsclient
