// Package eventsclient is the runner's side of the EventsService.Connect
// protocol (events.proto; ARCHITECTURE.md section 4). Send numbers events
// 1, 2, 3 … and only appends them to a bounded buffer: it never waits for
// the network. A background loop connects over mTLS, says Hello, drops what
// Welcome reports as persisted, resends the rest in order, trims the buffer
// on every Ack, sends heartbeats, hands server-pushed Cancel to the caller
// and reconnects with exponential backoff and jitter on Unavailable,
// DeadlineExceeded and Aborted. Any other status is fatal and is reported by
// Err and Done.
//
// Buffer policy: when BufferSize events are unacknowledged, Send refuses new
// log, diff_stats and usage events with ErrBufferFull (they get no seq, so
// no gap appears; diff stats and usage are totals that the next report
// supersedes). Stage changes and terminal events are always accepted, even
// beyond BufferSize. Events are never dropped once numbered.
//
// The package must not import the control plane's service code: it is built
// into the sandbox image.
package eventsclient
