// Package eventwire is the one definition of how a task's timeline travels
// between processes: the event type names, the JSON form stored in
// task_events.payload and sent as SSE data, the Redis channel of a task and
// the header line of each message on it, and the rule for which event ends
// a timeline. The Events service, package task (which appends the control
// plane's events), the gateway's SSE hub and the benchmarks all use it; it
// must stay free of I/O.
package eventwire
