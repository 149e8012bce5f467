// Package sse serves a task's timeline to browsers as Server-Sent Events:
// every event at GET /v1/tasks/{id}/events, and the seed frontend's
// contract at GET /projects/{repo}/branches/{branch}/tasks/{id}/events (and
// at the older /v1/projects/… paths, which serve the same).
//
// Each connection is owner-checked through TaskService.GetTask with the
// caller's bearer token, subscribes to the task's Redis channel through one
// shared subscription per gateway process (the hub), replays stored events
// after Last-Event-ID through EventsService.ListEvents, then streams live
// events, writing only strictly increasing sequence numbers and filling any
// gap from ListEvents: no gap, no duplicate. The seq decision (skip, deliver,
// fill from the log) is platform/follow's Next and AfterFill, the same as
// EventsService.Subscribe's; SSE keeps its own loop around them because it
// reads a shared ring per task (the hub) in batches rather than one Redis
// subscription per client, and writes pooled, pre-framed bytes.
//
// Authentication is the REST API's bearer token, from the Authorization
// header or, because a browser's EventSource cannot set headers, from the
// access_token query parameter (the header wins when both are present).
// Tokens in URLs can end up in proxy logs: clients that can set headers
// should. The replay starts after the Last-Event-ID header (what EventSource
// sends when it reconnects) or the last_event_id query parameter.
//
// A stream that has caught up parks: its connection is taken over from
// net/http and written by its task's writer goroutine without a goroutine
// of its own (writer.go, conn.go); it gets one back whenever it needs to
// wait (a slow client), to read the log (a gap, a resubscription) or to
// check its task. Streams over HTTP/2 keep their goroutine.
//
// It must not read PostgreSQL (the gateway has no database credentials),
// must not link the services (it speaks to them over gRPC and reads the
// wire format from platform/eventwire), must not open a Redis connection
// per client, and must never let one slow client delay another: a client
// that falls too far behind is cut off and resumes by reconnecting with
// Last-Event-ID.
//
// # What an EventSource sees
//
// (This section is meant for docs/architecture.md as well.)
//
// A task's timeline is one gap-free sequence of events, numbered 1, 2, 3 …;
// the number is each message's SSE id. It holds the runner's events
// (stage_change, log, diff_stats, usage, completed, failed, cancelled) and
// the control plane's (status_change for every status transition, whoever
// decided it; queue_position; sandbox). The last event of every timeline
// is the status_change into done, failed or cancelled, and the stream ends
// right after it, and only there: after the runner's completed the task
// awaits review and the stream stays open, with ": ping" comments every
// 15 s, until the pull request is merged (status_change to done) or closed
// (to cancelled).
//
//  1. Connect: "retry: 3000", then every event after Last-Event-ID (all of
//     them on a first connect), then live events as they happen.
//  2. The stream drops (network, gateway restart, a client too slow to keep
//     up): EventSource reconnects after the retry delay with Last-Event-ID
//     set to the last id it saw and gets exactly the events it missed.
//  3. The final event arrives: the server closes the stream cleanly.
//     EventSource treats any close as a drop and reconnects once, with
//     Last-Event-ID at the final event; the server answers 204 No Content,
//     on which EventSource stops for good (readyState CLOSED, one "error"
//     event). Close the EventSource yourself on the final event to skip
//     that round trip.
//  4. Connecting to a finished task replays its whole timeline (or what
//     follows Last-Event-ID) and closes; the reconnect gets 204 as above.
//     Timelines written before status_change existed have no final event:
//     for a finished task they are replayed and closed the same way.
//
// Any other error answer (401 bad token, 404 not the caller's task or no
// such task, 400 bad Last-Event-ID) also stops EventSource; 503 means the
// services are unavailable, and the client should retry later.
//
// The seed frontend's contract (the /projects/… paths) carries four event
// names, each message with the timeline seq as its id:
//
//	event: stage_change  data: {"stage":"propose","status":"running"}
//	event: log           data: {"tail":"npm install completed in 47s"}
//	event: completed     data: {"prUrl":"https://github.com/owner/repo/pull/123"}
//	event: failed        data: {"reason":"tests failed"}
//
// A stage_change message is sent for the runner's stage changes (status
// running) and for every status change (status queued, running,
// awaiting_review, done, failed or cancelled; stage is the stage the task
// was in, empty before it ran). A status change into failed or cancelled
// is followed by a failed message with the reason; that pair shares the
// final event's id, written on the second message only. Events the
// contract has no name for (diff_stats, usage, queue_position, sandbox) are
// not sent; when a stream ends on such events it ends with a message that
// holds only an id, which EventSource records without dispatching, so that
// its reconnect gets 204.
//
// Data is always one JSON value; the writer never relies on it being one
// line (a line break in data becomes several data: lines, which
// EventSource joins with "\n").
package sse
