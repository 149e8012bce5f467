// Package events implements EventsService: the runner's mutually
// authenticated Connect stream (Hello/Welcome, persist-then-ack with group
// commit shared by all streams: one transaction per batch, of one round trip
// when the committers wrote the batch's tasks last and nobody changed them
// since, task transitions applied through the task package's state machine
// in that transaction; a second transaction at once only when one committer
// cannot keep up, see intake), the fan-out of committed events through Redis
// pub/sub, server-pushed Cancel across replicas, and Subscribe/ListEvents for
// internal tools. It also exports the small pieces the gateway's SSE endpoint
// reuses (channel names, event decoding, ListAfter).
//
// It must not publish anything that is not committed, must not change a task
// except through the task package's state machine, and keeps no state that
// another replica would need: everything durable is in PostgreSQL.
package events
